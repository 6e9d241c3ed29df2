"""``tlab validate``: the source article's four-step validation routine on one configuration;
step 4 may run in a forked process beside steps 1-3 (docs/routines.md)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import torch

from transformer_lab.config.schema import Rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import merged_block
from transformer_lab.errors import ConfigError, Diverged
from transformer_lab.processes import die_with_parent, flush_output, signal_name
from transformer_lab.results.check_rows import (
    CHECK_COLUMNS,
    CheckRow,
    Stopwatch,
    check_counts,
    check_table,
    share_wall,
)
from transformer_lab.results.console import console, print_table
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome, compare, reverse_task, smoke
from transformer_lab.routines.compare import comparison_checks
from transformer_lab.routines.reverse_task import REVERSE_COLUMNS, reversal_summary, reverse_rows
from transformer_lab.routines.smoke import (
    forward_backward_check,
    smoke_setup,
    smoke_training,
)
from transformer_lab.routines.study import SeedRun, study

# What to look at when a step fails (the rows' details say more).
STEP_HINTS = {
    1: "the model does not run or breaks a property (a future leak, positions that look alike, "
       "non-finite at max_len, train/eval or batch dependence, FFN gain, dtype or device): "
       "look at the component named in the failing check",
    2: "the loss does not fall: look at train.lr and the PE-to-embedding scale",
    3: "reversal fails: look at the positional encoding (does it use `positions`?)",
    4: "an activation does not train: look at the FFN (finite outputs, initialisation)",
}


def step_configs(spec: RunSpec) -> dict[str, RunSpec]:
    """The specs of steps 1-2 (``smoke``), 3 (``reverse_task``) and 4 (``compare``)."""
    return configs_and_notes(spec)[0]


def configs_and_notes(spec: RunSpec) -> tuple[dict[str, RunSpec], dict[str, str]]:
    """:func:`step_configs` and, for steps 1-2 and 4, :func:`at_step_size`'s note."""
    smoke_spec, smoke_note = at_step_size(spec, "smoke")
    compare_spec, compare_note = at_step_size(spec, "compare")
    return ({"smoke": smoke_spec, "reverse_task": spec, "compare": compare_spec},
            {"steps 1-2": smoke_note, "step 4": compare_note})


def at_step_size(spec: RunSpec, step: str) -> tuple[RunSpec, str]:
    """``spec`` with the block ``routine.<step>`` merged over it; where the run's components
    cannot be built at that size, the block without its ``model`` sizes and a note saying so
    ("" otherwise)."""
    from transformer_lab.config.architecture import check_architecture
    from transformer_lab.model import build_model

    small = merged_block(spec, f"routine.{step}")
    try:
        check_architecture(small.model)
        probe = small.with_vocab(small.model.vocab_size or 2)
        with torch.random.fork_rng(devices=[]):
            build_model(probe.model)  # (the vocabulary, unknown before the task is built: any)
        return small, ""
    except (ConfigError, ValueError) as exc:
        own = merged_block(spec, f"routine.{step}", without=("model",))
        m = spec.model
        return own, (f"at the run's own size (d_model {m.d_model}, {m.n_heads} heads, "
                     f"{m.n_layers} layers): at d_model {small.model.d_model}, "
                     f"{small.model.n_heads} heads, {exc}")


# The routine's own keys (``routines.check_settings``): its steps' keys where they sit in a
# validate config (steps 1-2 and 4 under routine.smoke / routine.compare, step 3 at the top).
SETTINGS = {"parallel": Rule("bool"), **reverse_task.SETTINGS,
            **{f"smoke.routine.{key}": rule for key, rule in smoke.SETTINGS.items()},
            **{f"compare.routine.{key}": rule for key, rule in compare.SETTINGS.items()}}
STEPS = ("routine.smoke.routine.steps (steps 1-2), routine.max_steps (step 3) and "
         "routine.compare.routine.steps (step 4)")  # (``routines.check_unread``)


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight checks of steps 3 and 4 (what ties their settings to the task)."""
    reverse_task.check_config(spec, inputs)
    # (the compare patch leaves the task as it is)
    compare.check_config(step_configs(spec)["compare"], inputs)


def smoke_steps(spec: RunSpec, run: RunDirectory) -> list[CheckRow]:
    """Steps 1 and 2 with the smoke routine's functions, on the merged smoke spec."""
    task, model, batches = smoke_setup(spec)
    spec = spec.with_vocab(task.vocab_size)
    rows = forward_backward_check(spec, model, batches[0])
    if any(not row.passed for row in rows):
        return rows
    try:
        log = TaggedLog(run.metrics, stage="smoke", variant="")  # several seeds: each row's own
        smoke_rows, _ = smoke_training(spec, model, task, log, batches)
    except Diverged as exc:
        smoke_rows = [CheckRow(2, "smoke_loss_falls", "FAIL", detail=f"diverged: {exc}")]
    return [*rows, *smoke_rows]


def reversal_step(spec: RunSpec, run: RunDirectory) -> tuple[list[CheckRow], dict]:
    try:
        rows, runs = reverse_task.reversal_runs(spec, run.metrics)
    except Diverged as exc:
        return [CheckRow(3, "reverse_exact_match", "FAIL", detail=f"diverged: {exc}")], {}
    run.write_table("reverse", reverse_rows(runs), REVERSE_COLUMNS)
    return rows, reversal_summary(runs)


def comparison_step(spec: RunSpec, run: RunDirectory) -> list[CheckRow]:
    """Step 4: compare's training, rows, verdicts (``routine.compare.routine.seeds=auto[:MAX]``:
    seeds until the sequential test decides, as ``tlab compare --seeds auto``) and plot."""
    return comparison_rows(spec, run, *train_comparison(spec, run))


def train_comparison(spec: RunSpec, run: RunDirectory) -> tuple[list[SeedRun] | str, Any, float]:
    """Step 4's training and ``loss_curves.png`` (in the second process when it runs beside):
    its runs and sequential test, or the divergence's text; and its wall time."""
    clock = Stopwatch()
    try:
        runs, test = compare.train_variants(spec, run)
    except Diverged as exc:
        return str(exc), None, clock.lap()
    compare.plot_loss_curves(runs, run.path / "loss_curves.png",
                             f"tlab validate step 4: pe={reverse_task.pe_label(spec)}, "
                             f"{reverse_task.arch_name(spec)}, {spec.routine.steps} steps")
    return runs, test, clock.lap()


def comparison_rows(spec: RunSpec, run: RunDirectory, runs: list[SeedRun] | str, test: Any,
                    wall_s: float) -> list[CheckRow]:
    """Step 4's rows and ``comparison.csv`` from its training; in this process, whose step 3
    has loaded what the verdicts need (in the second one it would lengthen step 4)."""
    clock = Stopwatch()
    if isinstance(runs, str):
        rows = [CheckRow(4, "activations_train", "FAIL", detail=f"diverged: {runs}")]
    else:
        rows = comparison_checks(compare.write_comparison(spec, run, runs, test))
    return share_wall(rows, wall_s + clock.lap())


def comparison_beside(spec: RunSpec, specs: dict[str, RunSpec] | None = None) -> bool:
    """Step 4 runs in a second process beside steps 1-3 (``routine.parallel``, default true)
    where that is safe and pays: Linux (``fork``), the CPU, one torch thread (``train.threads=1``,
    the default: a forked child hangs in OpenMP's thread pool once the parent has used it), two
    cores or more, and not a sweep job (its launcher shares the cores out)."""
    if not spec.routine.get("parallel", True) or not sys.platform.startswith("linux"):
        return False
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from transformer_lab.training.threads import available_cores

    for step in (specs or step_configs(spec)).values():
        if not step.train.device.startswith("cpu") or step.train.threads != 1:
            return False
    in_multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    return not in_multirun and torch.get_num_threads() == 1 and available_cores() >= 2


class StepFailed(Exception):
    """The step in the second process raised (its text), or the process died."""


class HeldRows(list):
    """The second process's metrics log: keeps its (already tagged) rows for the parent's
    ``metrics.csv``; no listeners, so no progress bar is drawn for it."""

    def write(self, row: Mapping[str, Any]) -> None:
        self.append(dict(row))


class StagedRun(RunDirectory):
    """The run directory as the second process sees it: tables and plots in a staging folder
    (moved into the run when collected, dropped when cancelled), metrics rows held."""

    def __init__(self, path: Path, cfg: Any) -> None:
        super().__init__(path, cfg)
        self.held = HeldRows()

    @property
    def metrics(self) -> HeldRows:  # type: ignore[override]
        return self.held


class StepBeside:
    """``step(staged_run)`` in a forked process on another core; ``collect`` its result into
    the run, or ``cancel`` it."""

    STAGING = ".step-beside"  # the step's folder in the run directory, until collected

    def __init__(self, step: Callable[[RunDirectory], Any], run: RunDirectory) -> None:
        self.staging = run.path / self.STAGING
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir()
        context = multiprocessing.get_context("fork")
        self._results, sender = context.Pipe(duplex=False)
        flush_output()
        self.process = context.Process(target=_run_step, daemon=True, args=(
            step, StagedRun(self.staging, run.cfg), sender, os.getpid()))
        self.process.start()
        sender.close()
        self.done = False

    def collect(self, run: RunDirectory, showing: AbstractContextManager) -> Any:
        """Wait for the step (inside ``showing``, e.g. a progress bar), move its files into
        ``run`` and write its metrics rows; its result, ``StepFailed`` (its error, or how the
        process died), or ``KeyboardInterrupt`` as it ended."""
        with showing:
            try:
                outcome, value, rows = self._results.recv()
            except EOFError:  # it died without a result
                outcome, value, rows = "died", None, []
            self.process.join()
        self.done = True
        if outcome != "ok":
            shutil.rmtree(self.staging, ignore_errors=True)
            if outcome == "interrupted":
                raise KeyboardInterrupt  # as if it had run in this process: exit 130
            code = self.process.exitcode or 0
            raise StepFailed(value or (f"its process was killed by {signal_name(-code)}"
                                       if code < 0 else f"its process exited with code {code}"))
        for name in sorted(os.listdir(self.staging)):
            os.replace(self.staging / name, run.path / name)
        shutil.rmtree(self.staging, ignore_errors=True)
        run.metrics.write_all(rows)
        return value

    def cancel(self) -> None:
        """Stop the step (if it was not collected) and drop its files."""
        if self.done:
            return
        self.done = True
        self.process.kill()
        self.process.join()
        shutil.rmtree(self.staging, ignore_errors=True)


def _run_step(step: Callable[[RunDirectory], Any], staged: StagedRun, results: Any,
              parent: int) -> None:
    """In the forked child: run ``step``, send (outcome, value, metrics rows) back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: die at once; the parent reports it
    if not die_with_parent(signal.SIGKILL, parent):
        return
    try:
        outcome, value = "ok", step(staged)
    except KeyboardInterrupt:
        outcome, value = "interrupted", None
    except BaseException as exc:  # noqa: BLE001 - reported by the parent as a FAIL row
        outcome, value = "error", f"{type(exc).__name__}: {exc}"
    results.send((outcome, value, list(staged.held)))


def collect_comparison(spec: RunSpec, beside: StepBeside,
                       run: RunDirectory) -> list[CheckRow]:
    """Step 4's rows from the second process (its files and metrics rows moved into ``run``),
    with a progress bar while it finishes; a step that raised or died is a FAIL of step 4."""
    plan, steps = study(spec), int(spec.routine.steps)
    count, activations = len(plan.seeds), plan.names
    seeds = f"{count} seed{'s' if count > 1 else ''}"
    bar = progress_bar(run.metrics, f"step 4 in a second process: {', '.join(activations)}, "
                       f"{'at most ' if plan.design else ''}{seeds}: {steps} steps",
                       total=steps * count * len(activations))
    try:
        trained = beside.collect(run, bar)
    except StepFailed as exc:
        return [CheckRow(4, "activations_train", "FAIL",
                         detail=f"step 4 did not finish: {exc}")]
    return comparison_rows(spec, run, *trained)


def _record(log: CsvLog, rows: list[CheckRow], wall_s: float | None = None) -> None:
    log.write_all(row.as_row() for row in share_wall(rows, wall_s))


def run_steps(specs: dict[str, RunSpec], run: RunDirectory,
              beside: StepBeside | None) -> tuple[list[CheckRow], dict]:
    """Steps 1-4 in order, each step's rows recorded in ``validation.csv`` as it ends; step 4
    from ``beside`` when it runs there. A failing step 1 skips the others."""
    clock, log = Stopwatch(), run.log("validation", CHECK_COLUMNS)
    step_rows = smoke_steps(specs["smoke"], run)  # a progress bar while it trains
    _record(log, step_rows, clock.lap())
    rows, summary = list(step_rows), {}
    if any(not row.passed for row in step_rows if row.step == 1):
        later = [CheckRow(step, "not_run", "SKIP", detail="step 1 failed") for step in (2, 3, 4)
                 if not any(row.step == step for row in step_rows)]
        _record(log, later)
        return rows + later, summary
    step_rows, summary = reversal_step(specs["reverse_task"], run)
    _record(log, step_rows, clock.lap())
    rows += step_rows
    step_rows = comparison_step(specs["compare"], run) if beside is None else \
        collect_comparison(specs["compare"], beside, run)
    _record(log, step_rows)  # (its rows carry their own wall time)
    return rows + step_rows, summary


def run_validate(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    total = Stopwatch()
    specs, notes = configs_and_notes(spec)
    for steps, note in notes.items():
        if note:
            console.print(f"{steps} run {note}", markup=False)
    beside = None
    if comparison_beside(spec, specs):
        beside = StepBeside(partial(train_comparison, specs["compare"]), run)
    try:
        rows, summary = run_steps(specs, run, beside)
    finally:
        if beside is not None:
            beside.cancel()  # not collected (step 1 failed, Ctrl-C, an error): stop it

    print_table(check_table(rows, f"tlab validate - {run.path}"))
    failed_steps = sorted({row.step for row in rows if not row.passed})
    for step in failed_steps:
        if step == 3 and reverse_task.pe_label(spec) == "none":
            console.print("[yellow]step 3 failed as expected[/]: pe=none is the control (an "
                          "encoder cannot reverse without a PE; a decoder may learn it from its "
                          "mask); run a PE to validate it")
            continue
        console.print(f"[bold red]step {step} failed[/]: {STEP_HINTS[step]}")
    message = "; ".join(f"step {row.step} {row.check}: {row.detail}"
                        for row in rows if not row.passed)
    return RoutineOutcome(passed=not failed_steps, summary={**summary, "wall_s": total.lap()},
                          message=message,
                          result=check_counts([row.status for row in rows]))
