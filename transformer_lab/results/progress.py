"""Live progress of training, fed by the metrics rows: a ``rich`` bar per training phase on a
terminal, plain log lines elsewhere (``docs/cli.md``, "Progress and trackers")."""

from __future__ import annotations

import datetime
import math
import threading
import time
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
                          "tokens_per_s", "elapsed_s", "ppl"})
NOT_IN_LINES = frozenset({"stage"})  # tags every row of a phase has: left out of plain lines
REFRESH_PER_SECOND = 2  # rich redraws on its own thread; fewer redraws, less CPU taken


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def series_of(row: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The tags of the model a row belongs to: its keys that are no measurement and whose value
    is no float (a float is a measurement a model adds, e.g. ``moe_expert0_fraction``)."""
    return tuple(sorted((k, str(v)) for k, v in row.items()
                        if k not in MEASURE_KEYS and not isinstance(v, float)))


class _Phase:
    """Steps per series of one training phase, and the latest numbers to show."""

    def __init__(self, total: int) -> None:
        self.total = max(1, int(total))
        self.started = time.perf_counter()
        self.first: tuple[float, int] | None = None  # time and count at the first train row
        self.steps: dict[tuple, int] = {}
        self.loss: float | None = None
        # per series: its latest held-out loss, that row's step and exact match (or None)
        self.held_out: dict[tuple, tuple[float, int, float | None]] = {}
        self.last_held_out: tuple[float, int, float | None] | None = None  # of any series
        self.speed: float | None = None

    @property
    def done(self) -> int:
        """Steps done over all series, at most ``total``."""
        return min(self.total, sum(self.steps.values()))

    def update(self, row: Mapping[str, Any]) -> bool:
        """Take one metrics row; True for a ``train`` row (one that moves the count)."""
        step, loss = row.get("step"), _number(row.get("loss"))
        if row.get("split") == "train":
            if isinstance(step, int):
                series = series_of(row)
                self.steps[series] = max(step, self.steps.get(series, 0))
                if self.first is None:
                    self.first = (time.perf_counter(), self.done)
            self.loss = loss if loss is not None else self.loss
            self.speed = _number(row.get("tokens_per_s")) or self.speed
            return True
        if row.get("split") == "val" and loss is not None:
            held_out = (loss, int(step) if isinstance(step, int) else 0,
                        _number(row.get("exact_match")))
            self.held_out[series_of(row)] = self.last_held_out = held_out
        return False

    def eta_s(self) -> float | None:
        """Seconds left at the pace since the first train row (at the first, since the phase
        began: a resumed model's first row counts the steps taken before); None before it."""
        done = self.done
        if self.first is None or not done:
            return None
        since, done_then = self.first if done > self.first[1] else (self.started, 0)
        return (time.perf_counter() - since) * (self.total - done) / (done - done_then)

    def fields(self, held_out: tuple[float, int, float | None] | None) -> dict[str, str]:
        """The text shown for the loss, a held-out row's loss and exact match, and tokens/s."""
        match = held_out[2] if held_out is not None else None
        return {"loss": f"loss {self.loss:.4f}" if self.loss is not None else "",
                "held_out": f"held-out {held_out[0]:.4f}" if held_out is not None else "",
                "match": f"exact {match:.3f}" if match is not None else "",
                "speed": f"{self.speed:,.0f} tok/s" if self.speed is not None else ""}

    def line(self, label: str, row: Mapping[str, Any]) -> str:
        """One plain log line for a ``train`` row: its step (and, with several models, their
        tags and the steps done of the phase), the losses, tokens/s and the time left."""
        step = row.get("step")
        if len(self.steps) == 1 and step == self.done:  # one model so far: its step is the count
            parts = [f"{label} | step {step}/{self.total}"]
        else:
            tags = [f"{k}={v}" for k, v in series_of(row) if k not in NOT_IN_LINES]
            parts = [f"{label} |", *tags, f"step {step} ({self.done}/{self.total})"]
        held_out = self.held_out.get(series_of(row))
        texts = self.fields(held_out)
        if held_out is not None:
            texts["held_out"] += f" (step {held_out[1]})"
        eta = self.eta_s()
        eta_text = str(datetime.timedelta(seconds=round(eta))) if eta is not None else "-"
        return " ".join([*parts, *filter(None, texts.values()), f"eta {eta_text}"])


class RunProgress:
    """The progress of one run, fed with metrics rows through ``on_row``. ``enabled`` False
    (quiet): nothing is shown and ``on_row`` returns at once. ``plain``: log lines instead of a
    live bar (stdout is not a terminal)."""

    def __init__(self, enabled: bool, console: Console, plain: bool = False) -> None:
        self.enabled = enabled
        self.plain = plain
        self.console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._phase: _Phase | None = None
        self._label = ""
        self._lock = threading.Lock()  # rows may come from a second training thread

    @classmethod
    def for_terminal(cls, quiet: bool = False) -> RunProgress:
        """A live bar on a terminal, plain log lines elsewhere; nothing when ``quiet``."""
        from transformer_lab.results.console import console

        return cls(enabled=not quiet, console=console, plain=not console.is_terminal)

    def on_row(self, row: Mapping[str, Any]) -> None:
        """A metrics row was written: move the current phase's bar, or print its line."""
        if self._phase is None:
            return
        with self._lock:
            phase = self._phase
            if phase is None:
                return
            moved = phase.update(row)
            if self.plain and moved:
                self.console.print(phase.line(self._label, row), markup=False, highlight=False,
                                   soft_wrap=True)
                self.console.file.flush()
            elif self._progress is not None:
                self._progress.update(self._task, completed=phase.done,
                                      **phase.fields(phase.last_held_out))

    @property
    def counted(self) -> tuple[int, int] | None:
        """(steps done, steps planned) of the current phase; None outside one."""
        phase = self._phase
        return (phase.done, phase.total) if phase is not None else None

    @contextmanager
    def phase(self, label: str, total: int) -> Iterator[None]:
        """Show one bar labelled ``label`` while the block runs (or print its lines);
        ``total``: the steps planned (an upper bound when training may stop early: the bar is
        completed at the end)."""
        if not self.enabled:
            yield
            return
        progress = None if self.plain else Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[held_out]}"),
            TextColumn("{task.fields[match]}"), TextColumn("{task.fields[speed]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=self.console,
            transient=False, refresh_per_second=REFRESH_PER_SECOND)
        with self._lock:
            self._phase, self._label = _Phase(total), label
            if progress is not None:
                self._task = progress.add_task(label, total=self._phase.total,
                                               **self._phase.fields(None))
                self._progress = progress
        try:
            if progress is not None:
                try:
                    progress.start()
                except LiveError:  # another live display (a spinner) is on: no bar this phase
                    with self._lock:
                        self._phase = self._progress = progress = None
            yield
            if progress is not None:
                with self._lock:
                    done = self._phase.done
                    if done:  # stopped early (solved): the bar ends full, at the steps taken
                        progress.update(self._task, total=done, completed=done)
        finally:
            with self._lock:
                self._phase = self._progress = None
            if progress is not None:
                progress.stop()


def progress_bar(log: Any, label: str, total: int) -> Any:
    """``RunProgress.phase`` of the run whose metrics log ``log`` is (a ``CsvLog``, a
    ``TaggedLog`` of it, or None); a no-op context when there is none."""
    while log is not None and not hasattr(log, "listeners"):  # a TaggedLog: the log it tags for
        log = getattr(log, "log", None)
    for listener in getattr(log, "listeners", ()):
        if isinstance(owner := getattr(listener, "__self__", None), RunProgress):
            return owner.phase(label, total)
    return nullcontext()
