"""Rows of a PASS/FAIL check table (smoke.csv, validation.csv) and their rich rendering."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

CHECK_COLUMNS = ["step", "check", "status", "metric", "value", "threshold", "wall_s", "detail"]


@dataclass
class CheckRow:
    step: int
    check: str
    status: str  # PASS | FAIL | SKIP
    metric: str = ""
    value: float | None = None
    threshold: float | str | None = None
    wall_s: float = 0.0
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def share_wall(rows: list[CheckRow], wall_s: float | None) -> list[CheckRow]:
    """``rows``, ``wall_s`` shared among them unless a row has its own."""
    if wall_s is not None and rows and not any(row.wall_s for row in rows):
        for row in rows:
            row.wall_s = wall_s / len(rows)
    return rows


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.start = now - self.start, now
        return elapsed


def status(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def check_table(rows: list[CheckRow], title: str) -> Table:
    """The PASS/FAIL table: a name never wraps; below ``console.NARROW`` columns each row's
    detail goes on a line of its own under the check's name instead of a narrow column."""
    from rich.text import Text

    from transformer_lab.results.console import NARROW, console, result_table

    stacked = console.width < NARROW
    table = result_table(title)
    table.add_column("step", no_wrap=True)
    table.add_column("check", no_wrap=not stacked,
                     min_width=max((len(row.check) for row in rows), default=5))
    for column in ("status", "value", "threshold"):
        table.add_column(column, no_wrap=True, justify="right" if column == "value" else "left")
    if not stacked:
        table.add_column("detail", overflow="fold")
    colours = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
    for row in rows:
        value = "" if row.value is None or math.isnan(row.value) else f"{row.value:.4g}"
        cells = [str(row.step), row.check, f"[{colours[row.status]}]{row.status}[/]", value,
                 "" if row.threshold is None else str(row.threshold)]
        table.add_row(*cells, *([] if stacked else [row.detail]))
        if stacked and row.detail:
            table.add_row("", Text(row.detail, style="dim", overflow="fold"), "", "", "")
    return table


def check_counts(statuses: list[str]) -> list[str]:
    """``["PASS", "SKIP", "FAIL"]`` -> ``["3 checks", "1 FAIL", "1 SKIP"]`` (a final line's)."""
    counts = [f"{statuses.count(kind)} {kind}" for kind in ("FAIL", "SKIP")
              if kind in statuses]
    return [f"{len(statuses)} check{'s' if len(statuses) != 1 else ''}", *counts]
