"""``tlab report DIR``: one CSV, a pivot table (markdown + terminal) and plots of every run under
DIR (a sweep or any folder of runs). The work is in ``transformer_lab.results.report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    directory: Annotated[Path, typer.Argument(help="A sweep directory or any folder of runs.",
                                              show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Where to write the report files (default: DIR).")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="Summary number to plot per choice (default best_exact_match if the "
        "runs have it, else final_loss).")] = None,
) -> None:
    """Gather every run under DIR (a sweep) into one CSV, a markdown table and plots.

    Writes report.csv (one row per run), report-pivot.csv and report.md (mean ± std over seeds,
    grouped by the swept keys), report-<metric>.png and report-loss.png; an earlier report is
    never overwritten (the next one is report-2.*)."""
    from transformer_lab.errors import EXIT_USAGE, ConfigError
    from transformer_lab.results.console import console, print_error, print_warning
    from transformer_lab.results.report import make_report, rich_table

    try:
        result = make_report(directory, out, metric)
    except ConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    for path, why in result.gathered.skipped:
        print_warning(f"skipped {path}: {why}")
    console.print(rich_table(result))
    if result.gathered.superseded:
        console.print(f"{result.gathered.superseded} superseded attempt(s) (<job>.failed-<n>) "
                      "not counted")
    console.print("wrote " + ", ".join(str(p) for p in result.files))
