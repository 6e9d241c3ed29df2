"""What the live progress bar costs a training run (issue 15: at most 2%).

Trains the same tiny reversal model (``experiment=reverse_task``'s tiny config, 1 thread, log_every
10) with its metrics rows going to a ``CsvLog`` alone, and to a ``CsvLog`` that also feeds a
``RunProgress`` drawing to a terminal console (forced on, output to /dev/null). Runs alternate
(ABAB...) so that load from other processes hits both alike; prints the median wall time of each
and the relative difference.

    .venv/bin/python -m benchmarks.progress_overhead [--repeats 7] [--steps 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.results.progress import REFRESH_PER_SECOND, RunProgress, progress_bar
from transformer_lab.results.run_directory import METRIC_COLUMNS, CsvLog
from transformer_lab.training.trainer import Trainer


def drawn_progress() -> RunProgress:
    """A ``RunProgress`` that draws as on a terminal, to /dev/null."""
    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=160)  # noqa: SIM115
    return RunProgress(enabled=True, console=console)


def one_run(spec: RunSpec, steps: int, with_bar: bool, folder: Path) -> float:
    """Wall seconds of ``Trainer.fit(steps)``, with or without a drawn progress bar."""
    listeners = [drawn_progress().on_row] if with_bar else []
    log = CsvLog(folder / f"metrics-{time.perf_counter_ns()}.csv", METRIC_COLUMNS, listeners)
    task = build_task(spec)
    model = build_model(spec.with_vocab(task.vocab_size).model, seed=0)
    trainer = Trainer(model, task, spec.train, 0, log)
    started = time.perf_counter()
    with progress_bar(log, "benchmark", total=steps):
        trainer.fit(steps)
    wall = time.perf_counter() - started
    log.close()
    return wall


def row_cost(calls: int = 20000) -> float:
    """Seconds per metrics row that ``RunProgress.on_row`` adds while a bar is drawn (robust to
    machine load, unlike the wall-time comparison)."""
    progress = drawn_progress()
    row = {"step": 1, "split": "train", "loss": 1.0, "lr": 1e-3, "grad_norm": 1.0,
           "tokens_per_s": 1e4, "stage": "reverse", "variant": "rope", "seed": 0}
    with progress.phase("cost", total=calls):
        started = time.perf_counter()
        for step in range(1, calls + 1):
            row["step"] = step
            progress.on_row(row)
        return (time.perf_counter() - started) / calls


def redraw_cost(redraws: int = 300) -> float:
    """Seconds of one redraw of the bar (rich redraws ``REFRESH_PER_SECOND`` times a second on
    its own thread, holding the GIL meanwhile)."""
    progress = drawn_progress()
    with progress.phase("cost", total=100):
        started = time.perf_counter()
        for _ in range(redraws):
            progress._progress.refresh()
        return (time.perf_counter() - started) / redraws


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = RunSpec.of(compose(["experiment=reverse_task", "train.eval_every=0",
                               "train.log_every=10"]))
    walls: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        one_run(spec, 50, True, Path(tmp))  # warm-up
        for _ in range(args.repeats):
            for with_bar in (False, True):
                walls[with_bar].append(one_run(spec, args.steps, with_bar, Path(tmp)))
    plain, bar = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"{args.steps} steps, median of {args.repeats}: CSV only {plain:.3f} s, "
          f"CSV + progress bar {bar:.3f} s, difference {100 * (bar / plain - 1):+.2f}%")
    per_row, log_every = row_cost(), spec.train.log_every
    print(f"on_row: {1e6 * per_row:.1f} us per metrics row (one row every {log_every} steps) = "
          f"{100 * per_row / log_every / (plain / args.steps):.3f}% of a "
          f"{1e3 * plain / args.steps:.2f} ms step")
    redraw = redraw_cost()
    print(f"redraw: {1e3 * redraw:.2f} ms x {REFRESH_PER_SECOND}/s = "
          f"{100 * redraw * REFRESH_PER_SECOND:.2f}% of one core")
    print("all runs (s): csv", [round(w, 3) for w in walls[False]], "bar",
          [round(w, 3) for w in walls[True]])


if __name__ == "__main__":
    main()
