"""What the benchmark scripts share: the ``tlab`` script to time and the CSV they write."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path

TLAB = str(Path(sys.executable).with_name("tlab"))  # the console script of this environment


def write_csv(path: Path, rows: list[dict], columns: Sequence[str] | None = None,
              append: bool = False) -> None:
    """Write ``rows`` (header ``columns``, default the first row's keys) and say where; with
    ``append``, add them below the rows already in ``path`` (same header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fieldnames = list(columns or rows[0])
    if append and path.exists():
        with path.open(newline="") as f:
            header = next(csv.reader(f), None)
        if header != fieldnames:
            raise SystemExit(f"--append: {path} has columns {header}, not {fieldnames}")
    else:
        append = False
    with path.open("a" if append else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        if not append:
            writer.writeheader()
        writer.writerows(rows)
    print(f"{'added to' if append else 'wrote'} {path}")
