"""``tlab validate``: the source article's four-step validation routine on one configuration.

    step 1  the article's minimal model (4 tokens, d_model 8, one layer) runs forward and backward:
            output shape, finite loss, a finite gradient for every parameter, parameter count;
            and the component properties of ``measures/model_properties.py`` (causality,
            position injectivity, finiteness at max_len, batch independence, train/eval, ...)
    step 2  <= 10 optimiser steps on fixed batches: the loss must fall (else: learning rate,
            PE-to-embedding scale, dead gradients)
    step 3  4-token reversal to held-out exact match >= routine.target, beside a NoPE control
            (and, for a rotary PE, the relative-position property of its scores)
    step 4  the FFN activations of routine.compare compared over routine.compare.routine.steps
            steps and seeds (150 x 6 by default): each must train to a
            finite, falling loss; the numbers (speed, perplexity, gradient-norm spread) are a
            comparison, written to comparison.csv and loss_curves.png; with seeds, each
            activation's check detail ends with its verdict against the first, paired by seed

The pe, block, norm_layer, ffn and arch of the run are shared by every step; the sizes
and training settings of steps 1-2 and 4 are the run's config with ``routine.smoke`` /
``routine.compare`` merged over it (``configs/experiment/validate.yaml``). A failing step 1
stops the routine (the later steps would not mean anything); later failures do not, so the
table shows everything that is wrong. A diverging step is a FAIL of that step.

Step 4 does not depend on steps 1-3: where it can (``comparison_beside``: ``routine.parallel``,
Linux, CPU, one torch thread) it runs in a child process forked before step 1
(``background.py``), on the second core, and its rows, files and metrics rows join the run
after step 3 as if it had run there; step 3's NoPE control then trains after the chosen PE.

Writes ``validation.csv`` (``step, check, status, metric, value, threshold, wall_s, detail``;
one row per check, appended as each step ends so an interrupted run keeps the finished steps),
``reverse.csv``, ``comparison.csv``, ``compare_runs.csv``, ``loss_curves.png`` and every
training row in ``metrics.csv`` (``stage`` = smoke / reverse / compare).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable

from omegaconf import DictConfig, open_dict

from transformer_lab.errors import ConfigError, Diverged
from transformer_lab.results.check_rows import CHECK_COLUMNS, CheckRow, Stopwatch, check_table
from transformer_lab.results.console import console
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome, compare, reverse
from transformer_lab.routines.background import BackgroundStep, StepFailed
from transformer_lab.routines.compare import (
    COMPARISON_COLUMNS,
    comparison_checks,
    comparison_rows,
)
from transformer_lab.routines.reverse_results import REVERSE_COLUMNS, reversal_summary, reverse_rows
from transformer_lab.routines.smoke import forward_backward_check, smoke_setup, smoke_training
from transformer_lab.routines.variants import merged, seed_list, stage_log

# What to look at when a step fails (the rows' details say more).
STEP_HINTS = {
    1: "the model does not run or breaks a property (a future leak, positions that look alike, "
       "non-finite at max_len, train/eval or batch dependence, FFN gain, dtype or device): "
       "look at the component named in the failing check",
    2: "the loss does not fall: look at train.lr and the PE-to-embedding scale",
    3: "reversal fails: look at the positional encoding (does it use `positions`?)",
    4: "an activation does not train: look at the FFN (finite outputs, initialisation)",
}


def step_configs(cfg: DictConfig) -> dict[str, DictConfig]:
    """The configs of steps 1-2 (``smoke``), 3 (``reverse``) and 4 (``compare``)."""
    return {"smoke": merged(cfg, cfg.routine.smoke), "reverse": cfg,
            "compare": merged(cfg, cfg.routine.compare)}


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight checks of every step's settings (called by ``validate_config``)."""
    configs = step_configs(cfg)
    smoke = configs["smoke"].routine
    for key in ("steps", "n_batches", "batch_size"):
        value = smoke.get(key)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"routine.smoke.routine.{key}={value} is not valid; it must be "
                              "an integer >= 1")
    reverse.check_config(cfg, inputs)
    compare_cfg = configs["compare"]
    compare.check_config(compare_cfg, inputs)  # the compare patch leaves the task as it is


def smoke_steps(cfg: DictConfig, run: RunDirectory) -> list[CheckRow]:
    """Steps 1 and 2 with the smoke routine's functions, on the merged smoke config."""
    task, model, batches = smoke_setup(cfg)
    rows = forward_backward_check(cfg, model, batches[0])
    if any(not row.passed for row in rows):
        return rows
    try:
        smoke_rows, _ = smoke_training(cfg, model, task, stage_log(run.metrics, "smoke"),
                                       batches)
    except Diverged as exc:
        smoke_rows = [CheckRow(2, "smoke_loss_falls", "FAIL", detail=f"diverged: {exc}")]
    return [*rows, *smoke_rows]


def reversal_step(cfg: DictConfig, run: RunDirectory) -> tuple[list[CheckRow], dict]:
    try:
        rows, runs = reverse.reversal_runs(cfg, run.metrics)
    except Diverged as exc:
        return [CheckRow(3, "reverse_exact_match", "FAIL", detail=f"diverged: {exc}")], {}
    run.write_table("reverse", reverse_rows(runs), REVERSE_COLUMNS)
    return rows, reversal_summary(runs)


def comparison_step(cfg: DictConfig, run: RunDirectory) -> list[CheckRow]:
    try:
        runs = compare.compare_runs(cfg, run)
    except Diverged as exc:
        return [CheckRow(4, "activations_train", "FAIL", detail=f"diverged: {exc}")]
    rows = comparison_rows(runs, cfg.routine.get("loss_target"), cfg.routine.get("baseline"))
    run.write_table("comparison", rows, COMPARISON_COLUMNS)
    compare.plot_loss_curves(runs, run.path / "loss_curves.png",
                      f"tlab validate step 4: pe={reverse.pe_label(cfg)}, "
                      f"{reverse.arch_name(cfg)}, {cfg.routine.steps} steps")
    return comparison_checks(rows)


def comparison_beside(cfg: DictConfig) -> bool:
    """Step 4 runs in a child process beside steps 1-3 (``routine.parallel``, default true): on
    Linux, on the CPU, with 2+ cores, one torch thread (``train.threads=1``, the default: a
    forked child hangs in OpenMP's thread pool once the parent has used it), without
    ``train.compile`` (its compiler workers and kernels are not for a forked child) and not in
    a sweep job (its launcher shares the cores out). Its numbers are those of the sequential
    path."""
    if not cfg.routine.get("parallel", True) or not hasattr(os, "fork") \
            or not sys.platform.startswith("linux"):
        return False
    configs = step_configs(cfg)
    if any(not str(c.train.device).startswith("cpu") or c.train.get("threads") != 1
           or c.train.get("compile", False) for c in configs.values()):
        return False
    import torch

    from transformer_lab.config.hydra_adapter import in_multirun
    from transformer_lab.training.threads import available_cores

    return not in_multirun() and torch.get_num_threads() == 1 and available_cores() >= 2


def reverse_config(cfg: DictConfig, beside: bool) -> DictConfig:
    """Step 3's config; with step 4 beside it, the NoPE control trains after the chosen PE
    (``control_thread: auto`` -> false): the second core is step 4's; a third thread on two
    cores was no faster on a quiet machine and slower on a busy one (same numbers either way)."""
    if not beside or cfg.routine.get("control_thread", "auto") != "auto":
        return cfg
    variant = copy.deepcopy(cfg)
    with open_dict(variant):
        variant.routine.control_thread = False
    return variant


def comparison_child(cfg: DictConfig) -> Callable[[RunDirectory], list[CheckRow]]:
    """Step 4 as the child process runs it: its rows carry its own wall time."""
    def step(run: RunDirectory) -> list[CheckRow]:
        clock = Stopwatch()
        rows = comparison_step(cfg, run)
        _spread(rows, clock.lap())
        return rows
    return step


def collect_comparison(cfg: DictConfig, background: BackgroundStep,
                       run: RunDirectory) -> list[CheckRow]:
    """Step 4's rows from the child (its files and metrics rows moved into ``run``), with a
    progress bar while the parent waits for it; a child that raised or died is a FAIL of step
    4 with the reason."""
    routine = cfg.routine
    seeds, activations = len(seed_list(cfg)), compare.activation_list(cfg)
    bar = progress_bar(run.metrics, f"step 4 in a second process: {', '.join(activations)}, "
                       f"{seeds} seed{'s' if seeds > 1 else ''}: {routine.steps} steps",
                       total=int(routine.steps) * seeds * len(activations))
    try:
        return background.collect(run, bar)
    except StepFailed as exc:
        return [CheckRow(4, "activations_train", "FAIL",
                         detail=f"step 4 did not finish: {exc}")]


def _spread(rows: list[CheckRow], wall_s: float | None) -> None:
    """Share ``wall_s`` among ``rows`` unless a row has its own."""
    if wall_s is not None and rows and not any(row.wall_s for row in rows):
        for row in rows:
            row.wall_s = wall_s / len(rows)


def _record(log: CsvLog, rows: list[CheckRow], wall_s: float | None = None) -> None:
    _spread(rows, wall_s)
    log.write_all(row.as_row() for row in rows)


def skipped(step: int, reason: str) -> CheckRow:
    return CheckRow(step, "not_run", "SKIP", detail=reason)


def run_steps(configs: dict[str, DictConfig], run: RunDirectory,
              background: BackgroundStep | None) -> tuple[list[CheckRow], dict]:
    """Steps 1-4 in order, each step's rows recorded in ``validation.csv`` as it ends; step 4
    from ``background`` when it runs there. A failing step 1 skips the others."""
    clock, log = Stopwatch(), run.log("validation", CHECK_COLUMNS)
    step_rows = smoke_steps(configs["smoke"], run)  # a progress bar while it trains
    _record(log, step_rows, clock.lap())
    rows, summary = list(step_rows), {}
    if any(not row.passed for row in step_rows if row.step == 1):
        later = [skipped(step, "step 1 failed") for step in (2, 3, 4)
                 if not any(row.step == step for row in step_rows)]
        _record(log, later)
        return rows + later, summary
    step_rows, summary = reversal_step(reverse_config(configs["reverse"], background is not None),
                                       run)
    _record(log, step_rows, clock.lap())
    rows += step_rows
    if background is None:
        step_rows = comparison_step(configs["compare"], run)
        _record(log, step_rows, clock.lap())
    else:  # the child's rows carry its own wall time
        step_rows = collect_comparison(configs["compare"], background, run)
        _record(log, step_rows)
    return rows + step_rows, summary


def run_validate(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    total = Stopwatch()
    configs = step_configs(cfg)
    background = None
    if comparison_beside(cfg):  # forked before any progress bar's thread starts
        import pandas  # noqa: F401 - both need it (verdict columns): imported once, not twice

        background = BackgroundStep.start(comparison_child(configs["compare"]), run)
    try:
        rows, summary = run_steps(configs, run, background)
    finally:
        if background is not None:
            background.cancel()  # not collected (step 1 failed, Ctrl-C, an error): stop it

    console.print(check_table(rows, f"tlab validate - {run.path}"))
    failed_steps = sorted({row.step for row in rows if not row.passed})
    for step in failed_steps:
        if step == 3 and reverse.pe_label(cfg) == "none":
            console.print("[yellow]step 3 failed as expected[/]: pe=none is the control (an "
                          "encoder cannot reverse without a PE; a decoder may learn it from its "
                          "mask); run a PE to validate it")
            continue
        console.print(f"[bold red]step {step} failed[/]: {STEP_HINTS[step]}")
    passed = not failed_steps
    summary = {**summary, "wall_s": total.lap()}
    message = "; ".join(f"step {row.step} {row.check}: {row.detail}"
                        for row in rows if not row.passed)
    return RoutineOutcome(passed=passed, summary=summary, message=message)
