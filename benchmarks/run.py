"""Training-step benchmark: tlab against ``nn.TransformerEncoder`` and x-transformers.

    python -m benchmarks.run [--sizes tiny,small,medium] [--rounds 7] [--steps-scale 1]
                             [--compile] [--device cpu|cuda] [--precision fp32|bf16]
                             [--threads N] [--no-x-transformers] [--out benchmarks/results.csv]

For each size (see ``peers.SIZES``; on CUDA the default adds the GPU-sized ``gpu384``, 384
wide x 6 layers at 256 tokens x 64, and ``gpt2small``, 768 x 12 at 1024 x 16; on the CPU they run
when named in ``--sizes``) every contender trains the same network on the same
pre-drawn batches of the reverse task, in one process. After a warm-up, ``--rounds`` rounds
each time ``steps`` optimiser steps of every contender in turn (interleaved, so a burst of
load from elsewhere hits all of them alike); ms/step is the median over rounds (the minimum is
kept too). Reported per row:

    tokens_per_s   = B * T / (ms_per_step / 1000)
    tlab_ratio     = tokens_per_s(tlab) / tokens_per_s(this row)   (> 1: tlab is faster)
    flop_per_s     = tokens_per_s * (6 N + 12 L T d)   (N: non-embedding parameters; forward +
                     backward, Kaplan et al. 2020, arXiv 2001.08361)
    frac_of_peak   = flop_per_s / the fp32 (or bf16) matmul peak measured in the same run (an
                     n x n matmul, n = 1024 on CPU, the best of several tries before each size)

The ``tlab+data`` row is tlab's step plus drawing a fresh batch from the task each step, as
``Trainer.fit`` does. With ``--compile`` every model goes through ``torch.compile`` (tlab's
through ``train.compile=true``, as ``tlab train`` compiles) and the compile time (first step
minus a normal step) is reported in ``compile_s``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import write_csv
from benchmarks.peers import (
    GPU_SIZES,
    SIZES,
    BenchSize,
    Contender,
    build_tlab,
    build_torch,
    build_x_transformers,
)
from transformer_lab.training.throughput import measured_matmul_peak
from transformer_lab.training.trainer import count_parameters

RESULTS = Path(__file__).resolve().parent / "results.csv"
COLUMNS = ["size", "impl", "d_model", "n_heads", "n_layers", "d_ff", "seq_len", "batch",
           "params", "non_embedding_params", "ms_per_step", "ms_per_step_min", "tokens_per_s",
           "tlab_ratio", "flop_per_token", "flop_per_s", "matmul_peak_flop_per_s",
           "frac_of_peak", "compile_s", "rounds", "steps_per_round", "device", "precision",
           "threads", "torch"]
STEPS_PER_ROUND = {"tiny": 100, "mid": 20, "small": 20, "medium": 3, "gpu384": 10,
                   "gpt2small": 5}
WARMUP_STEPS = {"tiny": 30, "mid": 10, "small": 10, "medium": 3, "gpu384": 5, "gpt2small": 3}
CPU_SIZES = "tiny,small,medium"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None,
                repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul (2 n^3 FLOPs) over ``repeats`` tries."""
    return measured_matmul_peak(device, dtype, n or (8192 if device.type == "cuda" else 1024),
                                repeats)


def flop_per_token(size: BenchSize, non_embedding: int) -> int:
    """6N + 12 L T d: weight matmuls and attention scores, forward and backward."""
    return 6 * non_embedding + 12 * size.n_layers * size.seq_len * size.d_model


def time_rounds(steps: dict[str, Callable[[int], None]], rounds: int, steps_per_round: int,
                device: torch.device) -> dict[str, list[float]]:
    """ms/step of each contender per round, contenders interleaved within a round."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, run in steps.items():
            synchronize(device)
            start = time.perf_counter()
            run(steps_per_round)
            synchronize(device)
            times[name].append((time.perf_counter() - start) * 1e3 / steps_per_round)
    return times


def bench_size(size: BenchSize, args: argparse.Namespace) -> list[dict]:
    """One size's rows; ``main`` fills in the peak columns (the best peak of the whole run)."""
    device = torch.device(args.device)
    autocast = torch.bfloat16 if args.precision == "bf16" else None
    torch.manual_seed(0)
    contenders: list[Contender] = []
    tlab, task = build_tlab(size, device, args.precision, args.compile)
    contenders.append(tlab)
    contenders.append(build_torch(size, device, autocast, args.compile))
    if not args.no_x_transformers:
        try:
            contenders.append(build_x_transformers(size, device, autocast, args.compile))
        except ImportError:
            print("x-transformers is not installed (pip install x-transformers, the 'bench' "
                  "extra): skipping it", file=sys.stderr)
    generator = torch.Generator().manual_seed(0)
    batches = [task.train_batch(size.batch, generator).to(device) for _ in range(8)]

    def runner(step: Callable) -> Callable[[int], None]:
        def run(n: int) -> None:
            for i in range(n):
                batch = batches[i % len(batches)]
                step(batch.inputs, batch.targets)
        return run

    def tlab_with_data(n: int) -> None:
        for _ in range(n):
            batch = task.train_batch(size.batch, generator).to(device)
            tlab.step(batch.inputs, batch.targets)

    runs = {c.name: runner(c.step) for c in contenders}
    runs["tlab+data"] = tlab_with_data
    compile_s: dict[str, float | None] = {}
    for name, run in runs.items():  # warm-up; the first step includes compilation
        synchronize(device)
        start = time.perf_counter()
        run(1)
        synchronize(device)
        first = time.perf_counter() - start
        start = time.perf_counter()
        run(WARMUP_STEPS[size.name])
        synchronize(device)
        typical = (time.perf_counter() - start) / WARMUP_STEPS[size.name]
        compile_s[name] = max(0.0, first - typical) if args.compile else None
    per_round = max(1, int(STEPS_PER_ROUND[size.name] * args.steps_scale))
    times = time_rounds(runs, args.rounds, per_round, device)

    tokens = size.batch * size.seq_len
    medians = {name: statistics.median(t) for name, t in times.items()}
    rows = []
    for name in runs:
        contender = next((c for c in contenders if c.name == name), tlab)
        flops_token = flop_per_token(size, contender.non_embedding_params)
        tokens_per_s = tokens / (medians[name] / 1e3)
        rows.append({
            "size": size.name, "impl": name, "d_model": size.d_model, "n_heads": size.n_heads,
            "n_layers": size.n_layers, "d_ff": size.d_ff, "seq_len": size.seq_len,
            "batch": size.batch,
            "params": count_parameters(contender.model),
            "non_embedding_params": contender.non_embedding_params,
            "ms_per_step": round(medians[name], 4), "ms_per_step_min": round(min(times[name]), 4),
            "tokens_per_s": round(tokens_per_s, 1),
            "tlab_ratio": round(medians[name] / medians["tlab"], 3),
            "flop_per_token": flops_token, "flop_per_s": f"{tokens_per_s * flops_token:.4g}",
            "compile_s": None if compile_s[name] is None else round(compile_s[name], 2),
            "rounds": args.rounds, "steps_per_round": per_round, "device": args.device,
            "precision": args.precision, "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        })
    return rows


def print_table(rows: list[dict]) -> None:
    header = (f"{'size':<7}{'impl':<16}{'ms/step':>10}{'min':>9}{'tokens/s':>12}"
              f"{'tlab x':>8}{'GFLOP/s':>9}{'%peak':>7}{'compile_s':>10}")
    print(header)
    print("-" * len(header))
    for r in rows:
        compile_s = "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        print(f"{r['size']:<7}{r['impl']:<16}{r['ms_per_step']:>10.3f}{r['ms_per_step_min']:>9.3f}"
              f"{r['tokens_per_s']:>12.0f}{r['tlab_ratio']:>8.2f}"
              f"{float(r['flop_per_s']) / 1e9:>9.2f}{100 * r['frac_of_peak']:>7.1f}"
              f"{compile_s:>10}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated subset of {', '.join(SIZES)} (default: "
                        f"{CPU_SIZES}, and {','.join(GPU_SIZES)} on cuda)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (median over them)")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply the steps per round (tiny 100, small 20, medium 3)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: autocast for every contender")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--no-x-transformers", action="store_true", help="skip x-transformers")
    parser.add_argument("--out", type=Path, default=RESULTS, help="CSV to write")
    args = parser.parse_args(argv)
    if args.sizes is None:
        gpu = args.device.startswith("cuda")
        args.sizes = CPU_SIZES + ("," + ",".join(GPU_SIZES) if gpu else "")
    unknown = [s for s in args.sizes.split(",") if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: {', '.join(unknown)} not known; valid: {', '.join(SIZES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device; use cpu")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser.error(f"--device {args.device} is not valid; use cpu or cuda")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    print(f"device {args.device} ({platform.processor() or platform.machine()}), "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    rows, peak = [], 0.0
    for name in args.sizes.split(","):
        peak = max(peak, matmul_peak(device, dtype))  # best seen: less hurt by passing load
        rows += bench_size(SIZES[name], args)
    for row in rows:  # every row against the best peak of the whole run
        row["frac_of_peak"] = round(float(row["flop_per_s"]) / peak, 4)
        row["matmul_peak_flop_per_s"] = f"{peak:.4g}"
    print(f"best {args.precision} matmul peak over the run: {peak / 1e9:.1f} GFLOP/s")
    print_table(rows)
    write_csv(args.out, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
