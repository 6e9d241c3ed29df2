"""Live progress of training: one ``rich`` bar per training phase, fed by the metrics rows.

Every training loop already writes a metrics row every ``train.log_every`` steps (and a held-out
row every ``train.eval_every``) into the run's ``metrics.csv``; ``RunProgress`` listens to those
rows (``CsvLog.listeners``), so the loops need no hook of their own and the bar costs one dict
update per logged row (``benchmarks/progress_overhead.py``). A routine wraps a training phase
in ``progress_bar(log, label, total)`` (where it used to show a spinner)::

    with progress_bar(run.metrics, "reversal: pe=rope", total=2 * max_steps):
        trainer.fit(...)  # rows written to run.metrics (or a TaggedLog of it) move the bar

The bar shows steps done / total, the latest training loss, the latest held-out exact match
(where the task has one), tokens/s and the time left. Rows of several models (tagged ``seed``,
``variant``, ...) each count their own steps. Nothing is drawn when stdout is not a terminal or
with ``--quiet`` (``logger.progress=false``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from rich.console import Console
from rich.errors import LiveError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Row keys that are measurements; any other key (seed, variant, stage, ...) names a series.
MEASURE_KEYS = frozenset({"step", "split", "loss", "accuracy", "exact_match", "lr", "grad_norm",
                          "tokens_per_s", "elapsed_s"})
REFRESH_PER_SECOND = 2  # rich redraws on its own thread; fewer redraws, less CPU taken


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class _Phase:
    """Steps per series of one training phase, and the latest numbers to show."""

    def __init__(self) -> None:
        self.steps: dict[tuple, int] = {}
        self.fields = {"loss": "", "match": "", "speed": ""}

    def update(self, row: Mapping[str, Any]) -> int:
        """Take one metrics row; returns the steps done over all series."""
        series = tuple(sorted((k, str(v)) for k, v in row.items() if k not in MEASURE_KEYS))
        step = row.get("step")
        if isinstance(step, int):
            self.steps[series] = max(step, self.steps.get(series, 0))
        loss, match = _number(row.get("loss")), _number(row.get("exact_match"))
        if row.get("split") == "train":
            if loss is not None:
                self.fields["loss"] = f"loss {loss:.4f}"
            speed = _number(row.get("tokens_per_s"))
            if speed is not None:
                self.fields["speed"] = f"{speed:,.0f} tok/s"
        elif match is not None:
            self.fields["match"] = f"exact {match:.3f}"
        return sum(self.steps.values())


class RunProgress:
    """The progress bars of one run. ``enabled`` False (quiet, or not a terminal): nothing is
    drawn and ``on_row`` returns at once. Listens to metrics rows through ``on_row``."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._phase: _Phase | None = None
        self._lock = threading.Lock()  # rows may come from a second training thread

    @classmethod
    def for_terminal(cls, quiet: bool = False) -> RunProgress:
        """Enabled only when stdout is a terminal and not ``quiet``."""
        from transformer_lab.results.console import console

        return cls(enabled=not quiet and console.is_terminal, console=console)

    def on_row(self, row: Mapping[str, Any]) -> None:
        """A metrics row was written: move the bar of the current phase (if any)."""
        if self._phase is None:
            return
        with self._lock:
            phase, progress = self._phase, self._progress
            if phase is None or progress is None:
                return
            done = phase.update(row)
            progress.update(self._task, completed=done, **phase.fields)

    @contextmanager
    def phase(self, label: str, total: int) -> Iterator[None]:
        """Show one bar labelled ``label`` while the block runs; ``total``: the steps planned
        (an upper bound when training may stop early: the bar is completed at the end)."""
        if not self.enabled:
            yield
            return
        progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[match]}"),
            TextColumn("{task.fields[speed]}"), TimeElapsedColumn(), TextColumn("eta"),
            TimeRemainingColumn(), console=self.console, transient=False,
            refresh_per_second=REFRESH_PER_SECOND)
        with self._lock:
            self._phase = _Phase()
            self._task = progress.add_task(label, total=max(1, int(total)), loss="", match="",
                                           speed="")
            self._progress = progress
        try:
            progress.start()
        except LiveError:  # another live display (a spinner) is on: no bar for this phase
            with self._lock:
                self._phase = self._progress = None
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                done = sum(self._phase.steps.values())
                if done:  # stopped early (solved): the bar ends full, at the steps taken
                    progress.update(self._task, total=done, completed=done)
                self._phase = self._progress = None
            progress.stop()


def root_log(log: Any) -> Any:
    """The ``CsvLog`` under a ``TaggedLog`` (or any wrapper with a ``log`` attribute)."""
    seen = 0
    while log is not None and not hasattr(log, "listeners") and seen < 10:
        log = getattr(log, "log", None)
        seen += 1
    return log


def progress_bar(log: Any, label: str, total: int) -> Any:
    """``RunProgress.phase`` of the run whose metrics log ``log`` is (a ``CsvLog``, a
    ``TaggedLog`` of it, or None); a no-op context when there is none."""
    root = root_log(log)
    for listener in getattr(root, "listeners", ()):
        owner = getattr(listener, "__self__", None)
        if isinstance(owner, RunProgress):
            return owner.phase(label, total)
    return nullcontext()
