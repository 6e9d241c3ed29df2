"""Time ``tlab validate`` end to end, and count reverse-task steps-to-solve per PE and arch.

    python -m benchmarks.validate_time                  # both parts
    python -m benchmarks.validate_time --runs 5 --no-steps
    python -m benchmarks.validate_time --runs 5 --no-steps --old /tmp/old   # + a checkout
    python -m benchmarks.validate_time --no-timing --seeds 3 --archs encoder,decoder

Part 1 runs ``tlab validate`` (the default configuration, all four steps, NoPE control
included) ``--runs`` times per arm as separate processes, each into a fresh directory, the arms
in turn (A B C A B C ...) so that a drift of the machine's speed hits them alike: ``parallel``
(the default: step 4 in a child process beside steps 1-3), ``sequential``
(``routine.parallel=false``) and, with ``--old PATH``, the checkout at PATH run by the same
interpreter (``PYTHONPATH=PATH``). Each arm's median, min and max wall time, the median of
its pairwise ratio to the first arm, its CPU time
(``cpu_s``, step 4's child process included) and the CPU time other processes took during its
runs (``others_cpu_s``: 0 on a quiet machine; ``--idle-wait S`` waits up to S seconds before
each run for the machine to be idle). Part 2 trains the
reversal of the reverse-task defaults for every PE x arch x seed (no control) and reports the
median step at which held-out exact match reached 0.99 (empty when it did not within
max_steps). Results go to ``benchmarks/validate_time.csv`` and ``benchmarks/reverse_steps.csv``.
"""

from __future__ import annotations

import argparse
import os
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


ARMS = {"parallel": [], "sequential": ["routine.parallel=false"]}
IDLE = 0.15  # --idle-wait: the share of all CPUs others may use for a run to start


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (Linux ``/proc/stat``; else 0s)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    except OSError:
        return 0, 0
    return sum(fields) - fields[3] - fields[4], sum(fields)  # all but idle and iowait


def wait_for_idle(max_s: float) -> None:
    """Wait (at most ``max_s``) until other processes use under ``IDLE`` of the CPUs."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        before = _busy_ticks()
        time.sleep(1.0)
        after = _busy_ticks()
        if after[1] == before[1] or (after[0] - before[0]) / (after[1] - before[1]) < IDLE:
            return


def _time_once(out: str, args: list[str], pythonpath: str | None) -> dict:
    """Wall time, CPU time (the run and its forked child) and the CPU time other processes
    took meanwhile (a noise figure: 0 on a quiet machine), and the exit code."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    ticks, start = _busy_ticks(), time.perf_counter()
    process = subprocess.Popen([TLAB, "validate", "--out", out, *args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall, after = time.perf_counter() - start, _busy_ticks()
    cpu = usage.ru_utime + usage.ru_stime
    others = (after[0] - ticks[0]) / os.sysconf("SC_CLK_TCK") - cpu
    return {"wall": wall, "cpu": cpu, "others": max(0.0, others),
            "code": os.waitstatus_to_exitcode(status)}


def time_validate(runs: int, extra: list[str], old: str | None = None,
                  idle_wait: float = 0.0) -> list[dict]:
    """One row per arm: wall times over ``runs`` runs taken in turn with the other arms."""
    arms = {name: (args, None) for name, args in ARMS.items()}
    if old:
        arms["old"] = ([], old)
    done: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for name, (args, pythonpath) in arms.items():
                wait_for_idle(idle_wait)
                run = _time_once(f"{tmp}/{name}{i}", [*args, *extra], pythonpath)
                done[name].append(run)
                print(f"  run {i} {name:10s}: {run['wall']:.2f} s wall, {run['cpu']:.2f} s cpu"
                      f" (others {run['others']:.1f} s), exit {run['code']}", flush=True)
    first = [r["wall"] for r in done[next(iter(arms))]]
    rows = []
    for name, results in done.items():
        walls = [r["wall"] for r in results]
        rows.append({
            "arm": name, "runs": runs, "median_s": statistics.median(walls),
            "min_s": min(walls), "max_s": max(walls),
            "ratio_to_first": statistics.median(a / b for a, b in zip(walls, first,
                                                                       strict=True)),
            "cpu_s": statistics.median(r["cpu"] for r in results),
            "others_cpu_s": statistics.median(r["others"] for r in results),
            "exit_codes": " ".join(str(r["code"]) for r in results),
            "args": " ".join([*arms[name][0], *extra]) + (f" PYTHONPATH={old}"
                                                            if name == "old" else "")})
    return rows


def steps_to_solve(pes: list[str], archs: list[str], seeds: int, extra: list[str]) -> list[dict]:
    import torch

    from transformer_lab.config.compose import compose
    from transformer_lab.config.spec import RunSpec
    from transformer_lab.routines.reverse_task import train_reversal

    torch.set_num_threads(1)
    rows = []
    for arch in archs:
        for pe in pes:
            solved, matches, walls = [], [], []
            for seed in range(seeds):
                spec = RunSpec.of(compose(["experiment=reverse_task", *PES[pe],
                                           f"arch={arch}", f"seed={seed}", *extra]))
                run = train_reversal(spec, "chosen", seed, int(spec.routine.max_steps), None)
                result = run.result
                solved.append(result.solved_step)
                matches.append(result.best_exact_match or 0.0)
                walls.append(result.wall_s)
            reached = [s for s in solved if s is not None]
            row = {"pe": pe, "arch": arch, "seeds": seeds, "solved": len(reached),
                   "median_steps": statistics.median(reached) if len(reached) == seeds else None,
                   "steps_per_seed": " ".join("-" if s is None else str(s) for s in solved),
                   "best_exact_match": " ".join(f"{m:.3f}" for m in matches),
                   "median_wall_s": statistics.median(walls),
                   "max_steps": int(spec.routine.max_steps)}
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
    parser.add_argument("--old", default=None, help="also time the checkout at this path "
                        "(PYTHONPATH=PATH, same interpreter), e.g. a git worktree")
    parser.add_argument("--idle-wait", type=float, default=0.0, help="before each run, wait up "
                        "to this many seconds for the machine to be idle (a shared machine)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-steps", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra overrides for both parts")
    args = parser.parse_args(argv)
    if not args.no_timing:
        print(f"tlab validate x {args.runs} per arm, arms in turn:")
        rows = time_validate(args.runs, args.overrides, args.old, args.idle_wait)
        for row in rows:
            print(f"{row['arm']:10s} median {row['median_s']:.2f} s (min {row['min_s']:.2f}, "
                  f"max {row['max_s']:.2f}), x{row['ratio_to_first']:.2f} the first arm")
        write_csv(HERE / "validate_time.csv", rows)
    if not args.no_steps:
        print(f"reverse-task steps to solve, median over {args.seeds} seeds:")
        rows = steps_to_solve(args.pes.split(","), args.archs.split(","), args.seeds,
                              args.overrides)
        write_csv(HERE / "reverse_steps.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
