"""A row of ``budget.csv`` (:class:`BudgetRow`, :data:`BUDGET_COLUMNS`), how a formula and a
measurement compare, and the terminal table of ``tlab budget`` (``budget.py``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

BUDGET_COLUMNS = ["section", "component", "scope", "formula", "expected", "measured", "unit",
                  "status", "detail"]


@dataclass
class BudgetRow:
    section: str  # parameters | activations | flops | article
    component: str
    scope: str  # "layer (xL)" | "per layer" | "layer i" | "model" | "per token" | "article layer"
    formula: str
    expected: float | None
    measured: float | None
    unit: str
    status: str = ""  # PASS | FAIL | SKIP | INFO (no check) | DIFF (an article figure differs)
    detail: str = ""

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def compare(expected: float | None, measured: float | None) -> str:
    """PASS when formula and measurement agree exactly, FAIL when not, SKIP without a formula."""
    if expected is None or measured is None:
        return "SKIP"
    return "PASS" if expected == measured else "FAIL"


def budget_table(rows: list[BudgetRow], title: str) -> Table:
    table = Table(title=title)
    for column in ("component", "scope", "expected", "measured", "unit", "status"):
        table.add_column(column, justify="right" if column in ("expected", "measured") else "left")
    colours = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow", "INFO": "dim",
               "DIFF": "magenta"}

    def text(value: float | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"

    section = rows[0].section if rows else ""
    for row in rows:
        if row.section != section:
            table.add_section()
            section = row.section
        table.add_row(f"{row.section}: {row.component}", row.scope, text(row.expected),
                      text(row.measured), row.unit, f"[{colours[row.status]}]{row.status}[/]")
    return table
