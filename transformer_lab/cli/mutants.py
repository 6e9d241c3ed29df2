"""``tlab mutants``: the validation routine's mutation score on broken and correct components."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_lab.cli.common import Out, Overrides, launch

MutantsDir = Annotated[Path | None, typer.Option(
    "--dir", help="Your own mutants: a directory of *.py files, each defining MUTANTS, a list "
    "of transformer_lab.mutants.Mutant (the directory is importable: _target_: my_file.MyPE).")]


def mutants(
    overrides: Overrides = None,
    directory: MutantsDir = None,
    negatives: Annotated[bool, typer.Option(
        help="Also run the built-in correct components (to count false alarms).")] = True,
    reversal: Annotated[bool, typer.Option(
        help="Also train step 3's reversal and NoPE control (minutes per component).")] = False,
    only: Annotated[str | None, typer.Option(
        help="Comma-separated component names: run only these.")] = None,
    out: Out = None,
) -> None:
    """Run the mutant suite (and the built-in components) through the pre-flight and the
    validation routine's steps 1-3; print the confusion matrix and the mutation score; write
    mutants.csv. Exit 0 only with no false alarm and every mutant caught at its expected step."""
    options = {"routine.dir": str(directory.resolve()) if directory else None,
               "routine.negatives": str(negatives).lower(),
               "routine.reversal": str(reversal).lower(),
               "routine.only": f"'{only}'" if only else None}  # quoted: a comma is a sweep
    launch("mutants", options, overrides, False, out)
