"""One step of a routine in a forked child process, beside the parent's own steps.

``tlab validate``'s step 4 (train the activations, their statistics, the loss-curve plot) does
not depend on steps 1-3, which run on one core; on Linux the step runs in a child process forked
before the parent starts its own steps (so before any progress bar's thread), on the second
core. The child is quiet and leaves the run directory to the parent:

- its tables and plots go to a staging folder in the run directory (:data:`STAGING`), moved in
  when the parent collects the step, so a step that is cancelled (a failing step 1, Ctrl-C)
  leaves no file of it;
- its ``metrics.csv`` rows are held (:class:`HeldRows`) and sent back with the step's result,
  pickled through a pipe; the parent writes them where a sequential run would have;
- what it prints on the consoles is captured and printed by the parent on collection; what it
  writes to its stdout/stderr file descriptors (warnings) is kept in a file, shown then too;
- an exception in the child comes back as its text (:class:`StepFailed`); a ``KeyboardInterrupt``
  raised in the child is raised again in the parent (exit 130 as in a sequential run); a child
  killed by a signal is a ``StepFailed`` naming the signal.

The parent cancels the child (SIGKILL, reaped) when it does not collect it; Ctrl-C at the
terminal reaches both (the child dies on it quietly, the parent cancels and exits 130), and the
child dies with the parent (``PR_SET_PDEATHSIG``) if the parent is killed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from transformer_lab.processes import die_with_parent, flush_output, signal_name
from transformer_lab.results.console import console, err_console
from transformer_lab.results.run_directory import RunDirectory

STAGING = ".background-step"  # the child's folder in the run directory, until collected


class StepFailed(Exception):
    """The step in the child raised (its text), or the child died (the signal)."""


class HeldRows:
    """A metrics log that keeps its rows (already tagged) instead of writing them; no listeners,
    so no progress bar is drawn for it."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.listeners: list[Callable] = []

    def write(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))

    def write_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)


class StagedRun(RunDirectory):
    """The run directory as the child sees it: tables and plots in the staging folder,
    ``metrics`` rows held for the parent, no trackers and no progress bars."""

    def __init__(self, path: Path, cfg: Any) -> None:
        super().__init__(path, cfg)
        self.held = HeldRows()

    @property
    def metrics(self) -> HeldRows:  # type: ignore[override]
        return self.held


class BackgroundStep:
    """A step running in a forked child; ``collect`` its result or ``cancel`` it."""

    def __init__(self, pid: int, read_fd: int, staging: Path, output: Any) -> None:
        self.pid = pid
        self.read_fd = read_fd
        self.staging = staging
        self.output = output  # the child's stdout/stderr file
        self.done = False

    @classmethod
    def start(cls, step: Callable[[RunDirectory], Any], run: RunDirectory) -> BackgroundStep:
        """Fork a child that runs ``step(staged_run)`` and sends back its result."""
        staging = run.path / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        output = tempfile.TemporaryFile()  # noqa: SIM115 - closed by collect/cancel
        flush_output()
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            os.close(read_fd)
            _run_child(step, StagedRun(staging, run.cfg), write_fd, output.fileno(), parent)
        os.close(write_fd)
        return cls(pid, read_fd, staging, output)

    def collect(self, run: RunDirectory, showing: AbstractContextManager | None = None) -> Any:
        """Wait for the child (inside ``showing``, e.g. a progress bar); move its files into
        ``run`` and write its metrics rows, then print what it printed; its result, or
        ``StepFailed`` / ``KeyboardInterrupt`` as it ended."""
        with showing or contextlib.nullcontext():
            with os.fdopen(self.read_fd, "rb") as pipe:
                self.read_fd = -1
                data = pipe.read()
            _, wait_status = os.waitpid(self.pid, 0)
            self.done = True
            try:
                outcome, value, rows, printed = pickle.loads(data)
            except Exception:  # noqa: BLE001 - nothing (or half a message) came back
                self.output.close()
                self._discard()
                raise StepFailed(_death_reason(wait_status)) from None
            try:  # the step finished: its files and rows go in (interrupted or not)
                for name in sorted(os.listdir(self.staging)):
                    os.replace(self.staging / name, run.path / name)
                self._discard()
                run.metrics.write_all(rows)
            except BaseException:
                self.output.close()
                raise
        self._replay(printed)
        if outcome == "interrupted":
            raise KeyboardInterrupt
        if outcome == "error":
            raise StepFailed(value)
        return value

    def cancel(self) -> None:
        """Stop the child (if it was not collected) and drop its files."""
        if self.done:
            return
        self.done = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
        self.output.close()
        self._discard()

    def _discard(self) -> None:
        """Drop the staging folder (its files were moved, or are not wanted)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def _replay(self, printed: tuple[str, str]) -> None:
        out, err = printed
        for text, target in ((out, console), (err, err_console)):
            if text:
                target.file.write(text)
                target.file.flush()
        self.output.seek(0)
        raw = self.output.read().decode(errors="replace")
        self.output.close()
        if raw:
            sys.stderr.write(raw)
            sys.stderr.flush()


def _death_reason(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"its process was killed by {signal_name(os.WTERMSIG(wait_status))}"
    return f"its process exited with code {os.waitstatus_to_exitcode(wait_status)} and no result"


def _run_child(step: Callable[[RunDirectory], Any], run: StagedRun, write_fd: int,
               output_fd: int, parent: int) -> None:
    """In the forked child: quiet, run ``step``, send (outcome, value, rows, printed), exit."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: die at once; the parent reports
        if not die_with_parent(signal.SIGKILL, parent):
            os._exit(1)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        console.begin_capture()
        err_console.begin_capture()
        try:
            outcome, value = "ok", step(run)
        except KeyboardInterrupt:
            outcome, value = "interrupted", None
        except BaseException as exc:  # noqa: BLE001 - reported by the parent
            outcome, value = "error", f"{type(exc).__name__}: {exc}"
        printed = (console.end_capture(), err_console.end_capture())
        data = pickle.dumps((outcome, value, run.held.rows, printed))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - the parent sees no result and says so
        code = 1
    finally:
        os._exit(code)
