"""Time ``tlab validate`` end to end, and count reverse-task steps-to-solve per PE and arch.

    python -m benchmarks.validate_time                  # both parts
    python -m benchmarks.validate_time --runs 5 --no-steps
    python -m benchmarks.validate_time --no-timing --seeds 3 --archs encoder,decoder

Part 1 runs ``tlab validate`` (the default configuration, all four steps, NoPE control
included) ``--runs`` times as separate processes, each into a fresh directory, and reports the
median, min and max wall time (the target is 10 s on a 2-core CPU). Part 2 trains the reversal
of the reverse-task defaults for every PE x arch x seed (no control) and reports the median
step at which held-out exact match reached 0.99 (empty when it did not within max_steps).
Results go to ``benchmarks/validate_time.csv`` and ``benchmarks/reverse_steps.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import TLAB, write_csv

HERE = Path(__file__).resolve().parent
PES = {
    "none": ["pe=none"], "sinusoidal": ["pe=sinusoidal"], "learned": ["pe=learned"],
    "sinusoidal_learned": ["pe=sinusoidal_learned"], "rope": ["pe=rope"],
    "alibi(abs)": ["pe=alibi", "pe.symmetric=abs"], "alibi(split)": ["pe=alibi",
                                                                      "pe.symmetric=split"],
    "t5": ["pe=t5"],
}


def time_validate(runs: int, extra: list[str]) -> dict:
    walls, codes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            start = time.perf_counter()
            done = subprocess.run([TLAB, "validate", "--out", f"{tmp}/run{i}", *extra],
                                  capture_output=True, text=True)
            walls.append(time.perf_counter() - start)
            codes.append(done.returncode)
            print(f"  run {i}: {walls[-1]:.2f} s, exit {done.returncode}", flush=True)
    return {"runs": runs, "median_s": statistics.median(walls), "min_s": min(walls),
            "max_s": max(walls), "exit_codes": " ".join(map(str, codes)),
            "args": " ".join(extra)}


def steps_to_solve(pes: list[str], archs: list[str], seeds: int, extra: list[str]) -> list[dict]:
    import torch

    from transformer_lab.config.compose import compose
    from transformer_lab.routines.nope_control import train_to_target

    torch.set_num_threads(1)
    rows = []
    for arch in archs:
        for pe in pes:
            solved, matches, walls = [], [], []
            for seed in range(seeds):
                cfg = compose(["experiment=reverse", *PES[pe], f"arch={arch}", f"seed={seed}",
                               *extra])
                result, _ = train_to_target(cfg, None, int(cfg.routine.max_steps),
                                            float(cfg.routine.target))
                solved.append(result.solved_step)
                matches.append(result.best_exact_match or 0.0)
                walls.append(result.wall_s)
            reached = [s for s in solved if s is not None]
            row = {"pe": pe, "arch": arch, "seeds": seeds, "solved": len(reached),
                   "median_steps": statistics.median(reached) if len(reached) == seeds else None,
                   "steps_per_seed": " ".join("-" if s is None else str(s) for s in solved),
                   "best_exact_match": " ".join(f"{m:.3f}" for m in matches),
                   "median_wall_s": statistics.median(walls),
                   "max_steps": int(cfg.routine.max_steps)}
            rows.append(row)
            print(f"  {arch:8s} {pe:20s} steps {row['steps_per_seed']:16s} "
                  f"exact match {row['best_exact_match']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="tlab validate runs to time")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per PE and arch")
    parser.add_argument("--pes", default=",".join(PES), help="comma-separated, from: "
                        + ", ".join(PES))
    parser.add_argument("--archs", default="encoder,decoder")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-steps", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra overrides for both parts")
    args = parser.parse_args(argv)
    if not args.no_timing:
        print(f"tlab validate x {args.runs}:")
        row = time_validate(args.runs, args.overrides)
        print(f"median {row['median_s']:.2f} s (min {row['min_s']:.2f}, max {row['max_s']:.2f})")
        write_csv(HERE / "validate_time.csv", [row])
    if not args.no_steps:
        print(f"reverse-task steps to solve, median over {args.seeds} seeds:")
        rows = steps_to_solve(args.pes.split(","), args.archs.split(","), args.seeds,
                              args.overrides)
        write_csv(HERE / "reverse_steps.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
