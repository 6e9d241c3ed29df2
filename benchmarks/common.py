"""What the benchmark scripts share: the ``tlab`` script to time and the CSV they write."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path

TLAB = str(Path(sys.executable).with_name("tlab"))  # the console script of this environment


def write_csv(path: Path, rows: list[dict], columns: Sequence[str] | None = None) -> None:
    """Write ``rows`` (header ``columns``, default the first row's keys) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns or rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
