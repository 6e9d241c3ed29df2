"""The Python API: tlab's commands as functions, for notebooks and test suites.

    import transformer_lab as tl

    result = tl.validate(pe=MyPE, arch="decoder", overrides=["model.d_model=64"])
    result.passed      # bool: the command's exit code was 0
    result.table       # pandas.DataFrame of the command's main CSV (validation.csv here)
    result.run_dir     # Path of the run directory (config.yaml, summary.csv, plots, ...)

``validate``, ``smoke``, ``reverse_task``, ``compare_activations`` and ``check`` run the command
of the same name through the same Hydra application as the CLI (``app.hydra_app.main`` with
the same overrides), so the files they write are the CLI's. Bad input raises
``transformer_lab.errors.ConfigError`` with the CLI's one-line message (nothing is written).

A component (``pe=``, ``ffn=``, ``norm_layer=``) may be the name of a choice (``"rope"``), a
class, or an instance, defined anywhere, a notebook or ``__main__`` included: it is registered
in this process under ``transformer_lab.api.components`` and given a config file of its own
(in a temporary ``--config-dir``), so it needs no importable module path. A class gets its
size arguments from the model (``d_model``, ``d_ff``, ``n_heads``, ``head_dim``, ``max_len``;
any other argument without a default must be given: ``overrides=["pe.alpha=0.5"]``); a norm
layer class is called with ``d_model``. An instance is deep-copied for every model built (its
sizes must match the run's model). Runs are single runs (no ``-m`` sweeps) in this process.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import logging
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformer_lab.errors import EXIT_USAGE, ConfigError

# Where registered components live: ``_target_: transformer_lab.api.components.<name>``.
components = SimpleNamespace()
_REGISTERED: dict[int, tuple[object, str]] = {}  # id(component) -> (component, its name)
SIZE_ARGUMENTS = {  # constructor arguments the model fills in
    "d_model": "${model.d_model}", "d_ff": "${model.d_ff}", "n_heads": "${model.n_heads}",
    "head_dim": "${tlab.head_dim:${model.d_model},${model.n_heads},"
                "${oc.select:model.head_dim,null}}",  # as configs/pe/rope.yaml
    "max_len": "${model.max_len}",
}
MAIN_TABLES = {"validate": "validation", "smoke": "smoke", "reverse_task": "reverse",
               "compare_activations": "comparison", "check": "checks"}
Component = str | type | object | None


@dataclass
class Result:
    """What a command left: its exit code, run directory and tables."""

    command: str
    exit_code: int
    run_dir: Path
    table_name: str
    _tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def table(self) -> Any:
        """The command's main CSV as a pandas DataFrame (``validation.csv``, ``smoke.csv``,
        ``reverse.csv``, ``comparison.csv``, ``checks.csv``)."""
        return self.read(self.table_name)

    @property
    def summary(self) -> Any:
        """``summary.csv``: one row, the run's settings, numbers, status and error."""
        return self.read("summary")

    def read(self, name: str) -> Any:
        """Any CSV of the run directory by name (``"metrics"``, ``"compare_runs"``, ...); an
        empty DataFrame when the run did not write it."""
        import pandas as pd

        if name not in self._tables:
            path = self.run_dir / f"{name}.csv"
            self._tables[name] = pd.read_csv(path) if path.is_file() else pd.DataFrame()
        return self._tables[name]

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else f"failed (exit code {self.exit_code})"
        return f"Result({self.command}: {verdict}, run_dir='{self.run_dir}')"


def _size_arguments(cls: type) -> dict[str, Any]:
    """Constructor arguments of ``cls`` that the model fills in; ``???`` (must be given) for
    other arguments without a default."""
    arguments: dict[str, Any] = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in SIZE_ARGUMENTS:
            arguments[name] = SIZE_ARGUMENTS[name]
        elif parameter.default is parameter.empty:
            arguments[name] = "???"
    return arguments


def _instance_class(instance: object) -> type:
    """A subclass of ``type(instance)`` whose construction returns a deep copy of
    ``instance`` (constructor arguments ignored); the class's declarations are inherited and
    ``count_parameters`` is the instance's own count."""
    cls = type(instance)
    count = sum(p.numel() for p in instance.parameters()) if hasattr(instance, "parameters") \
        else None

    def new(klass: type, *args: Any, **kwargs: Any) -> object:
        return copy.deepcopy(instance)  # not a ``klass``: __init__ is not called again

    namespace: dict[str, Any] = {"__new__": new, "__module__": __name__}
    if count is not None:
        namespace["count_parameters"] = classmethod(lambda klass, **kwargs: count)
    return type(cls.__name__, (cls,), namespace)


def _register(component: object) -> str:
    """Register a class or instance in ``components``; return its ``_target_``."""
    key = id(component)
    if key not in _REGISTERED:
        target = component if isinstance(component, type) else _instance_class(component)
        base = getattr(component, "__name__", type(component).__name__)
        name = f"{base}_{len(_REGISTERED)}"
        setattr(components, name, target)
        _REGISTERED[key] = (component, name)  # keeps the component alive: ids stay unique
    return f"{__name__}.components.{_REGISTERED[key][1]}"


def _component_yaml(component: object, group: str, name: str) -> dict[str, Any]:
    """The config node of a class or instance for config group ``group``."""
    node: dict[str, Any] = {"name": name, "_target_": _register(component)}
    if group == "norm_layer":
        node["_partial_"] = True  # called with d_model
    elif isinstance(component, type):
        node.update(_size_arguments(component))
    return node


def _choice(component: Component, group: str, config_dir: Path,
            overrides: Sequence[str]) -> str | None:
    """The choice name for ``group=``: a string as it is, a component written to
    ``config_dir/<group>/<name>.yaml`` first (its class name, unless tlab has that choice);
    ``ConfigError`` for a constructor argument neither the model nor ``overrides`` gives."""
    if component is None or isinstance(component, str):
        return component
    from omegaconf import OmegaConf

    from transformer_lab.config.tree import group_choices

    name = getattr(component, "__name__", type(component).__name__)
    if name in group_choices(group):
        name += "_user"
    node = _component_yaml(component, group, name)
    for key, value in node.items():
        if value == "???" and not any(o.split("=", 1)[0].lstrip("+") == f"{group}.{key}"
                                      for o in overrides):
            raise ConfigError(f"{group}={name}: {name} takes '{key}' (no default), which tlab "
                              f"cannot fill in from the model; give it: "
                              f"overrides=['{group}.{key}=...']")
    (config_dir / group).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(node), config_dir / group / f"{name}.yaml")
    return name


class _Tee(io.TextIOBase):
    """Writes to ``stream`` and keeps a copy (the CLI's error message for ``ConfigError``)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Tee]:
    tee = _Tee(sys.stderr)
    handlers = list(logging.root.handlers)
    try:
        with contextlib.redirect_stderr(tee):
            yield tee
    finally:  # Hydra's job logging handlers (run.log) do not outlive the run
        logging.root.handlers[:] = handlers


def _run_dir(experiment: str, overrides: Sequence[str], out: str | Path | None) -> Path:
    """``out``, else the CLI's default ``<out_root>/<experiment>/<timestamp>``."""
    if out is not None:
        return Path(out)
    root = next((o.split("=", 1)[1] for o in overrides if o.startswith("out_root=")), "outputs")
    return Path(root) / experiment / datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")


def _launch(experiment: str, groups: dict[str, Component], options: dict[str, Any],
            overrides: Sequence[str], out: str | Path | None, config_dir: str | Path | None,
            activations: Sequence[Component] | None = None) -> Result:
    """Run ``experiment`` as the CLI does, with components registered; return its Result.
    ``options``: overrides by key (None: left out; a callable gets the chosen groups)."""
    from transformer_lab.app.hydra_app import main
    from transformer_lab.app.sweeps import quote_value

    overrides = [str(o) for o in overrides]
    if any(o in ("-m", "--multirun") for o in overrides):
        raise ConfigError("the Python API runs single runs; use the CLI for -m sweeps")
    run_dir = _run_dir(experiment, overrides, out)
    with tempfile.TemporaryDirectory(prefix="tlab-components-") as temp:
        chosen = {group: _choice(c, group, Path(temp), overrides) for group, c in groups.items()}
        if activations is not None:
            names = [_choice(a, "ffn", Path(temp), overrides) for a in activations]
            chosen["routine.activations"] = "[" + ",".join(names) + "]"
        chosen.update({key: value(chosen) if callable(value) else value
                       for key, value in options.items()})
        args = [f"experiment={experiment}",
                *(f"{key}={value}" for key, value in chosen.items() if value is not None),
                *overrides, f"hydra.run.dir={quote_value(str(run_dir))}", "--config-dir", temp]
        if config_dir is not None:
            args += ["--config-dir", str(config_dir)]
        with _captured_stderr() as stderr:
            code = main(args)
    if code == EXIT_USAGE and not (run_dir / "run.json").is_file():
        text = stderr.copy.getvalue()
        message = " ".join(text[text.rfind("error:"):].removeprefix("error:").split())
        raise ConfigError(message or f"tlab {experiment}: invalid configuration")
    return Result(experiment, code, run_dir, MAIN_TABLES[experiment])


def validate(pe: Component = None, *, ffn: Component = None, norm_layer: Component = None,
             block: str | None = None, arch: str | None = None, overrides: Sequence[str] = (),
             out: str | Path | None = None, config_dir: str | Path | None = None) -> Result:
    """The four-step validation routine (``tlab validate``); ``.table``: validation.csv."""
    return _launch("validate", {"pe": pe, "ffn": ffn, "norm_layer": norm_layer},
                   {"block": block, "arch": arch}, overrides, out, config_dir)


def smoke(pe: Component = None, *, ffn: Component = None, norm_layer: Component = None,
          block: str | None = None, arch: str | None = None, steps: int | None = None,
          overrides: Sequence[str] = (), out: str | Path | None = None,
          config_dir: str | Path | None = None) -> Result:
    """Steps 1-2 (``tlab smoke``): forward/backward, then <= 10 steps where the loss must
    fall; ``.table``: smoke.csv."""
    return _launch("smoke", {"pe": pe, "ffn": ffn, "norm_layer": norm_layer},
                   {"block": block, "arch": arch, "routine.steps": steps}, overrides, out,
                   config_dir)


def reverse_task(pe: Component = None, *, ffn: Component = None, norm_layer: Component = None,
                 block: str | None = None, arch: str | None = None, seq_len: int | None = None,
                 max_steps: int | None = None, target: float | None = None,
                 seeds: int | None = None, overrides: Sequence[str] = (),
                 out: str | Path | None = None, config_dir: str | Path | None = None) -> Result:
    """Step 3 (``tlab reverse-task``): reversal to the target exact match beside a NoPE
    control; ``.table``: reverse.csv."""
    return _launch("reverse_task", {"pe": pe, "ffn": ffn, "norm_layer": norm_layer},
                   {"block": block, "arch": arch, "task.seq_len": seq_len,
                    "routine.max_steps": max_steps, "routine.target": target,
                    "routine.seeds": seeds}, overrides, out, config_dir)


def compare_activations(activations: Sequence[Component] | None = None, *,
                        pe: Component = None, norm_layer: Component = None,
                        block: str | None = None, arch: str | None = None,
                        steps: int | None = None, seeds: int | None = None,
                        overrides: Sequence[str] = (), out: str | Path | None = None,
                        config_dir: str | Path | None = None) -> Result:
    """Step 4 (``tlab compare-activations``): the same model with each FFN of
    ``activations`` (names or your own FFN classes/instances); ``.table``: comparison.csv."""
    return _launch("compare_activations", {"pe": pe, "norm_layer": norm_layer},
                   {"block": block, "arch": arch, "routine.steps": steps,
                    "routine.seeds": seeds}, overrides, out, config_dir, activations)


def check(pe: Component = None, *, trained: bool = False, steps: int | None = None,
          overrides: Sequence[str] = (), out: str | Path | None = None) -> Result:
    """Correctness checks of positional encodings (``tlab check``); ``pe=None``: every PE with
    checks; your own PE class lists its checks in ``property_checks``; ``.table``: checks.csv."""
    return _launch("check", {"pe": pe},
                   {"routine.pe": lambda chosen: chosen.get("pe"),
                    "routine.trained": True if trained else None,
                    "routine.train_steps": steps}, overrides, out, None)
