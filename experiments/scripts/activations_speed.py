"""Relative training speed of the FFN activations, timed interleaved (experiments/activations.md).

    python -m experiments.scripts.activations_speed [--rounds 31] [--steps 5]
                                                    [--out experiments/activations_speed.csv]

``tlab compare-activations`` trains the activations one after another, so its ``rel_speed``
compares throughputs measured minutes apart; on a shared machine a burst of load from
elsewhere lands on whichever activation runs at the time. Here every activation's model (the
study's setting: tinyshakespeare characters, decoder, ``small``, batch 16 x 64 tokens, gated
FFNs at 2/3 d_ff) trains on the same pre-drawn batches in one process, one thread, and each
round times ``--steps`` optimiser steps of every activation in turn (the order rotates from
round to round). Per round relu's ms/step is divided by each activation's in the same round (> 1:
faster than relu); ``speed_vs_relu`` is the median of those per-round ratios (robust to a slow
round) with its distribution-free 95% interval (order statistics, ``median_interval``), and
``ms_per_step`` the median over rounds. Short rounds keep each ratio's two timings close in
time. ``speed_min_vs_relu``: the same ratio of the fastest rounds (least disturbed by load).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from experiments.scripts.interleaved_timing import time_variants, timing_arguments

ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "swish", "leaky_relu", "reglu", "geglu", "swiglu"]
SETTING = ["experiment=compare_activations", "task=text", "task.corpus=tinyshakespeare",
           "task.seq_len=64", "arch=decoder", "model.gated_match_params=true",
           "train.batch_size=16"]
OUT = Path(__file__).resolve().parents[1] / "activations_speed.csv"
COLUMNS = ["activation", "ffn_params", "ms_per_step", "ms_per_step_min", "tokens_per_s",
           "speed_vs_relu", "speed_vs_relu_low", "speed_vs_relu_high", "speed_min_vs_relu",
           "rounds", "steps_per_round", "threads", "torch"]


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics ``x_(k)``, ``x_(n+1-k)``
    with the largest k such that ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``."""
    from scipy.stats import binom

    ordered, n = sorted(values), len(values)
    k = int(binom.ppf((1 - confidence) / 2, n, 0.5))  # P(B <= k - 1) <= alpha / 2
    k = max(1, k if binom.cdf(k - 1, n, 0.5) <= (1 - confidence) / 2 else k - 1)
    return ordered[k - 1], ordered[n - k]


def main(argv: list[str] | None = None) -> None:
    args = timing_arguments(__doc__, rounds=31, steps=5, out=OUT, argv=argv)

    from benchmarks.common import write_csv

    times, trainers = time_variants(SETTING, {name: [f"ffn={name}"] for name in ACTIVATIONS},
                                    args.rounds, args.steps)
    rows = []
    for name in ACTIVATIONS:
        ratios = [r / a for r, a in zip(times["relu"], times[name], strict=True)]  # (rounds,)
        low, high = median_interval(ratios)
        median = statistics.median(times[name])
        ffn_params = sum(p.numel() for block in trainers[name].model.blocks
                         for p in block.feedforward.parameters())
        rows.append({
            "activation": name, "ffn_params": ffn_params, "ms_per_step": round(median, 3),
            "ms_per_step_min": round(min(times[name]), 3),
            "tokens_per_s": round(16 * 64 / (median / 1e3)),
            "speed_vs_relu": round(statistics.median(ratios), 3),
            "speed_vs_relu_low": round(low, 3), "speed_vs_relu_high": round(high, 3),
            "speed_min_vs_relu": round(min(times["relu"]) / min(times[name]), 3),
            "rounds": args.rounds, "steps_per_round": args.steps,
            "threads": torch.get_num_threads(), "torch": torch.__version__})
        print(f"{name:<11} {median:7.2f} ms/step  speed vs relu {rows[-1]['speed_vs_relu']:.3f}"
              f" (95% CI {rows[-1]['speed_vs_relu_low']:.3f}-"
              f"{rows[-1]['speed_vs_relu_high']:.3f}; fastest rounds "
              f"{rows[-1]['speed_min_vs_relu']:.3f})")
    write_csv(args.out, rows, COLUMNS)


if __name__ == "__main__":
    main()
