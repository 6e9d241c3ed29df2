"""Run directories and the CSV files a run writes (README, "What a run writes").

    config.yaml   resolved config            run.json     seed, commit, versions, times, status
    metrics.csv   one row per logged step    summary.csv  one row per run
    <table>.csv   command-specific tables    *.png        plots

CSV rows are flushed as they are written, so an interrupted run keeps what it logged.
"""

from __future__ import annotations

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
from collections.abc import Iterable, Mapping
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
    keys that later rows add beyond the header are dropped."""

    def __init__(self, path: Path, columns: Iterable[str]) -> None:
        self.path = path
        self.columns = list(columns)
        self._file = None
        self._writer: csv.DictWriter | None = None

    def write(self, row: Mapping[str, Any]) -> None:
        if self._writer is None:
            extra = [k for k in row if k not in self.columns]
            self.columns += extra
            self._file = self.path.open("w", newline="", encoding="utf-8")
            self._writer = csv.DictWriter(self._file, fieldnames=self.columns,
                                          extrasaction="ignore")
            self._writer.writeheader()
        self._writer.writerow({k: _format(row.get(k)) for k in self.columns})
        self._file.flush()

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
        return run

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
        return self.log("metrics", METRIC_COLUMNS)

    def write_table(self, name: str, rows: list[Mapping[str, Any]],
                    columns: Iterable[str] = ()) -> Path:
        table = self.log(name, columns)
        table.write_all(rows)
        return table.path

    def finish(self, status: str, error: str | None = None, **extra: Any) -> None:
        for log in self._logs.values():
            log.close()
        self.info.update(status=status, error=error,
                         end_time=datetime.now(timezone.utc).isoformat(),
                         wall_s=round(time.time() - self.started, 3), **extra)
        self.write_info()


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
