"""Sweep benchmark: the same 6-job reverse-task sweep run serially and with the joblib launcher.

    python -m benchmarks.sweep_parallel [--repeats 3] [--max-steps N] [--n-jobs 2]
                                        [--variants serial,joblib]
                                        [--out benchmarks/sweep_parallel.csv]

The sweep is ``tlab reverse-task -m pe=sinusoidal,rope,alibi seed=0,1`` with the experiment's
defaults (each job trains until solved or routine.max_steps, plus its NoPE control): 6 jobs.
``--max-steps`` lowers routine.max_steps for a quick look (shorter jobs make the fixed
start-up costs weigh more, so the ratio gets worse).

Every variant is a fresh ``python -m transformer_lab.run`` process, timed from launch to exit,
so interpreter and torch start-up, Hydra's composition and joblib's worker start-up all count:

    serial          basic launcher
    joblib          hydra/launcher=joblib hydra.launcher.n_jobs=N

(every job trains on ``train.threads=1``, tlab's default). Variants are interleaved within each
repeat (a burst of load from elsewhere hits all of them alike); reported: the median wall time
per variant and ratio = median(joblib) / median(serial); the target in issue 4 is <= 0.6 on 2
cores. ``cpu_s`` is the CPU time (user + sys) of the sweep process and its reaped workers; with
other load on the machine, (joblib cpu_s / n_jobs) / serial cpu_s is printed as the ratio an
idle machine could reach at best.
Each run's sweep.csv must hold 6 rows (else the run is reported as broken).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_csv

RESULTS = Path(__file__).resolve().parent / "sweep_parallel.csv"
SWEEP = ["experiment=reverse_task", "pe=sinusoidal,rope,alibi", "seed=0,1"]
N_JOBS_IN_SWEEP = 6
COLUMNS = ["variant", "repeat", "wall_s", "cpu_s", "jobs_recorded", "job_wall_s_sum",
           "exit_code", "max_steps", "n_jobs", "cpus", "load_avg_1m"]


def variants(n_jobs: int) -> dict[str, list[str]]:
    """name -> extra Hydra arguments."""
    return {"serial": [], "joblib": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}"]}


def run_sweep(extra: list[str], sweep_dir: Path,
              max_steps: int | None) -> tuple[float, float, int, float, int]:
    """Run one sweep in a fresh process: (wall s, CPU s of it and its workers, jobs recorded,
    sum of job wall_s, exit code)."""
    steps = [] if max_steps is None else [f"routine.max_steps={max_steps}"]
    command = [sys.executable, "-m", "transformer_lab.run", "-m", *SWEEP, *steps, *extra,
               f"hydra.sweep.dir={sweep_dir}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # includes reaped joblib workers
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = []
    if (sweep_dir / "sweep.csv").exists():
        with (sweep_dir / "sweep.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
    job_wall = sum(float(r["wall_s"]) for r in rows if r.get("wall_s"))
    if len(rows) != N_JOBS_IN_SWEEP:
        print(f"  warning: {sweep_dir} recorded {len(rows)} jobs (exit {done.returncode}): "
              f"{done.stderr.strip()[-300:]}", file=sys.stderr)
    return wall, cpu, len(rows), job_wall, done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="routine.max_steps of each reverse job (default: the experiment's)")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--variants", default="serial,joblib",
                        help="comma-separated subset of serial, joblib")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    every = variants(args.n_jobs)
    unknown = [v for v in args.variants.split(",") if v not in every]
    if unknown:
        parser.error(f"--variants: {', '.join(unknown)} not known; valid: {', '.join(every)}")
    chosen = {name: every[name] for name in args.variants.split(",")}
    rows = []
    with tempfile.TemporaryDirectory(prefix="tlab-sweep-bench-") as tmp:
        for repeat in range(args.repeats):
            order = list(chosen) if repeat % 2 == 0 else list(reversed(chosen))
            for name in order:
                sweep_dir = Path(tmp) / f"{name}-{repeat}"
                wall, cpu, recorded, job_wall, code = run_sweep(chosen[name], sweep_dir,
                                                                args.max_steps)
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
                rows.append({"variant": name, "repeat": repeat, "wall_s": round(wall, 2),
                             "cpu_s": round(cpu, 2),
                             "jobs_recorded": recorded, "job_wall_s_sum": round(job_wall, 2),
                             "exit_code": code, "max_steps": args.max_steps,
                             "n_jobs": args.n_jobs if name == "joblib" else 1,
                             "cpus": os.cpu_count(), "load_avg_1m": round(load, 2)})
                print(f"repeat {repeat} {name:15s} {wall:7.2f} s wall {cpu:7.2f} s cpu  "
                      f"({recorded} jobs, "
                      f"sum of job wall_s {job_wall:.1f} s, load {load:.1f})", flush=True)
    medians = {name: statistics.median(r["wall_s"] for r in rows if r["variant"] == name)
               for name in chosen}
    write_csv(args.out, rows, COLUMNS)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
          f"{N_JOBS_IN_SWEEP}-job sweep, routine.max_steps={args.max_steps or 'default'}, "
          f"{args.repeats} repeats (median wall time, process start-up included)")
    for name, median in medians.items():
        print(f"  {name:15s} {median:7.2f} s")
    if "joblib" in medians and "serial" in medians:
        print(f"  ratio joblib / serial = {medians['joblib'] / medians['serial']:.2f}"
              "  (target <= 0.6)")
        cpu = {name: statistics.median(r["cpu_s"] for r in rows if r["variant"] == name)
               for name in ("joblib", "serial")}
        print(f"  idle-machine bound: (joblib cpu / {args.n_jobs}) / serial cpu = "
              f"{cpu['joblib'] / args.n_jobs / cpu['serial']:.2f}  (a lower bound for "
              "the ratio when nothing else runs; the load above makes wall times unreliable)")
    print(f"rows: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
