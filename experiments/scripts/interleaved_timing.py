"""Interleaved step timing shared by the studies' speed scripts (activations, norm layers).

Timing variants one after another on a shared machine mixes their differences with the drift
of the machine's load; letting them take turns within each round, starting one later each round,
pairs every variant's round with the others' under the same load, so per-round ratios are fair.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import torch

from transformer_lab.training.trainer import Trainer


def timing_arguments(doc: str, rounds: int, steps: int, out: Path,
                     argv: list[str] | None) -> argparse.Namespace:
    """The speed scripts' command line: ``--rounds``, ``--steps`` (per variant per round),
    ``--out``."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=steps, help="steps per variant per round")
    parser.add_argument("--out", type=Path, default=out)
    return parser.parse_args(argv)


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


def build_trainer(overrides: list[str]) -> Trainer:
    """The Trainer (seed 0) of the task and model that ``overrides`` compose."""
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.config.spec import RunSpec
    from transformer_lab.model import build_model

    spec = RunSpec.of(compose(overrides))
    task = build_task(spec)  # its vocabulary is the model's, as in the pre-flight
    return Trainer(build_model(spec.with_vocab(task.vocab_size).model, seed=0), task,
                   spec.train, seed=0)


def time_variants(setting: list[str], variants: dict[Hashable, list[str]], rounds: int,
                  steps: int) -> tuple[dict[Hashable, list[float]], dict[Hashable, Trainer]]:
    """ms/step per round of every variant (``setting`` plus its overrides), and its Trainer.

    One thread (``train.threads: 1``, as in the tlab runs); every variant trains on the same
    8 pre-drawn batches of 16 from ``setting``'s task, warms up 10 steps, then ``time_rounds``.
    """
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task

    torch.set_num_threads(1)
    task = build_task(compose(setting))
    generator = torch.Generator().manual_seed(0)
    batches = [task.train_batch(16, generator) for _ in range(8)]
    trainers = {name: build_trainer([*setting, *overrides]) for name, overrides in variants.items()}
    runs = {name: step_runner(trainer, batches) for name, trainer in trainers.items()}
    for run in runs.values():  # warm-up
        run(10)
    return time_rounds(runs, rounds, steps), trainers
