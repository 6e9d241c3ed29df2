"""Run directories and the CSV files a run writes (README, "What a run writes").

    config.yaml   resolved config            run.json     seed, commit, versions, times, status
    metrics.csv   one row per logged step    summary.csv  one row per run
    <table>.csv   command-specific tables    *.png        plots

CSV rows are flushed as they are written, so an interrupted run keeps what it logged.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import ConfigError

METRIC_COLUMNS = ["step", "split", "loss", "accuracy", "exact_match", "lr", "grad_norm",
                  "tokens_per_s", "elapsed_s"]
# summary.csv: what the run was (settings), its seed, its numbers, how it ended.
SETTING_COLUMNS = ["routine", "arch", "pe", "norm", "norm_layer", "activation", "d_model",
                   "n_heads", "n_layers", "d_ff", "seq_len", "vocab_size"]
NUMBER_COLUMNS = ["params", "steps", "final_loss", "best_exact_match", "solved_step", "wall_s",
                  "tokens_per_s"]
SUMMARY_COLUMNS = [*SETTING_COLUMNS, "seed", *NUMBER_COLUMNS, "status", "error"]
RUN_MARKERS = ("run.json", "metrics.csv", "summary.csv")
_FAILED_ATTEMPT = re.compile(r"^(?P<job>.+)\.failed-(?P<n>\d+)$")
PACKAGES = ("torch", "numpy", "hydra-core", "omegaconf", "pandas", "typer", "rich", "matplotlib",
            "transformer_lab")


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


class CsvLog:
    """Append-only CSV. The header is ``columns`` plus any other keys of the first row written;
    a later row with keys the header lacks widens it (the file is rewritten once with the new
    columns, earlier rows empty there), so no column is lost, e.g. the ``moe_expert{i}_fraction``
    of an MoE model trained after a dense one. ``listeners`` are called with each row after it
    is on disk (trackers, the progress bar): they never stop a row being written."""

    def __init__(self, path: Path, columns: Iterable[str],
                 listeners: Iterable[Callable[[Mapping[str, Any]], None]] = ()) -> None:
        self.path = path
        self.columns = list(columns)
        self.listeners = list(listeners)
        self._file = None
        self._writer: csv.DictWriter | None = None

    def write(self, row: Mapping[str, Any]) -> None:
        extra = [k for k in row if k not in self.columns]
        if self._writer is None:
            self.columns += extra
            self._open("w")
            self._writer.writeheader()
        elif extra:
            self._widen(extra)
        self._writer.writerow({k: _format(row.get(k)) for k in self.columns})
        self._file.flush()
        for listener in self.listeners:
            listener(row)

    def _open(self, mode: str) -> None:
        self._file = self.path.open(mode, newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")

    def _widen(self, extra: list[str]) -> None:
        """Rewrite the file with ``extra`` added to the header (atomically), then append again."""
        self._file.close()
        with self.path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        self.columns += extra
        partial = self.path.with_name(self.path.name + ".widening")
        with partial.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(partial, self.path)
        self._open("a")

    def write_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class TaggedLog:
    """Writes rows to ``log`` (if there is one) with the same extra columns, e.g.
    ``TaggedLog(run.metrics, stage="reverse", variant="rope", seed=0)``: several models of one
    run share its ``metrics.csv`` and these columns tell them apart."""

    def __init__(self, log: CsvLog | TaggedLog | None, **tags: Any) -> None:
        self.log = log
        self.tags = tags

    def write(self, row: Mapping[str, Any]) -> None:
        if self.log is not None:
            self.log.write({**row, **self.tags})


def holds_run(path: Path) -> bool:
    """True if ``path`` already contains the files of a run."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


CLAIM_FILE = ".tlab-claim"  # who claimed a run / sweep directory: {"pid", "host", "time"}


def claimed_by(path: Path) -> str | None:
    """"pid 123 on host h (since ...)" if ``path`` was claimed by a run or sweep, else None.
    A claim being written right now is waited for briefly, so the owner is named."""
    marker = Path(path) / CLAIM_FILE
    if not marker.exists():
        return None
    owner: dict[str, Any] = {}
    for _ in range(20):
        owner = read_json(marker)
        if owner:
            break
        time.sleep(0.025)
    return (f"pid {owner.get('pid', '?')} on {owner.get('host', '?')} (since "
            f"{owner.get('time', '?')})")


def claim_directory(path: str | Path) -> Path:
    """Claim ``path`` for one run or sweep before anything is written there: the directory is
    made if needed and ``.tlab-claim`` created with an exclusive create (``O_EXCL``), so of two
    runs started together exactly one gets it. Raises ``ConfigError`` naming the owner for the
    loser, and for a path that cannot be a directory (a file, below a file, not writable)."""
    import socket

    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == path else f"is below the file '{parent}'"
            raise ConfigError(f"output directory '{path}' {where}; choose a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ConfigError(f"'{path}' is already taken by another run: {claimed_by(path)}; "
                          "choose another output directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot write in output directory '{path}': "
                          f"{exc.strerror or exc}; choose a writable directory") from None
    owner = {"pid": os.getpid(), "host": socket.gethostname(),
             "time": datetime.now(timezone.utc).isoformat(), "argv": sys.argv}
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(owner))
    return path


@functools.cache
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.cache
def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class RunDirectory:
    """One run's folder. ``create`` refuses a folder that already holds a run."""

    def __init__(self, path: Path, cfg: DictConfig) -> None:
        self.path = path
        self.cfg = cfg
        self.started = time.time()
        self._logs: dict[str, CsvLog] = {}
        self.info: dict[str, Any] = {}
        self.trackers: list[Any] = []  # results.tracking.SafeTracker (logger=...)
        self.progress: Any = None  # results.progress.RunProgress (live bars)

    @classmethod
    def create(cls, path: str | Path, cfg: DictConfig) -> RunDirectory:
        path = Path(path)
        if holds_run(path):
            raise ConfigError(f"'{path}' already holds a run; choose another --out directory")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path, cfg)
        run.info = {
            "seed": cfg.get("seed"),
            "routine": cfg.routine.name,
            "git_commit": git_commit(),
            "versions": dict(package_versions()),
            "platform": platform.platform(),
            "device": cfg.train.device,
            "threads": _torch_threads(),
            "argv": sys.argv,
            "pid": os.getpid(),
            "start_time": datetime.now(timezone.utc).isoformat(),
            "status": "running",
        }
        run.write_info()
        run.start_outputs()
        return run

    def start_outputs(self) -> None:
        """The trackers ``cfg.logger`` names and the progress bars (``logger.progress``)."""
        from transformer_lab.results.progress import RunProgress
        from transformer_lab.results.tracking import build_trackers

        logger = self.cfg.get("logger")
        quiet = logger is not None and not logger.get("progress", True)
        self.progress = RunProgress.for_terminal(quiet=quiet)
        self.trackers = build_trackers(self.cfg, self.path)

    def write_config(self) -> None:
        """Save the resolved config (unresolved if an interpolation cannot be resolved)."""
        try:
            text = OmegaConf.to_yaml(self.cfg, resolve=True)
        except Exception:
            text = OmegaConf.to_yaml(self.cfg)
        (self.path / "config.yaml").write_text(text)

    def write_info(self) -> None:
        (self.path / "run.json").write_text(json.dumps(self.info, indent=2, default=str))

    def log(self, name: str, columns: Iterable[str] = ()) -> CsvLog:
        """The CSV log ``<name>.csv`` of this run (created on first write)."""
        if name not in self._logs:
            self._logs[name] = CsvLog(self.path / f"{name}.csv", columns)
        return self._logs[name]

    @property
    def metrics(self) -> CsvLog:
        if "metrics" not in self._logs:
            listeners = [tracker.log_row for tracker in self.trackers]
            if self.progress is not None:
                listeners.append(self.progress.on_row)
            self._logs["metrics"] = CsvLog(self.path / "metrics.csv", METRIC_COLUMNS, listeners)
        return self._logs["metrics"]

    def write_table(self, name: str, rows: list[Mapping[str, Any]],
                    columns: Iterable[str] = ()) -> Path:
        table = self.log(name, columns)
        table.write_all(rows)
        return table.path

    def finish(self, status: str, error: str | None = None, **extra: Any) -> None:
        for log in self._logs.values():
            with contextlib.suppress(OSError):  # a full disk: flushed rows stay; run.json below
                log.close()
        self.info.update(status=status, error=error,
                         end_time=datetime.now(timezone.utc).isoformat(),
                         wall_s=round(time.time() - self.started, 3), **extra)
        self.write_info()
        for tracker in self.trackers:  # after the files are complete: they are its artifacts
            tracker.finish(self.path, status)


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def is_failed_attempt_dir(path: Path) -> bool:
    """True for ``<job>.failed-<n>`` folders (superseded attempts kept by ``tlab --resume``)."""
    return _FAILED_ATTEMPT.match(path.name) is not None
