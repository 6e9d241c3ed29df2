"""The ``tlab`` command line (Typer): options become Hydra overrides for the app
(``docs/cli.md``)."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.commands import run
from transformer_lab.cli.common import COMMANDS
from transformer_lab.cli.listing import list_choices
from transformer_lab.cli.report import report
from transformer_lab.cli.trained import export, sample

app = typer.Typer(
    name="tlab",
    help="tlab: check and compare Transformer components (positional encodings, FFN "
    "activations, normalisation) on small models. Results go to CSV tables and PNG plots. "
    "Every command also takes -q/--quiet (no progress bars), --force (run even if the memory "
    "estimate says it will not fit), --out DIR, -m/--multirun and Hydra overrides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    """``tlab X, torch Y, hydra Z, python W`` from the installed metadata (imports no torch)."""
    import platform
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    if value:
        typer.echo(f"tlab {version('transformer_lab')}, torch {version('torch')}, hydra "
                   f"{version('hydra-core')}, python {platform.python_version()}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the versions of tlab, torch and hydra and exit.")] = False,
) -> None:
    """Global options (--version); the help text is the Typer app's."""


OTHER_COMMANDS = {"sample": sample, "export": export, "run": run, "list": list_choices,
                  "report": report}
for name in ("train", "sample", "export", "smoke", "run", "list", "report", "extrapolate",
             "budget", "check", "plot-pe", "reverse-task", "compare", "compare-activations",
             "validate", "mutants"):  # the order of tlab --help
    # Hydra's flags (--cfg job, --info, ...) reach a command's overrides as unknown options.
    context = {"ignore_unknown_options": True} if name in COMMANDS else None
    if name == "run":
        context = {"allow_extra_args": True, "ignore_unknown_options": True,
                   "help_option_names": []}
    app.command(name, context_settings=context)(COMMANDS.get(name) or OTHER_COMMANDS[name])
