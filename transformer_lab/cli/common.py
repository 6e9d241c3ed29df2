"""Options shared by the commands, and the one way every command runs: the Hydra app."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from inspect import Parameter, Signature, signature
from pathlib import Path
from typing import Annotated, NoReturn

import typer

Overrides = Annotated[
    list[str] | None,
    typer.Argument(help="Hydra overrides, e.g. model.d_model=16 train.lr=3e-3 (sweeps with -m).",
                   show_default=False),
]
Multirun = Annotated[bool, typer.Option("--multirun", "-m", help="Run a Hydra sweep over the "
                                        "comma-separated values in the overrides.")]
Out = Annotated[Path | None, typer.Option("--out", help="Run directory (sweep directory with "
                                          "-m); it must not already hold a run.")]
Resume = Annotated[Path | None, typer.Option(
    "--resume", help="A sweep directory: run it again, jobs that passed are skipped, missing or "
    "failed ones run again (a failed attempt is renamed <job>.failed-<n>, never deleted). A run "
    "directory (tlab train): go on from its last checkpoint, in it; with train.steps=N, train "
    "a finished run on to N steps.",
    show_default=False)]
Pe = Annotated[str | None, typer.Option("--pe", help="Positional encoding (tlab list).")]
Norm = Annotated[str | None, typer.Option("--norm", help="Norm placement: post, pre, sandwich, "
                                          "deepnorm.")]
Activation = Annotated[str | None, typer.Option("--activation", help="FFN activation (tlab list).")]
Arch = Annotated[str | None, typer.Option("--arch", help="encoder or decoder.")]
Seeds = Annotated[int | None, typer.Option(
    "--seeds", min=1, help="Seeds seed..seed+N-1 (routine.seeds; the experiment's default), "
    "trained one after another: each seed gets the numbers of a run of its own.",
    show_default=False)]
SeedsOrAuto = Annotated[str | None, typer.Option(
    "--seeds", help="N: seeds seed..seed+N-1 (the experiment's default), each variant on the "
    "same ones; auto: seeds two at a time until an anytime-valid test gives every variant a "
    "verdict against the baseline (at most 32; anytime:MAX for another cap); auto:MAX: a "
    "group-sequential design planned to MAX seeds, a look after every seed.",
    show_default=False)]
ConfigDir = Annotated[Path | None, typer.Option(
    "--config-dir", help="A config tree of your own (e.g. pe/my_pe.yaml with a _target_) added "
    "to tlab's (tlab's own file wins where a name is in both); choose from it as usual "
    "(pe=my_pe).", show_default=False)]
FromHf = Annotated[Path | None, typer.Option(
    "--from-hf", help="A local Hugging Face model directory (save_pretrained): its architecture "
    "(a preset and knobs) and weights; never downloads.", show_default=False)]

FromRun = Annotated[Path | None, typer.Option(
    "--from-run", help="A tlab run's trained model (a run directory with one model, or one of "
    "its weights files, e.g. RUN/models/rope/seed0.safetensors): its architecture and weights.",
    show_default=False)]
TrustCode = Annotated[bool, typer.Option(
    "--trust-code", help="Load a run trained with your own components (_target_ outside tlab's) "
    "and import the modules it recorded; only for runs whose code you trust (docs/security.md).")]
RunPath = Annotated[Path, typer.Argument(
    help="A run directory (tlab train, tlab compare) or one of its weights files.",
    show_default=False)]
Variant = Annotated[str | None, typer.Option(
    "--variant", help="A compared run's model of this variant (default: the first).",
    show_default=False)]
ModelSeed = Annotated[int | None, typer.Option(
    "--model-seed", help="The run's model trained with this seed (default: the first).",
    show_default=False)]


def other_models(models: list) -> str:
    """``"; 3 other models in the run: --variant, --model-seed"``, or ``""`` for one model."""
    others = len(models) - 1
    return (f"; {others} other model{'s' if others > 1 else ''} in the run: --variant, "
            "--model-seed") if others else ""


def pass_hydra_flags(app: typer.Typer) -> None:
    """Let every command that takes overrides take Hydra's flags (``--cfg job``, ...) too: Click
    hands an unknown option to the overrides. Call after all commands are registered."""
    for info in app.registered_commands:
        if info.callback is not None and "overrides" in signature(info.callback).parameters:
            info.context_settings = {"ignore_unknown_options": True,
                                     **(info.context_settings or {})}


_APP: list[typer.Typer] = []  # the tlab app, once its commands are registered (use_app)


def use_app(app: typer.Typer) -> None:
    """Tell ``refuse_unknown_options`` which app's commands to read (``cli/__init__.py``)."""
    _APP[:] = [app]


def refuse(message: str) -> NoReturn:
    """Bad usage: ``message`` in one line on stderr, exit code 2."""
    from transformer_lab.errors import EXIT_USAGE
    from transformer_lab.results.console import print_error

    print_error(message)
    raise typer.Exit(EXIT_USAGE)


@contextmanager
def usage_errors() -> Iterator[None]:
    """A ``ConfigError`` in the block is ``refuse``d."""
    from transformer_lab.errors import ConfigError

    try:
        yield
    except ConfigError as exc:
        refuse(str(exc))


def refuse_unknown_options(experiment: str, overrides: list[str]) -> None:
    """Exit 2 naming the nearest option when an argument passed on as an override looks like an
    option but is neither Hydra's nor one of ``experiment``'s command."""
    from transformer_lab.app.arguments import HYDRA_FLAGS, nearest, split_arguments
    from transformer_lab.app.hydra_app import APP_FLAGS

    flags, _ = split_arguments(overrides)
    unknown = [f.split("=", 1)[0] for f in flags if f.startswith("-")]
    unknown = [f for f in unknown if f not in HYDRA_FLAGS and f not in APP_FLAGS]
    if not unknown:
        return
    name = experiment.replace("_", "-")
    command = typer.main.get_command(_APP[0]).commands[name]  # type: ignore[attr-defined]
    known: dict[str, str | None] = dict.fromkeys(APP_FLAGS)
    for param in command.params:
        panel = getattr(param, "rich_help_panel", None)
        known.update({option: f"train.{param.name}" if panel == TRAINING_PANEL else None
                      for option in param.opts + param.secondary_opts})
    unknown = [f for f in unknown if f not in known]
    if not unknown:
        return
    guess = nearest(unknown[0], list(known))
    key = known.get(guess or "")
    hint = (f"did you mean {guess}{f' (the override {key}=...)' if key else ''}?" if guess
            else f"its options are listed by tlab {name} --help")
    refuse(f"unknown option '{unknown[0]}' for tlab {name}; {hint}")


@contextmanager
def trusted(trust_code: bool) -> Iterator[None]:
    """With ``--trust-code``: a run's config may name its recorded user components, and the
    working directory is importable."""
    from transformer_lab.app.hydra_app import working_directory_importable
    from transformer_lab.config.registry import trusting_code

    with trusting_code(trust_code), working_directory_importable() if trust_code \
            else nullcontext():
        yield


def hydra_list(text: str | None) -> str | None:
    """``"1x, 2x,4x"`` -> ``"[1x,2x,4x]"`` (a Hydra list override value); None stays None."""
    if text is None:
        return None
    return "[" + ",".join(item.strip() for item in text.split(",") if item.strip()) + "]"


def overrides_from(options: dict[str, object]) -> list[str]:
    """``{"pe": "rope", "block": None}`` -> ``["pe=rope"]`` (None values are left out)."""
    return [f"{key}={value}" for key, value in options.items() if value is not None]


def launch(experiment: str, options: dict[str, object], overrides: list[str] | None,
           multirun: bool = False, out: Path | None = None,
           resume: Path | None = None, config_dir: Path | None = None,
           trust_code: bool = False, nproc: int = 1) -> NoReturn:
    """Run ``experiment`` through the Hydra app and exit with its code; ``nproc`` > 1: on that
    many processes (``training.distributed.launch``)."""
    refuse_unknown_options(experiment, overrides or [])
    args = [f"experiment={experiment}", *overrides_from(options), *(overrides or [])]
    if resume is not None:
        args += ["--resume", str(resume)]
    if out is not None:
        args.append(f"hydra.{'sweep' if multirun else 'run'}.dir={out}")
    if multirun:
        args.append("--multirun")
    if config_dir is not None:
        args += ["--config-dir", str(config_dir)]
    if nproc > 1:
        from transformer_lab.training.distributed import launch as launch_processes

        raise typer.Exit(launch_processes(nproc, args))
    from transformer_lab.app.hydra_app import main
    from transformer_lab.config.registry import trusting_code

    with trusting_code(trust_code):
        code = main(args)
    raise typer.Exit(code)


# --- The training settings as options: one per field of training.trainer.TrainSettings ------

TRAINING_PANEL = "Training settings (train.*)"
_NOT_OPTIONS = ("d_model", "optimizer")  # the model's width; the optimizer group (--optimizer)


def train_settings_fields() -> list[tuple[str, str]]:
    """``(name, annotation)`` of each ``TrainSettings`` field a user sets (imports no torch)."""
    from dataclasses import fields

    from transformer_lab.training.settings import TrainSettings

    return [(f.name, str(f.type)) for f in fields(TrainSettings) if f.name not in _NOT_OPTIONS]


def train_yaml_defaults(experiment: str) -> tuple[dict[str, object], dict[str, str]]:
    """The ``train.*`` values ``experiment`` runs with, and each key's comment in
    ``configs/train/default.yaml``."""
    import yaml

    from transformer_lab.config.tree import CONFIG_DIR

    defaults, comments = _train_default_yaml()
    values = dict(defaults)
    experiment_file = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
    if experiment_file.is_file():
        values.update((yaml.safe_load(experiment_file.read_text(encoding="utf-8")) or {})
                      .get("train") or {})
    return values, comments


@functools.cache
def _train_default_yaml() -> tuple[dict[str, object], dict[str, str]]:
    """``configs/train/default.yaml``'s values and each key's comment, read once."""
    import re

    import yaml

    from transformer_lab.config.tree import CONFIG_DIR

    text = (CONFIG_DIR / "train" / "default.yaml").read_text(encoding="utf-8")
    comments: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if match := re.match(r"^(\w+):[^#]*(?:#\s*(.*))?$", line):
            key = match.group(1)
            comments[key] = (match.group(2) or "").strip()
        elif key and (match := re.match(r"^\s+#\s*(.*)$", line)):  # a comment's next line
            comments[key] = f"{comments[key]} {match.group(1).strip()}".strip()
    return dict(yaml.safe_load(text)), comments


def _number_or_null(kind: type) -> object:
    """A parser for an optional number option: ``null`` (the setting off) or a ``kind``."""
    def parse(text: str) -> str:
        if text.lower() in ("null", "none"):
            return "null"
        try:
            kind(text)
        except ValueError:
            raise typer.BadParameter(f"'{text}' is not a {kind.__name__} or null") from None
        return text
    return parse


def training_options(experiment: str, leave_out: tuple[str, ...] = ()) -> list[Parameter]:
    """One keyword option per ``TrainSettings`` field (``--batch-size`` sets
    ``train.batch_size``), its YAML comment and ``experiment``'s default as help."""
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    defaults, comments = train_yaml_defaults(experiment)
    parameters = []
    for name, annotation in train_settings_fields():
        if name in leave_out:
            continue
        base, _, optional = annotation.partition(" | ")
        kind = kinds.get(base, str)
        value = defaults.get(name)
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) \
            else str(value)
        help_text = f"{comments.get(name) or name.replace('_', ' ')} (train.{name}, default " \
                    f"{shown})."
        flag = f"--{name.replace('_', '-')}"
        if kind is bool:  # --compile / --no-compile
            flag = f"{flag}/--no-{name.replace('_', '-')}"
        nullable = {"metavar": f"{kind.__name__.upper()}|null",
                    "parser": _number_or_null(kind)} if optional else {}
        option = typer.Option(flag, help=help_text, show_default=False,
                              rich_help_panel=TRAINING_PANEL, **nullable)
        kind = str if optional else kind
        parameters.append(Parameter(name, Parameter.KEYWORD_ONLY, default=None,
                                    annotation=Annotated[kind | None, option]))
    return parameters


def with_training_options(experiment: str, leave_out: tuple[str, ...] = ()):
    """Decorate a command that takes ``**settings``: its signature (what Typer reads) gains
    ``training_options(experiment, leave_out)`` in place of ``**settings``."""
    def add(command):
        params = [p for p in signature(command, eval_str=True).parameters.values()
                  if p.kind is not Parameter.VAR_KEYWORD]
        positional = [p.replace(kind=Parameter.KEYWORD_ONLY) for p in params]
        command.__signature__ = Signature(positional + training_options(experiment, leave_out))
        return command
    return add


def train_overrides(settings: dict[str, object]) -> dict[str, object]:
    """``{"lr": 0.001, "steps": None}`` -> ``{"train.lr": 0.001}`` (options not given left out)."""
    return {f"train.{name}": str(value).lower() if isinstance(value, bool) else value
            for name, value in settings.items() if value is not None}
