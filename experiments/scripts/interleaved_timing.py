"""Interleaved step timing shared by the studies' speed scripts (activations, norm layers).

Timing variants one after another on a shared machine mixes their differences with the drift
of the machine's load; letting them take turns within each round, starting one later each round,
pairs every variant's round with the others' under the same load, so per-round ratios are fair.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from transformer_lab.training.trainer import Trainer


def step_runner(trainer: Trainer, batches: list) -> Callable[[int], None]:
    """``run(n)``: n training steps cycling over ``batches``, waiting for the last one."""

    def run(n: int) -> None:
        for i in range(n):
            loss, _grad_norm, _lr = trainer.train_step(batches[i % len(batches)])
        float(loss)  # wait for the last step

    return run


def time_rounds(runs: dict[Hashable, Callable[[int], None]], rounds: int,
                steps: int) -> dict[Hashable, list[float]]:
    """ms/step per round; the variants take turns within a round, starting one later each
    round."""
    names = list(runs)
    times: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runs[name](steps)
            times[name].append((time.perf_counter() - start) * 1e3 / steps)
    return times
