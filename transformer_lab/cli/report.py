"""``tlab report DIR``: every run under DIR in one CSV, a pivot table and plots."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from transformer_lab.cli.common import usage_errors


def report(
    directory: Annotated[Path, typer.Argument(help="A sweep directory or any folder of runs.",
                                              show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Where to write the report files (default: DIR).")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="Summary number to plot per choice (default best_exact_match if the "
        "runs have it, else final_loss).")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="With a seed key: the group the others are tested against, paired "
        "by seed, as VALUE or KEY=VALUE (default: the first value of the first swept key).",
        show_default=False)] = None,
) -> None:
    """Gather every run under DIR (a sweep) into one CSV, a markdown table and plots.

    Writes report.csv (one row per run), report-pivot.csv and report.md (mean ± std over seeds,
    grouped by the swept keys; with a seed key the metric's 95% CI and a verdict against the
    baseline group, paired by seed), report-<metric>.png and report-loss.png; an earlier
    report is never overwritten (the next one is report-2.*)."""
    from transformer_lab.results.console import (
        console,
        print_final_line,
        print_table,
        print_warning,
    )
    from transformer_lab.results.report import make_report, rich_table
    from transformer_lab.results.search_report import write_study_report
    from transformer_lab.results.verdicts import verdict_lines

    started = time.perf_counter()
    with usage_errors():
        result = make_report(directory, out, metric, baseline)
    for path, why in result.gathered.skipped:
        print_warning(f"skipped {path}: {why}")
    print_table(rich_table(result))
    keys = result.gathered.group_keys or ["group"]
    for line in verdict_lines(result.pivot, keys, result.metric or ""):
        console.print(line, highlight=False, markup=False)
    if result.gathered.superseded:
        console.print(f"{result.gathered.superseded} superseded attempt(s) (<job>.failed-<n>) "
                      "not counted")
    trials = write_study_report(directory, out or directory)  # an Optuna search: its trials
    written = [*result.files, *([trials] if trials else [])]
    console.print("wrote " + ", ".join(map(str, written)), soft_wrap=True)  # paths whole
    print_final_line("report", "done", [f"{len(result.gathered.runs)} runs"],
                     time.perf_counter() - started)
