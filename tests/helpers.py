"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

# The `tlab` console script installed beside the interpreter running the tests (the venv's
# bin/), so the tests do not depend on PATH.
TLAB = str(Path(sys.executable).with_name("tlab"))


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV a run wrote, as dicts of strings."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
