"""ms per training step of S seeds: one model, S models one after another, the seed-stacked
model (``transformer_lab.training.seed_stack``) and the vmap path (``multiseed``).

    python -m benchmarks.seed_stack_prototype [--sizes tiny,small] [--seeds 1,2,4,8,16]
                                              [--steps 20] [--repeats 3] [--no-vmap]
                                              [--out FILE.csv]

A step is forward, backward, gradient clipping and AdamW (batches are made beforehand, a few
per seed, cycled). One thread (``torch.set_num_threads(1)``). ``ratio`` is an arm's ms/step
over one seed's (``one_seed``, a single ``Trainer.train_step``, timed beside the others at
each S); ``bound_ms`` is the physical
bound S x FLOPs / peak, with FLOPs of one seed's step counted by ``FlopCounterMode`` (matmuls
and attention, forward and backward) and the matmul peak measured in the same run (512^3
fp32), so ``bound_ratio`` = bound_ms / one seed's ms is the ratio a perfectly efficient S-seed
step would reach. Sizes as ``benchmarks/peers.py`` (tiny: d 8, 1 layer, 8 x 4 tokens; small:
d 64, 2 layers, 64 x 16 tokens), tlab's model with a learned PE, pre-LN, GELU.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def matmul_peak_flops(n: int = 512, repeats: int = 20) -> float:
    """FLOP/s of an n^3 fp32 matmul on this thread (best of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_flops(step: Callable[[], object]) -> float:
    """FLOPs of one call of ``step`` (matmuls, SDPA; element-wise ops are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def ms_per_step(step: Callable[[], object], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def _import(*names: str):
    """The first of ``names`` that imports (module paths before and after the re-layout)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names[-1])


def make_arms(size_name: str, n_seeds: int, with_vmap: bool) -> tuple[dict, Callable]:
    """name -> one step of that arm, for ``n_seeds`` seeds; and one seed's step (for FLOPs)."""
    from benchmarks.peers import SIZES, tlab_overrides
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.model import build_model
    from transformer_lab.training.seed_stack import SeedStackedTrainer, stack_models

    trainer_module = _import("transformer_lab.training.trainer", "transformer_lab.train")
    size = SIZES[size_name]
    cfg = compose([*tlab_overrides(size, "cpu", "fp32"), "train.eval_every=0"])
    task = build_task(cfg)
    seeds = list(range(n_seeds))
    pools = {s: [task.train_batch(size.batch, torch.Generator().manual_seed(100 * s + i))
                 for i in range(4)] for s in seeds}
    counter = {"i": 0}

    def batches() -> list:
        counter["i"] += 1
        return [pools[s][counter["i"] % 4] for s in seeds]

    def models() -> list:
        out = []
        for s in seeds:
            torch.manual_seed(s)
            out.append(build_model(cfg))
        return out

    def trainer(model, seed):
        return trainer_module.Trainer(model, task, cfg.train, size.d_model, seed)

    single = trainer(models()[0], 0)
    sequential = [trainer(m, s) for s, m in zip(seeds, models(), strict=True)]
    stacked = SeedStackedTrainer(stack_models(models()), cfg.train, size.d_model, seeds, task)
    arms = {
        "one_seed": lambda: single.train_step(batches()[0]),
        "sequential": lambda: [t.train_step(b) for t, b in zip(sequential, batches(),
                                                                strict=True)],
        "stacked": lambda: stacked.train_step(batches()),
    }
    if with_vmap and n_seeds > 1:
        multiseed = _import("transformer_lab.training.multiseed", "transformer_lab.multiseed")
        vmap_models = models()
        vmap_trainers = [trainer(m, s) for s, m in zip(seeds, vmap_models, strict=True)]
        run = multiseed._VectorisedRun(cfg, seeds, vmap_models, vmap_trainers, None, 10**6)
        arms["vmap"] = lambda: run.step(batches())
    flop_trainer = trainer(models()[0], 0)
    return arms, lambda: flop_trainer.train_step(batches()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seed_stack_prototype",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--seeds", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-vmap", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    peak = matmul_peak_flops()
    print(f"matmul peak (512^3 fp32, 1 thread): {peak / 1e9:.1f} GFLOP/s")
    rows = []
    for size_name in args.sizes.split(","):
        for n_seeds in [int(s) for s in args.seeds.split(",")]:
            arms, one_step = make_arms(size_name, n_seeds, not args.no_vmap)
            flops = step_flops(one_step)
            for step in arms.values():  # warm-up
                ms_per_step(step, 5)
            times: dict[str, list[float]] = {name: [] for name in arms}
            for _ in range(args.repeats):  # arms alternate, so load changes hit them alike
                for name, step in arms.items():
                    times[name].append(ms_per_step(step, args.steps))
            one_ms = statistics.median(times["one_seed"])  # measured beside the others
            for name, t in times.items():
                seeds_here = 1 if name == "one_seed" else n_seeds
                ms, bound_ms = statistics.median(t), seeds_here * flops / peak * 1e3
                row = {"size": size_name, "seeds": seeds_here, "arm": name,
                       "ms_per_step": round(ms, 3), "ratio": round(ms / one_ms, 2),
                       "bound_ms": round(bound_ms, 4), "bound_ratio": round(bound_ms / one_ms, 3),
                       "pct_of_peak": round(100 * bound_ms / ms, 1),
                       "flops_per_seed_step": int(flops)}
                rows.append(row)
                print(f"{size_name:<6} S={n_seeds:<3} {name:<11} {ms:8.3f} ms/step  "
                      f"x one seed {row['ratio']:5.2f}   bound {bound_ms:7.3f} ms "
                      f"(x{bound_ms / one_ms:.3f})  {100 * bound_ms / ms:4.1f}% of peak")
    if args.out is not None:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
