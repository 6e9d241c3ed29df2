"""CPU ms per step of 8 seeds in stacked groups of 8 / 4 / 2 / 1 against one after another, at
four sizes of per-seed work (tokens x d_model): the measurement behind
``seed_groups.GROUP_MAX_WORK``.

    python -m benchmarks.seed_groups [--seeds 8] [--steps 60] [--repeats 3] [--out FILE.csv]

Each setting is the ``small`` model (d 64, 2 layers, d_ff 256, learned PE, the reverse task)
except the first (d 32, d_ff 128, 8 tokens); the batch sets the work: 4096, 16384, 32768,
65536 (``small``'s own). ``group_1`` forces 1-seed stacked models (not the engine's choice,
which runs a group of one as the seed's single run: ``sequential``). A step's CPU time is the
slope between a call of ``--steps`` steps and one of ``--steps / 6`` (``benchmarks/multiseed.py``);
the arms alternate ``--repeats`` times and each row is the median.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_csv
from benchmarks.peers import BenchSize, tlab_overrides

OUT = Path(__file__).resolve().parent / "seed_groups.csv"
SETTINGS = [  # (d_model, d_ff, seq_len, batch): per-seed work = seq_len x batch x d_model
    (32, 128, 8, 16), (64, 256, 16, 16), (64, 256, 16, 32), (64, 256, 16, 64)]


def cpu_ms_per_step(run, steps: int) -> float:
    """CPU ms that one more step of ``run`` costs (slope between two call lengths)."""
    short = max(1, steps // 6)
    start = time.process_time()
    run(steps)
    long_s, start = time.process_time() - start, time.process_time()
    run(short)
    return (long_s - (time.process_time() - start)) / (steps - short) * 1e3


def bench(setting: tuple[int, int, int, int], n_seeds: int, steps: int,
          repeats: int) -> list[dict]:
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.training.multiseed import build_seeded_models, fit_seeds

    d_model, d_ff, seq_len, batch = setting
    size = BenchSize("x", d_model=d_model, n_heads=4, n_layers=2, d_ff=d_ff, seq_len=seq_len,
                     batch=batch)
    cfg = compose([*tlab_overrides(size, "cpu", "fp32"), "train.log_every=10",
                   "train.eval_every=0", "task.eval_size=64"])
    task = build_task(cfg)
    seeds = list(range(n_seeds))
    arms = {}
    for group in sorted({n_seeds, 4, 2, 1}, reverse=True):
        models = build_seeded_models(cfg, seeds)
        arms[f"group_{group}"] = (lambda n, m=models, g=group: fit_seeds(
            cfg, seeds, n, task=task, models=m, engine="stacked", group=g))
    models = build_seeded_models(cfg, seeds)
    arms["sequential"] = lambda n, m=models: fit_seeds(cfg, seeds, n, task=task, models=m,
                                                        engine="sequential")
    times: dict[str, list[float]] = {name: [] for name in arms}
    with contextlib.redirect_stdout(io.StringIO()):  # fit_seeds' engine line, per call
        for run in arms.values():
            run(10)  # warm-up
        for _ in range(repeats):
            for name, run in arms.items():
                times[name].append(cpu_ms_per_step(run, steps))
    work = seq_len * batch * d_model
    return [{"work_per_seed": work, "seeds": n_seeds, "arm": name,
             "cpu_ms_per_step": round(statistics.median(t), 2), "steps": steps,
             "repeats": repeats, "torch": torch.__version__} for name, t in times.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seed_groups", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for setting in SETTINGS:
        for row in bench(setting, args.seeds, args.steps, args.repeats):
            rows.append(row)
            print(f"work {row['work_per_seed']:>6}  {row['arm']:<10} "
                  f"{row['cpu_ms_per_step']:7.2f} CPU ms/step", flush=True)
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
