"""What keeping a resumable state costs ``tlab train``: the run's training wall time with
``train.checkpoint_every`` 0 (only the final weights, always kept), 50 and 10, interleaved.

    python -m benchmarks.checkpoint_cost [--runs 5] [--steps 200] [--out FILE.csv]

Each run is ``tlab train`` in process at its default model (``model=small``) on the offline
synthetic language (``task=lm``, so no corpus is needed), one seed; ``wall_s`` is the run's own
(``summary.csv``: training and evaluation, not start-up). Reported per setting: median and min
wall time, the median milliseconds per step and the median extra milliseconds per checkpoint
against ``checkpoint_every=0`` measured in the same rounds, and the state file's size.
"""

from __future__ import annotations

import argparse
import csv
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import write_csv

OUT = Path(__file__).resolve().parent / "checkpoint_cost.csv"
EVERY = (0, 50, 10)


def train_once(root: Path, name: str, steps: int, every: int) -> tuple[float, int]:
    """One ``tlab train`` run: (its wall_s, the size of its checkpoint.pt at its largest)."""
    from transformer_lab.app.hydra_app import main

    out = root / name
    handlers = list(logging.root.handlers)
    try:
        code = main(["experiment=train", "task=lm", f"train.steps={steps}",
                     f"train.checkpoint_every={every}", "logger.progress=false",
                     f"hydra.run.dir={out}"])
    finally:
        logging.root.handlers[:] = handlers
    if code != 0:
        raise SystemExit(f"tlab train exited {code} ({out})")
    with (out / "summary.csv").open(newline="") as f:
        wall = float(next(csv.DictReader(f))["wall_s"])
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return wall, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_cost",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    from transformer_lab.results.console import console

    console.quiet = True  # the runs' tables
    walls: dict[int, list[float]] = {every: [] for every in EVERY}
    with tempfile.TemporaryDirectory() as tmp:
        train_once(Path(tmp), "warm-up", 20, 0)
        for round_ in range(args.runs):
            for every in EVERY:
                wall, weights = train_once(Path(tmp), f"{round_}-{every}", args.steps, every)
                walls[every].append(wall)
    rows = []
    for every in EVERY:
        extra = [w - w0 for w, w0 in zip(walls[every], walls[0], strict=True)]
        saves = args.steps // every + 2 if every else 0  # + at the start and the end
        rows.append({"checkpoint_every": every, "steps": args.steps, "runs": args.runs,
                     "median_wall_s": round(statistics.median(walls[every]), 3),
                     "min_wall_s": round(min(walls[every]), 3),
                     "ms_per_step": round(1000 * statistics.median(walls[every]) / args.steps, 2),
                     "extra_s_vs_none": round(statistics.median(extra), 3),
                     "ms_per_checkpoint": round(1000 * statistics.median(extra) / saves, 1)
                     if saves else 0.0,
                     "weights_bytes": weights})
    for row in rows:
        print(f"checkpoint_every={row['checkpoint_every']:<3} median {row['median_wall_s']:.2f} s"
              f" ({row['ms_per_step']:.1f} ms/step), {row['extra_s_vs_none']:+.2f} s vs none"
              f" ({row['ms_per_checkpoint']:.0f} ms per checkpoint)")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
