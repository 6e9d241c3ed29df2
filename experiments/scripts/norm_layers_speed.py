"""Training speed of LayerNorm, RMSNorm and BatchNorm at pre- and post-LN, timed interleaved
(experiments/norm_layers.md).

    python -m experiments.scripts.norm_layers_speed [--rounds 7] [--steps 20]
                                                    [--out experiments/norm_layers_speed.csv]

The sweep's ``tokens_per_s`` compares runs trained seconds to minutes apart; on a shared machine
a burst of load from elsewhere lands on whichever run is going at the time. Here every
variant's model (the study's setting: tinyshakespeare characters, decoder, ``small``, GELU,
batch 16 x 64 tokens) trains on the same pre-drawn batches in one process, one thread, and each
round times ``--steps`` optimiser steps of every variant in turn (the order rotates from round
to round). Per round the ms/step of each variant is divided by layernorm's at the same
placement in the same round; the speed ratio is the median of those per-round ratios (with the
95% CI of their mean), ``ms_per_step`` the median over rounds.

One extra variant, ``rmsnorm_fused``, swaps tlab's RMSNorm (``components/norms.py``: five
elementwise and reduction ops in Python) for ``torch.nn.RMSNorm`` (one fused kernel where torch
has it): the same function, so any speed difference between the two is the implementation's.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from experiments.scripts.interleaved_timing import time_variants, timing_arguments

SETTING = ["experiment=compare_activations", "ffn=gelu", "task=text",
           "task.corpus=tinyshakespeare", "task.seq_len=64", "arch=decoder",
           "train.batch_size=16"]
NORMS = {"layernorm": ["norm_layer=layernorm"], "rmsnorm": ["norm_layer=rmsnorm"],
         "batchnorm": ["norm_layer=batchnorm"],
         "rmsnorm_fused": ["norm_layer=rmsnorm", "norm_layer._target_=torch.nn.RMSNorm"]}
BLOCKS = ["pre", "post"]
OUT = Path(__file__).resolve().parents[1] / "norm_layers_speed.csv"
COLUMNS = ["block", "norm_layer", "ms_per_step", "ms_per_step_min", "tokens_per_s",
           "speed_vs_layernorm", "speed_vs_layernorm_low", "speed_vs_layernorm_high", "rounds",
           "steps_per_round", "threads", "torch"]


def main(argv: list[str] | None = None) -> None:
    args = timing_arguments(__doc__, rounds=7, steps=20, out=OUT, argv=argv)

    from benchmarks.common import write_csv
    from transformer_lab.measures.statistics import mean_interval

    variants = {(block, norm): [f"block={block}", *overrides]
                for block in BLOCKS for norm, overrides in NORMS.items()}
    times, _ = time_variants(SETTING, variants, args.rounds, args.steps)
    rows = []
    for block, norm in variants:
        base = times[(block, "layernorm")]
        ratios = [b / t for b, t in zip(base, times[(block, norm)], strict=True)]  # (rounds,)
        interval = mean_interval(ratios)
        median = statistics.median(times[(block, norm)])
        same = norm == "layernorm"
        rows.append({
            "block": block, "norm_layer": norm, "ms_per_step": round(median, 3),
            "ms_per_step_min": round(min(times[(block, norm)]), 3),
            "tokens_per_s": round(16 * 64 / (median / 1e3)),
            "speed_vs_layernorm": round(statistics.median(ratios), 3),
            "speed_vs_layernorm_low": 1.0 if same else round(interval.low, 3),
            "speed_vs_layernorm_high": 1.0 if same else round(interval.high, 3),
            "rounds": args.rounds, "steps_per_round": args.steps,
            "threads": torch.get_num_threads(), "torch": torch.__version__})
        row = rows[-1]
        print(f"{block:<4} {norm:<13} {median:7.2f} ms/step  speed vs layernorm "
              f"{row['speed_vs_layernorm']:.3f} (95% CI of the mean ratio "
              f"{row['speed_vs_layernorm_low']:.3f}-{row['speed_vs_layernorm_high']:.3f})")
    write_csv(args.out, rows, COLUMNS)


if __name__ == "__main__":
    main()
