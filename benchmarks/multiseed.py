"""Wall time of N seeds trained as one vectorised model against one seed alone.

    python -m benchmarks.multiseed [--size small] [--seeds 4] [--steps 30] [--repeats 3]
                                   [--seq-len T] [--batch B] [--threads N]
                                   [--device cpu|cuda] [--precision fp32|bf16]
                                   [--out benchmarks/multiseed.csv] [--append]

Both arms train the benchmark's network (``peers.SIZES``, tlab's model, reverse task, fresh
batches from each seed's generator, no evaluation until the end) for ``--steps`` steps:
``one_seed`` is ``Trainer.fit`` for seed 0, ``vectorised`` is ``multiseed.fit_seeds`` for seeds
0..N-1 forced to batch them (``vectorise=True``; its auto choice would run ``small`` one seed
after another), ``sequential`` is ``fit_seeds`` with ``vectorise=False`` (N ``Trainer.fit``
runs one after another). The arms alternate,
``--repeats`` times; the median wall time of each is reported with ``ratio_vs_one_seed``
(target: <= 1.6 for N = 4 at ``small``). The committed ``multiseed.csv`` gathers (``--append``)
the CPU runs the README quotes (``small``; ``--batch 16``; ``--size tiny --batch 64``;
``--threads 2``) and ``multiseed_cuda.csv`` those of the H200 (``--device cuda [--precision
bf16] --steps 100 --repeats 5``; bf16 seeds are no longer batched, see ``vectorisable``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_csv
from benchmarks.peers import SIZES, tlab_overrides

OUT = Path(__file__).resolve().parent / "multiseed.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multiseed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=list(SIZES))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=None, help="override the size's T")
    parser.add_argument("--batch", type=int, default=None, help="override the size's B")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--append", action="store_true",
                        help="add the rows below those already in --out")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.model import build_model
    from transformer_lab.training.multiseed import fit_seeds
    from transformer_lab.training.trainer import Trainer

    size = dataclasses.replace(SIZES[args.size], seq_len=args.seq_len or SIZES[args.size].seq_len,
                               batch=args.batch or SIZES[args.size].batch)
    cfg = compose([*tlab_overrides(size, args.device, args.precision), "train.log_every=10",
                   "train.eval_every=0", "task.eval_size=64"])
    task = build_task(cfg)
    seeds = list(range(args.seeds))

    def single(seed: int) -> None:
        torch.manual_seed(seed)
        Trainer(build_model(cfg), task, cfg.train, size.d_model, seed).fit(args.steps)

    arms = {
        "one_seed": lambda: single(0),
        "vectorised": lambda: fit_seeds(cfg, seeds, args.steps, task=task, vectorise=True),
        "sequential": lambda: fit_seeds(cfg, seeds, args.steps, task=task, vectorise=False),
    }
    for run in arms.values():  # warm-up (first-call allocations, lazy imports)
        run()
    walls: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, run in arms.items():
            start = time.perf_counter()
            run()
            walls[name].append(time.perf_counter() - start)
    one = statistics.median(walls["one_seed"])
    rows = [{"size": size.name, "seq_len": size.seq_len, "batch": size.batch, "arm": name,
             "seeds": 1 if name == "one_seed" else args.seeds,
             "steps": args.steps, "wall_s": round(statistics.median(w), 4),
             "wall_s_min": round(min(w), 4),
             "ratio_vs_one_seed": round(statistics.median(w) / one, 3),
             "threads": torch.get_num_threads(), "device": args.device,
             "precision": args.precision} for name, w in walls.items()]
    for row in rows:
        print(f"{row['arm']:<12} seeds={row['seeds']:<3} wall {row['wall_s']:8.3f} s "
              f"(min {row['wall_s_min']:.3f})  x one seed: {row['ratio_vs_one_seed']:.2f}")
    write_csv(args.out, rows, append=args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
