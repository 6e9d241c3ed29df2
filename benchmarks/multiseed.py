"""Milliseconds per training step of S seeds: one seed alone against the three engines of
``multiseed.fit_seeds`` (seed-stacked model, vmap, one after another), at S = 1, 2, 4, 8, 16.

    python -m benchmarks.multiseed [--sizes tiny,small] [--seeds 1,2,4,8,16] [--steps 60]
                                   [--repeats 3] [--threads 1] [--device cpu|cuda]
                                   [--arms stacked,stacked_all,vmap,sequential] [--compile]
                                   [--out FILE.csv] [--append]

Every arm trains tlab's model of ``peers.SIZES`` (tiny: d 8, 1 layer, 8 x 4 tokens; small: d 64,
2 layers, 64 x 16 tokens) on the reverse task with fresh batches from each seed's generator,
no evaluation until the last step: ``one_seed`` is ``Trainer.fit`` of seed 0, the others are
``fit_seeds(..., engine=arm)`` for seeds 0..S-1: ``stacked`` in the groups the engine picks
for the step (``seed_groups.group_size``: all seeds for ``tiny``, 4 for ``mid``, one at a time
for ``small`` on CPU), ``stacked_all`` all S seeds in one stacked model. ``--compile`` adds
``one_seed_compiled`` and ``stacked_compiled``: the same steps compiled as
``train.compile=true`` compiles them, from the first step (``compile_s``: the first call,
compile included). With one seed, ``stacked`` is ``Trainer.fit`` too (``fit_seeds`` trains a
single seed alone). The arms alternate ``--repeats`` times so that load changes hit them alike;
each row is the median.

``ms_per_step`` is the slope between a call of ``--steps`` steps and one of ``--steps / 6``:
what one more step costs, without a call's fixed cost (stacking the models, one ``Trainer``
per seed, the final evaluation of every seed), which is ``fixed_ms`` (per call). ``ratio`` =
an arm's ms/step over one seed's, measured beside it. ``cpu_ms_per_step`` / ``cpu_ratio``: the
same from this process's CPU time, which other processes on a shared machine disturb less
(with one thread, CPU time is wall time on an idle machine).

``bound_ms`` is the physical bound S x FLOPs / peak: FLOPs of one seed's step counted by
``FlopCounterMode`` (matmuls and attention, forward and backward; element-wise ops not
counted), the matmul peak measured in the same run (512^3 fp32 on any device: best of 20),
so ``bound_ratio`` = bound_ms / one seed's ms is the ratio a perfectly efficient S-seed step
would reach and ``pct_of_peak`` = bound_ms / ms how close an arm gets. Targets (issue 13):
tiny 8 seeds <= 1.5x one seed; small stacked never slower than one after another; with
train.compile=true the N-seed step >= 40% of the peak.
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


Arm = Callable[[int], None]  # runs that many training steps of the arm


def compiled_arms(cfg, task, seeds: list[int], names: list[str]) -> dict[str, Arm]:
    """``one_seed_compiled`` and ``stacked_compiled``: the same steps under ``torch.compile``
    as ``train.compile=true`` installs it where it pays (``compile.compile_step``: a single
    run's model and loss as one ``ModelLoss``, a stacked group's model), the stacked arm in the
    engine's groups (a group of one: the seed's own compiled ``Trainer``); on objects kept
    across calls so that the compile happens once, in the warm-up."""
    from transformer_lab.training.compile import ModelLoss, compile_step
    from transformer_lab.training.multiseed import build_seeded_models, train_together
    from transformer_lab.training.seed_engines import step_work
    from transformer_lab.training.seed_groups import StackedSeeds, group_size, seed_groups
    from transformer_lab.training.trainer import Trainer, sequence_loss

    device = str(cfg.train.device)

    def trainers_of(part: list[int]) -> tuple[list, list]:
        models = build_seeded_models(cfg, part)
        return models, [Trainer(m, task, cfg.train, cfg.model.d_model, s)
                        for m, s in zip(models, part, strict=True)]

    def compiled_single(seed: int) -> Arm:
        trainer = trainers_of([seed])[1][0]
        trainer._loss = compile_step(ModelLoss(trainer.model, sequence_loss), device)
        return lambda steps: trainer.fit(steps)

    def compiled_group(part: list[int]) -> Arm:
        models, trainers = trainers_of(part)
        runner = StackedSeeds(cfg, part, models, trainers, horizon=10**6)
        runner.trainer.forward = compile_step(runner.stacked, device)
        return lambda steps: train_together(
            runner, part, models, trainers, [trainers[0].step_count + steps] * len(part),
            None, None, None)

    arms: dict[str, Arm] = {"one_seed_compiled": compiled_single(0)}
    if len(seeds) > 1 and "stacked" in names:
        size = group_size(step_work(cfg, task), len(seeds), device)
        parts = [[seeds[k] for k in rows] for rows in seed_groups(len(seeds), size)]
        runs = [compiled_single(p[0]) if len(p) == 1 else compiled_group(p) for p in parts]
        arms["stacked_compiled"] = lambda steps: [run(steps) for run in runs]
    return arms


def make_arms(size_name: str, n_seeds: int, device: str, names: list[str],
              compiled: bool) -> tuple[dict[str, Arm], Callable[[], object]]:
    """arm -> a function running that many training steps of the arm (S seeds); and one
    seed's single step (for its FLOPs)."""
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
    arms: dict[str, Arm] = {"one_seed": lambda steps: one.fit(steps)}
    for name in names:
        if n_seeds == 1 and name != "stacked":
            continue  # one seed: every other arm is Trainer.fit, the one_seed arm
        models = build_seeded_models(cfg, seeds)
        engine, group = ("stacked", n_seeds) if name == "stacked_all" else (name, None)
        arms[name] = (lambda steps, engine=engine, group=group, models=models:
                      fit_seeds(cfg, seeds, steps, task=task, models=models, engine=engine,
                                group=group))
    if compiled:
        arms.update(compiled_arms(cfg, task, seeds, names))
    batch = task.train_batch(size.batch, torch.Generator().manual_seed(0)).to(device)
    flop_trainer = Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, size.d_model, 0)
    return arms, lambda: flop_trainer.train_step(batch)


def timed(run: Arm, steps: int, device: str) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds that ``run(steps)`` took."""
    synchronize(device)
    start, cpu = time.perf_counter(), time.process_time()
    run(steps)
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu


def slope(long: float, short: float, steps: int, short_steps: int) -> tuple[float, float]:
    """(ms per step, ms per call) from calls of ``steps`` and ``short_steps`` steps."""
    per_step = (long - short) / (steps - short_steps)
    return per_step * 1e3, (short - short_steps * per_step) * 1e3


def bench(size_name: str, n_seeds: int, args: argparse.Namespace, peak: float) -> list[dict]:
    arms, one_step = make_arms(size_name, n_seeds, args.device, args.arms, args.compile)
    flops = step_flops(one_step)
    quiet = contextlib.redirect_stdout(io.StringIO())  # fit_seeds' engine line, per call
    slopes: dict[str, list[float]] = {name: [] for name in arms}  # wall ms per step
    cpu: dict[str, list[float]] = {name: [] for name in arms}  # CPU ms per step
    fixed: dict[str, list[float]] = {name: [] for name in arms}  # wall ms per call
    compile_s: dict[str, float] = {}
    short = max(1, args.steps // 6)
    with quiet:
        for name, run in arms.items():  # warm-up (first-call allocations, lazy imports, compile)
            seconds, _ = timed(run, short, args.device)
            if name.endswith("_compiled"):
                compile_s[name] = seconds
        for _ in range(args.repeats):
            for name, run in arms.items():
                (long_s, long_cpu), (short_s, short_cpu) = (timed(run, args.steps, args.device),
                                                            timed(run, short, args.device))
                per_step, per_call = slope(long_s, short_s, args.steps, short)
                slopes[name].append(per_step)
                fixed[name].append(per_call)
                cpu[name].append(slope(long_cpu, short_cpu, args.steps, short)[0])
    one_ms, one_cpu = statistics.median(slopes["one_seed"]), statistics.median(cpu["one_seed"])
    rows = []
    for name, t in slopes.items():
        seeds_here = 1 if name.startswith("one_seed") else n_seeds
        ms, bound_ms = statistics.median(t), seeds_here * flops / peak * 1e3
        cpu_ms = statistics.median(cpu[name])
        rows.append({"size": size_name, "seeds": seeds_here, "arm": name,
                     "ms_per_step": round(ms, 3), "ms_min": round(min(t), 3),
                     "ratio": round(ms / one_ms, 2),
                     "cpu_ms_per_step": round(cpu_ms, 3),
                     "cpu_ratio": round(cpu_ms / one_cpu, 2),
                     "bound_ms": round(bound_ms, 4),
                     "bound_ratio": round(bound_ms / one_ms, 3),
                     "pct_of_peak": round(100 * bound_ms / ms, 1),
                     "fixed_ms": round(statistics.median(fixed[name]), 1),
                     "compile_s": round(compile_s[name], 1) if name in compile_s else "",
                     "flops_per_seed_step": int(flops), "peak_gflops": round(peak / 1e9, 1),
                     "steps": args.steps, "repeats": args.repeats,
                     "threads": torch.get_num_threads(), "device": args.device})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multiseed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--seeds", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--arms", default="stacked,stacked_all,vmap,sequential")
    parser.add_argument("--compile", action="store_true",
                        help="add one_seed_compiled and stacked_compiled (torch.compile)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--append", action="store_true",
                        help="add the rows below those already in --out")
    args = parser.parse_args(argv)
    if args.steps < 7:  # a step's time is the slope between calls of steps and steps // 6
        parser.error(f"--steps={args.steps} is too few; use 7 or more")
    args.arms = args.arms.split(",")
    torch.set_num_threads(args.threads)
    peak = matmul_peak_flops(args.device)
    print(f"matmul peak (512^3 fp32, {args.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    rows = []
    for size_name in args.sizes.split(","):
        for n_seeds in [int(s) for s in args.seeds.split(",")]:
            for row in bench(size_name, n_seeds, args, peak):
                rows.append(row)
                compiled = f"  compile {row['compile_s']} s" if row["compile_s"] != "" else ""
                print(f"{size_name:<6} S={n_seeds:<3} {row['arm']:<17} "
                      f"{row['ms_per_step']:8.3f} ms/step  x one seed {row['ratio']:5.2f} "
                      f"(CPU time x{row['cpu_ratio']:5.2f})  "
                      f"bound {row['bound_ms']:7.3f} ms (x{row['bound_ratio']:.3f})  "
                      f"{row['pct_of_peak']:4.1f}% of peak  fixed {row['fixed_ms']} ms"
                      f"{compiled}", flush=True)
    write_csv(args.out, rows, append=args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
