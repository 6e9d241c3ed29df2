"""Options shared by the commands, and the one way every command runs: the Hydra app."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from inspect import Parameter, Signature
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

ConfigDir = Annotated[Path | None, typer.Option(
    "--config-dir", help="A config tree of your own (e.g. pe/my_pe.yaml with a _target_) added "
    "to tlab's (tlab's own file wins where a name is in both); choose from it as usual "
    "(pe=my_pe).", show_default=False)]
TrustCode = Annotated[bool, typer.Option(
    "--trust-code", help="Load a run trained with your own components (_target_ outside tlab's) "
    "and import the modules it recorded; only for runs whose code you trust (docs/security.md).")]


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


def hydra_list(text: str | None) -> str | None:
    """``"1x, 2x,4x"`` -> ``"[1x,2x,4x]"`` (a Hydra list override value); None stays None."""
    if text is None:
        return None
    return "[" + ",".join(item.strip() for item in text.split(",") if item.strip()) + "]"


# --- The commands that run an experiment: options that become overrides (cli/commands.py) ---

@dataclass(frozen=True)
class Opt:
    """A command's parameter (name, ``Annotated`` Typer type, default) and the override it sets,
    ``key=convert(value)`` (a dict: several overrides); no key: an argument of ``launch``."""

    name: str
    kind: Any
    key: str | None = None
    default: Any = None
    convert: Callable[[Any], Any] | None = None


def option(name: str, key: str | None, help_text: str, kind: type = str, *decls: str,
           convert: Callable[[Any], Any] | None = None, **info: Any) -> Opt:
    """An ``Opt`` whose value is optional (None: the option not given, its override left out)."""
    return Opt(name, Annotated[kind | None, typer.Option(*decls, help=help_text,
                                                          show_default=False, **info)],
               key, convert=convert)


COMMANDS: dict[str, Callable[..., NoReturn]] = {}  # tlab's name of each command (command)


def command(experiment: str, options: list[Opt]) -> Callable[[Callable], Callable]:
    """Make the decorated function (its docstring: the help) the command that runs
    ``experiment`` with ``options`` (Typer reads its signature); it goes in ``COMMANDS``."""
    def run(ctx: typer.Context, **values: Any) -> NoReturn:
        refuse_unknown_options(ctx, values["overrides"] or [])
        chosen: dict[str, Any] = {}
        for opt in (o for o in options if o.key is not None and values[o.name] is not None):
            value = opt.convert(values[opt.name]) if opt.convert else values[opt.name]
            if value is not None:
                chosen.update(value if isinstance(value, dict) else {opt.key: value})
        # a checkpoint's architecture first: the other options and overrides change it
        chosen = dict(sorted(chosen.items(), key=lambda item: not item[0].startswith("from_")))
        launch(experiment, chosen, **{o.name: values[o.name] for o in options if o.key is None})

    run.__signature__ = Signature(  # type: ignore[attr-defined]
        [Parameter("ctx", Parameter.KEYWORD_ONLY, annotation=typer.Context),
         *(Parameter(o.name, Parameter.KEYWORD_ONLY, default=o.default, annotation=o.kind)
           for o in options)])

    def register(function: Callable) -> Callable:
        run.__doc__ = function.__doc__
        COMMANDS[experiment.replace("_", "-")] = run
        return run
    return register


def launch(experiment: str, options: dict[str, object], overrides: list[str] | None,
           multirun: bool = False, out: Path | None = None,
           resume: Path | None = None, config_dir: Path | None = None,
           trust_code: bool = False, nproc: int = 1) -> NoReturn:
    """Run ``experiment`` through the Hydra app and exit with its code; ``nproc`` > 1: on that
    many processes (``training.distributed.launch``)."""
    values = {key: str(value).lower() if isinstance(value, bool) else value
              for key, value in options.items()}
    args = [f"experiment={experiment}", *(f"{key}={value}" for key, value in values.items()),
            *(overrides or [])]
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


def refuse_unknown_options(context: typer.Context, overrides: list[str]) -> None:
    """Exit 2 naming the nearest option when an argument passed on as an override looks like an
    option but is neither Hydra's nor one of the command's."""
    from transformer_lab.app.arguments import HYDRA_FLAGS, nearest, split_arguments
    from transformer_lab.app.hydra_app import APP_FLAGS

    flags, _ = split_arguments(overrides)
    known: dict[str, str | None] = dict.fromkeys(APP_FLAGS)
    for param in context.command.params:
        training = getattr(param, "rich_help_panel", None) == TRAINING_PANEL
        known.update(dict.fromkeys(param.opts + param.secondary_opts,
                                   f"train.{param.name}" if training else None))
    unknown = [f.split("=", 1)[0] for f in flags if f.startswith("-")]
    unknown = [f for f in unknown if f not in HYDRA_FLAGS and f not in known]
    if not unknown:
        return
    guess = nearest(unknown[0], list(known))
    key = known.get(guess or "")
    hint = (f"did you mean {guess}{f' (the override {key}=...)' if key else ''}?" if guess
            else f"its options are listed by tlab {context.info_name} --help")
    refuse(f"unknown option '{unknown[0]}' for tlab {context.info_name}; {hint}")


# --- The training settings as options: one per field of config.spec.TrainSettings ------

TRAINING_PANEL = "Training settings (train.*)"


def train_settings_fields() -> list[tuple[str, str]]:
    """``(name, annotation)`` of each ``TrainSettings`` field a user sets (imports no torch)."""
    from transformer_lab.config.spec import user_train_fields

    return [(f.name, str(f.type)) for f in user_train_fields()]


def _number_or_null(kind: type) -> Callable[[str], str]:
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


def training_options(experiment: str, leave_out: tuple[str, ...] = ()) -> list[Opt]:
    """One option per ``TrainSettings`` field (``--batch-size`` sets ``train.batch_size``), its
    YAML comment and ``experiment``'s default (its experiment file's ``train:``) as help."""
    import re

    import yaml

    from transformer_lab.config.tree import CONFIG_DIR

    text = (CONFIG_DIR / "train" / "default.yaml").read_text(encoding="utf-8")
    comments: dict[str, str] = {}  # each key's comment, over the lines it takes
    key = None
    for line in text.splitlines():
        if match := re.match(r"^(\w+):[^#]*(?:#\s*(.*))?$", line):
            key = match.group(1)
            comments[key] = (match.group(2) or "").strip()
        elif key and (match := re.match(r"^\s+#\s*(.*)$", line)):  # a comment's next line
            comments[key] = f"{comments[key]} {match.group(1).strip()}".strip()
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    experiment_file = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
    experiment_yaml = yaml.safe_load(experiment_file.read_text(encoding="utf-8")) or {}
    defaults = {**yaml.safe_load(text), **(experiment_yaml.get("train") or {})}
    options = []
    for name, annotation in train_settings_fields():
        if name in leave_out:
            continue
        base, _, optional = annotation.partition(" | ")
        kind = kinds.get(base, str)
        value = defaults.get(name)
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) \
            else str(value)
        flag = f"--{name.replace('_', '-')}"
        if kind is bool:  # --compile / --no-compile
            flag = f"{flag}/--no-{name.replace('_', '-')}"
        nullable = {"metavar": f"{kind.__name__.upper()}|null",
                    "parser": _number_or_null(kind)} if optional else {}
        help_text = f"{comments.get(name) or name.replace('_', ' ')} (train.{name}, default " \
                    f"{shown})."
        options.append(option(name, f"train.{name}", help_text, str if optional else kind, flag,
                              rich_help_panel=TRAINING_PANEL, **nullable))
    return options
