"""The Python API (docs/python_api.md): tlab's commands as functions run in this process as the
CLI runs a single run, returning a ``Result``; a component may be a choice name, a class or an
instance, offered as a choice of its group while the command runs (``OfferedComponents``)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_lab.errors import ConfigError

SIZE_ARGUMENTS = {  # constructor arguments the model fills in
    "d_model": "${model.d_model}", "d_ff": "${model.d_ff}", "n_heads": "${model.n_heads}",
    "head_dim": "${tlab.head_dim:${model.d_model},${model.n_heads},"
                "${oc.select:model.head_dim,null}}",  # as configs/pe/rope.yaml
    "max_len": "${model.max_len}",
}
MAIN_TABLES = {"validate": "validation", "smoke": "smoke", "reverse_task": "reverse",
               "compare_activations": "comparison", "check": "checks", "train": "summary",
               "compare": "comparison"}
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
        """The command's main CSV (``MAIN_TABLES``) as a pandas DataFrame."""
        return self.read(self.table_name)

    @property
    def summary(self) -> Any:
        """``summary.csv``: one row, the run's settings, numbers, status and error."""
        return self.read("summary")

    def read(self, name: str) -> Any:
        """Any CSV of the run directory by name (``"metrics"``); empty if the run wrote none."""
        import pandas as pd

        if name not in self._tables:
            path = self.run_dir / f"{name}.csv"
            self._tables[name] = pd.read_csv(path) if path.is_file() else pd.DataFrame()
        return self._tables[name]

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else f"failed (exit code {self.exit_code})"
        return f"Result({self.command}: {verdict}, run_dir='{self.run_dir}')"


def _class_arguments(cls: type, group: str) -> dict[str, Any]:
    """The constructor arguments of ``cls`` in its config node: the sizes the model fills in,
    plain defaults as they are, ``???`` (must be given) for any other argument without a
    default. A norm layer's first argument is left out: the block passes ``d_model``."""
    parameters = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name not in ("self", "name")
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if group == "norm_layer":
        parameters = parameters[1:]
    arguments: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.name in SIZE_ARGUMENTS and group != "norm_layer":
            arguments[parameter.name] = SIZE_ARGUMENTS[parameter.name]
        elif parameter.default is parameter.empty:
            arguments[parameter.name] = "???"
        elif parameter.default is None or isinstance(parameter.default, bool | int | float) \
                or (isinstance(parameter.default, str) and "${" not in parameter.default
                    and parameter.default != "???"):  # a plain default, as it is
            arguments[parameter.name] = parameter.default
    return arguments


class OfferedComponents:
    """The classes and instances one command was given, each a choice of its group offered in
    this process: its config node (``nodes``) names its class by ``module.qualname``, and
    ``given`` holds the class or instance that builds it (``config.instantiate``)."""

    def __init__(self, user_dirs: Sequence[Path] = ()) -> None:
        self.user_dirs = list(user_dirs)
        self.nodes: dict[str, dict[str, dict[str, Any]]] = {}  # group -> choice -> node
        self.given: dict[tuple[str, str], object] = {}  # (_target_, choice) -> class or instance
        self._choices: dict[tuple[str, int], str] = {}  # (group, id(component)) -> choice

    def choice(self, group: str, component: Component) -> str | None:
        """The choice for ``group=``: a name as it is; a class or an instance offered under its
        class name (``Name_2`` where that is taken)."""
        if component is None or isinstance(component, str):
            return component
        if (group, id(component)) in self._choices:
            return self._choices[group, id(component)]
        from transformer_lab.config.tree import group_choices

        cls = component if isinstance(component, type) else type(component)
        target = f"{cls.__module__}.{cls.__qualname__}"
        taken = {*group_choices(group, self.user_dirs), *self.nodes.get(group, {}),
                 *(choice for t, choice in self.given if t == target)}
        name, n = cls.__name__, 1
        while name in taken:  # Name_2, Name_3, ...
            n += 1
            name = f"{cls.__name__}_{n}"
        self.given[target, name] = component
        node = {"name": name, "_target_": target}
        if group == "norm_layer":
            node["_partial_"] = True  # called with d_model
        if cls is component:
            node.update(_class_arguments(cls, group))
        self.nodes.setdefault(group, {})[name] = node
        self._choices[group, id(component)] = name
        return name

    @contextmanager
    def offered(self) -> Iterator[None]:
        """Within the block, the components are choices of their groups, built as given."""
        from transformer_lab.config.instantiate import components_given
        from transformer_lab.config.tree import offered_in_process

        with components_given(self.given), offered_in_process(self.nodes):
            yield


@contextmanager
def _root_logging_kept() -> Iterator[None]:
    """After the block the root logger has its handlers back: Hydra's job logging (``run.log``,
    the console) does not outlive the run."""
    handlers = list(logging.root.handlers)
    try:
        yield
    finally:
        for handler in set(logging.root.handlers) - set(handlers):
            handler.close()
        logging.root.handlers[:] = handlers


def _launch(experiment: str, groups: dict[str, Component],
            options: dict[str, Any | Callable[[dict[str, Any]], Any]],
            overrides: Sequence[str], out: str | Path | None, config_dir: str | Path | None,
            activations: Sequence[Component] | None = None) -> Result:
    """Run ``experiment`` as the CLI runs a single run, with the components offered; return
    its Result. ``options``: overrides by key (None: left out; a callable gets the choices)."""
    from transformer_lab.app.arguments import check_arguments, compose_first_job
    from transformer_lab.app.hydra_app import (
        one_line_errors,
        run_single,
        working_directory_importable,
    )
    from transformer_lab.app.sweeps import quote_value
    from transformer_lab.config.tree import config_store_kept

    overrides = [str(o) for o in overrides]
    components = OfferedComponents([Path(config_dir)] if config_dir is not None else [])
    chosen: dict[str, Any] = {group: components.choice(group, c) for group, c in groups.items()}
    if activations is not None:
        names = [components.choice("ffn", a) for a in activations]
        chosen["routine.activations"] = "[" + ",".join(names) + "]"
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    for group, nodes in components.nodes.items():  # an argument tlab cannot fill in, not given
        for name, node in nodes.items():
            for key, value in node.items():
                if value == "???" and f"{group}.{key}" not in given:
                    raise ConfigError(f"{group}={name}: {name} takes '{key}' (no default), "
                                      "which tlab cannot fill in from the model; give it: "
                                      f"overrides=['{group}.{key}=...']")
    chosen.update({key: value(chosen) if callable(value) else value
                   for key, value in options.items()})
    args = [f"experiment={experiment}",
            *(f"{key}={value}" for key, value in chosen.items() if value is not None),
            *overrides]
    if out is not None:
        args.append(f"hydra.run.dir={quote_value(str(out))}")
    if config_dir is not None:
        args += ["--config-dir", str(config_dir)]
    with components.offered(), working_directory_importable(), _root_logging_kept(), \
            config_store_kept():
        with one_line_errors():
            arguments = check_arguments(args)
            if not arguments.single_run:
                raise ConfigError("the Python API runs single runs; use the CLI for -m sweeps, "
                                  "--cfg and --info")
            cfg = compose_first_job(arguments)
        code = run_single(cfg)
    return Result(experiment, code, Path(str(cfg.hydra.run.dir)), MAIN_TABLES[experiment])


def _training(settings: dict[str, Any], leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Training settings by name (``lr=1e-3``: a ``TrainSettings`` field, as the CLI's
    ``--lr``) as their overrides; ``ConfigError`` naming an unknown one and the nearest."""
    from transformer_lab.app.arguments import nearest
    from transformer_lab.config.schema import value_name
    from transformer_lab.config.spec import user_train_fields

    names = [f.name for f in user_train_fields() if f.name not in leave_out]
    for name in settings:
        if name not in names:
            guess = nearest(name, names)
            raise ConfigError(f"'{name}' is not a training setting"
                              f"{f'; did you mean {guess}?' if guess else ''}; valid: "
                              f"{', '.join(names)}")
    return {f"train.{name}": value_name(value) for name, value in settings.items()}



def train(pe: Component = None, *, ffn: Component = None, norm_layer: Component = None,
          block: str | None = None, arch: str | None = None, preset: str | None = None,
          task: str | None = None, seeds: int | None = None, from_run: str | Path | None = None,
          from_hf: str | Path | None = None, overrides: Sequence[str] = (),
          out: str | Path | None = None, config_dir: str | Path | None = None,
          **settings: Any) -> Result:
    """Train one configuration on its task (``tlab train``); ``settings``: the training settings
    by name, as the CLI's options (``steps=300, lr=1e-3, batch_size=32, device="cuda"``: any
    ``TrainSettings`` field); ``from_run`` / ``from_hf``: fine-tune from those weights;
    ``.table``: summary.csv (``.read("metrics")``: the training and held-out rows)."""
    return _launch("train", {"pe": pe, "ffn": ffn, "norm_layer": norm_layer},
                   {"block": block, "arch": arch, "preset": preset, "task": task,
                    "routine.seeds": seeds, "from_run": from_run, "from_hf": from_hf,
                    **_training(settings)}, overrides, out, config_dir)


def compare(vary: str, values: Sequence[Any], *, baseline: Any = None, steps: int | None = None,
            seeds: int | str | None = None, pe: Component = None, ffn: Component = None,
            norm_layer: Component = None, block: str | None = None, arch: str | None = None,
            overrides: Sequence[str] = (), out: str | Path | None = None,
            config_dir: str | Path | None = None, **settings: Any) -> Result:
    """Train the same run once per value of ``vary`` (``tlab compare --vary KEY=V1,V2``: a
    config group such as ``"pe"`` or a key such as ``"train.lr"``), tested against
    ``baseline`` (default the first value), paired by seed; ``settings``: training settings by
    name, as ``train``'s; ``.table``: comparison.csv."""
    from transformer_lab.config.schema import value_name

    return _launch("compare", {"pe": pe, "ffn": ffn, "norm_layer": norm_layer},
                   {"block": block, "arch": arch, "routine.vary.key": vary,
                    "routine.vary.values": value_name(list(values)),
                    "routine.baseline": None if baseline is None else value_name(baseline),
                    "routine.steps": steps, "routine.seeds": seeds,
                    **_training(settings, leave_out=("steps", "checkpoint", "checkpoint_every"))},
                   overrides, out, config_dir)


def sample(run_dir: str | Path, prompt: str | None = None, *, tokens: int = 100,
           greedy: bool = False, temperature: float | None = None, top_k: int | None = None,
           top_p: float | None = None, num_samples: int = 1, seed: int | None = None,
           variant: str | None = None, model_seed: int | None = None,
           trust_code: bool = False) -> list[str]:
    """Continuations of ``prompt`` by the model a run kept (``tlab sample RUN_DIR``): one
    string per sample, the prompt left out; the same ``seed``, the same continuations (None:
    a fresh one)."""
    from transformer_lab.app.hydra_app import trusted
    from transformer_lab.routines.sample import Sampling
    from transformer_lab.routines.sample import sample as sample_run

    sampling = Sampling.from_options(tokens, greedy, temperature, top_k, seed, top_p,
                                     num_samples)
    with trusted(trust_code):
        return sample_run(Path(run_dir), prompt, sampling, variant, model_seed).texts


def export(run_dir: str | Path, to_hf: str | Path, *, variant: str | None = None,
           model_seed: int | None = None, trust_code: bool = False) -> Path:
    """Write the model a run kept as a Hugging Face causal LM with its tokenizer into the new
    folder ``to_hf`` (``tlab export RUN_DIR --to-hf DIR``); the folder."""
    from transformer_lab.app.hydra_app import trusted
    from transformer_lab.routines.export import export_run

    with trusted(trust_code):
        return export_run(Path(run_dir), Path(to_hf), variant, model_seed).out_dir


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
                        steps: int | None = None, seeds: int | str | None = None,
                        overrides: Sequence[str] = (), out: str | Path | None = None,
                        config_dir: str | Path | None = None) -> Result:
    """Step 4 (``tlab compare-activations``): the same model with each FFN of
    ``activations`` (names or your own FFN classes/instances); ``seeds``: N or ``"auto[:MAX]"``;
    ``.table``: comparison.csv."""
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
