"""CLI start-up: wall time of ``tlab --help`` and ``tlab list`` as fresh processes.

    python -m benchmarks.startup [--runs 21] [--out benchmarks/startup.csv]

Each command runs ``--runs`` times (interleaved); reported: median and min wall time, against
the 0.3 s target of issue 7. Neither command may import torch or Hydra
(``tests/test_perf_paths.py`` checks that); ``python -X importtime -m transformer_lab list``
shows what they do import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import TLAB, write_csv

OUT = Path(__file__).resolve().parent / "startup.csv"
COMMANDS = {"tlab --help": ["--help"], "tlab list": ["list"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run([TLAB, *command], capture_output=True, check=True)
            walls[name].append(time.perf_counter() - start)
    rows = [{"command": name, "runs": args.runs, "median_s": round(statistics.median(w), 4),
             "min_s": round(min(w), 4), "target_s": 0.3} for name, w in walls.items()]
    for row in rows:
        print(f"{row['command']:12s} median {row['median_s']:.3f} s  min {row['min_s']:.3f} s  "
              f"(target <= 0.3 s)")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
