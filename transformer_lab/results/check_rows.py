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
    table = Table(title=title)
    for column in ("step", "check", "status", "value", "threshold", "detail"):
        table.add_column(column, overflow="fold")
    colours = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
    for row in rows:
        value = "" if row.value is None or (isinstance(row.value, float)
                                            and math.isnan(row.value)) else f"{row.value:.4g}"
        table.add_row(str(row.step), row.check, f"[{colours[row.status]}]{row.status}[/]", value,
                      "" if row.threshold is None else str(row.threshold), row.detail)
    return table
