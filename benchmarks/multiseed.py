"""Milliseconds per training step of S seeds: one seed alone against the three engines of
``multiseed.fit_seeds`` (seed-stacked model, vmap, one after another), at S = 1, 2, 4, 8, 16.

    python -m benchmarks.multiseed [--sizes tiny,small] [--seeds 1,2,4,8,16] [--steps 30]
                                   [--repeats 3] [--threads 1] [--device cpu|cuda]
                                   [--arms stacked,vmap,sequential] [--out FILE.csv] [--append]

Every arm trains tlab's model of ``peers.SIZES`` (tiny: d 8, 1 layer, 8 x 4 tokens; small: d 64,
2 layers, 64 x 16 tokens) on the reverse task with fresh batches from each seed's generator,
no evaluation until the last step: ``one_seed`` is ``Trainer.fit`` of seed 0, the others are
``fit_seeds(..., engine=arm)`` for seeds 0..S-1 (model building excluded; stacking the models
included). The arms alternate ``--repeats`` times so that load changes hit them alike; each
row is the median. ``ratio`` = an arm's ms/step over one seed's, measured beside it.

``bound_ms`` is the physical bound S x FLOPs / peak: FLOPs of one seed's step counted by
``FlopCounterMode`` (matmuls and attention, forward and backward; element-wise ops not
counted), the matmul peak measured in the same run (512^3 fp32, or bf16 on CUDA: best of 20),
so ``bound_ratio`` = bound_ms / one seed's ms is the ratio a perfectly efficient S-seed step
would reach and ``pct_of_peak`` = bound_ms / ms how close an arm gets. Targets (issue 13):
tiny 8 seeds <= 1.5x one seed; small stacked never slower than one after another.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import write_csv
from benchmarks.peers import SIZES, tlab_overrides

OUT = Path(__file__).resolve().parent / "multiseed.csv"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak_flops(device: str, n: int = 512, repeats: int = 20) -> float:
    """FLOP/s of an n^3 matmul (fp32 on CPU) on this device: the best of ``repeats``."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_flops(step: Callable[[], object]) -> float:
    """FLOPs of one call of ``step`` (matmuls, SDPA; element-wise ops are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def make_arms(size_name: str, n_seeds: int, steps: int, device: str,
              names: list[str]) -> tuple[dict[str, Callable[[], None]], Callable[[], object]]:
    """arm -> ``steps`` training steps of that arm (S seeds); and one seed's single step."""
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.training.multiseed import build_seeded_models, fit_seeds
    from transformer_lab.training.trainer import Trainer

    size = SIZES[size_name]
    cfg = compose([*tlab_overrides(size, device, "fp32"), "train.log_every=10",
                   "train.eval_every=0", "task.eval_size=64"])
    task = build_task(cfg)
    seeds = list(range(n_seeds))
    one = Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, size.d_model, 0)
    arms: dict[str, Callable[[], None]] = {"one_seed": lambda: one.fit(steps)}
    for name in names:
        if n_seeds == 1 and name != "stacked":
            continue  # one seed: vmap and sequential are Trainer.fit, the one_seed arm
        models = build_seeded_models(cfg, seeds)
        arms[name] = (lambda name=name, models=models:
                      fit_seeds(cfg, seeds, steps, task=task, models=models, engine=name))
    batch = task.train_batch(size.batch, torch.Generator().manual_seed(0)).to(device)
    flop_trainer = Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, size.d_model, 0)
    return arms, lambda: flop_trainer.train_step(batch)


def bench(size_name: str, n_seeds: int, args: argparse.Namespace, peak: float) -> list[dict]:
    arms, one_step = make_arms(size_name, n_seeds, args.steps, args.device, args.arms)
    flops = step_flops(one_step)
    quiet = contextlib.redirect_stdout(io.StringIO())  # fit_seeds' engine line, per call
    times: dict[str, list[float]] = {name: [] for name in arms}
    with quiet:
        for run in arms.values():  # warm-up (first-call allocations, lazy imports)
            run()
        for _ in range(args.repeats):
            for name, run in arms.items():
                synchronize(args.device)
                start = time.perf_counter()
                run()
                synchronize(args.device)
                times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    one_ms = statistics.median(times["one_seed"])
    rows = []
    for name, t in times.items():
        seeds_here = 1 if name == "one_seed" else n_seeds
        ms, bound_ms = statistics.median(t), seeds_here * flops / peak * 1e3
        rows.append({"size": size_name, "seeds": seeds_here, "arm": name,
                     "ms_per_step": round(ms, 3), "ms_min": round(min(t), 3),
                     "ratio": round(ms / one_ms, 2), "bound_ms": round(bound_ms, 4),
                     "bound_ratio": round(bound_ms / one_ms, 3),
                     "pct_of_peak": round(100 * bound_ms / ms, 1),
                     "flops_per_seed_step": int(flops), "peak_gflops": round(peak / 1e9, 1),
                     "steps": args.steps, "repeats": args.repeats,
                     "threads": torch.get_num_threads(), "device": args.device})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multiseed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--seeds", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--arms", default="stacked,vmap,sequential")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--append", action="store_true",
                        help="add the rows below those already in --out")
    args = parser.parse_args(argv)
    args.arms = args.arms.split(",")
    torch.set_num_threads(args.threads)
    peak = matmul_peak_flops(args.device)
    print(f"matmul peak (512^3 fp32, {args.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    rows = []
    for size_name in args.sizes.split(","):
        for n_seeds in [int(s) for s in args.seeds.split(",")]:
            for row in bench(size_name, n_seeds, args, peak):
                rows.append(row)
                print(f"{size_name:<6} S={n_seeds:<3} {row['arm']:<11} "
                      f"{row['ms_per_step']:8.3f} ms/step  x one seed {row['ratio']:5.2f}   "
                      f"bound {row['bound_ms']:7.3f} ms (x{row['bound_ratio']:.3f})  "
                      f"{row['pct_of_peak']:4.1f}% of peak", flush=True)
    write_csv(args.out, rows, append=args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
