"""The ``tlab`` command line (Typer), one module per command: options become Hydra overrides
for the app (``docs/cli.md``)."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli import extrapolate, listing, run, smoke
from transformer_lab.cli import report as report_command
from transformer_lab.cli.budget import budget as budget_command
from transformer_lab.cli.check import check as check_command
from transformer_lab.cli.common import pass_hydra_flags, use_app
from transformer_lab.cli.compare import compare
from transformer_lab.cli.compare_activations import compare_activations
from transformer_lab.cli.export import export as export_command
from transformer_lab.cli.mutants import mutants as mutants_command
from transformer_lab.cli.plot_pe import plot_pe as plot_pe_command
from transformer_lab.cli.reverse_task import reverse_task
from transformer_lab.cli.sample import sample as sample_command
from transformer_lab.cli.train import train
from transformer_lab.cli.validate import validate

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


def versions_line() -> str:
    """``tlab X, torch Y, hydra Z, python W`` from the installed metadata (imports no torch)."""
    import platform
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"tlab {version('transformer_lab')}, torch {version('torch')}, hydra "
            f"{version('hydra-core')}, python {platform.python_version()}")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(versions_line())
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the versions of tlab, torch and hydra and exit.")] = False,
) -> None:
    """Global options (--version); the help text is the Typer app's."""


app.command("train")(train)
app.command("sample")(sample_command)
app.command("export")(export_command)
app.command("smoke")(smoke.smoke)
app.command("run", context_settings=run.CONTEXT)(run.run)
app.command("list")(listing.list_choices)
app.command("report")(report_command.report)
app.command("extrapolate")(extrapolate.extrapolate)
app.command("budget")(budget_command)
app.command("check")(check_command)
app.command("plot-pe")(plot_pe_command)
app.command("reverse-task")(reverse_task)
app.command("compare")(compare)
app.command("compare-activations")(compare_activations)
app.command("validate")(validate)
app.command("mutants")(mutants_command)
pass_hydra_flags(app)  # after every app.command: --cfg job, --info ... on each command
use_app(app)  # unknown options are checked against these commands' own

