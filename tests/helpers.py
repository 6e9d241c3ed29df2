"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import csv
from pathlib import Path


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV a run wrote, as dicts of strings."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
