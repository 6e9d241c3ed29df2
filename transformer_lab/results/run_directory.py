"""Run directories, their claim and the files a run writes (README, "What a run writes";
``docs/cli.md``, "Run directories")."""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import math
import os
import platform
import re
import socket
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
WEIGHTS_FILE = "model.safetensors"  # the final weights of a run that trains one model
MODELS_DIR = "models"  # the final weights of a run that trains several (seeds, variants)
CHECKPOINT_FILE = "checkpoint.pt"  # a tlab train run's resumable state (train.checkpoint)
_FAILED_ATTEMPT = re.compile(r"^(?P<job>.+)\.failed-(?P<n>\d+)$")
PACKAGES = ("torch", "numpy", "hydra-core", "omegaconf", "pandas", "typer", "rich", "matplotlib",
            "transformer_lab")


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


class CsvLog:
    """Append-only CSV, flushed per row; a row with new keys widens the header. ``listeners``
    get each row once it is on disk."""

    def __init__(self, path: Path, columns: Iterable[str],
                 listeners: Iterable[Callable[[Mapping[str, Any]], None]] = ()) -> None:
        self.path = path
        self.columns = list(columns)
        self.listeners = list(listeners)
        self.rows = 0  # data rows in the file
        self._file = None
        self._writer: Any = None  # a csv.writer

    def write(self, row: Mapping[str, Any]) -> None:
        extra = [k for k in row if k not in self.columns]
        if self._writer is None:
            self.columns += extra
            self._open("w")
            self._writer.writerow(self.columns)
        elif extra:  # rewrite the file with the wider header, then append again
            self._file.close()
            with self.path.open(newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            columns = self.columns + extra
            self._rewrite(columns, [[r.get(c) for c in columns] for r in rows], ".widening")
        self._writer.writerow([_format(row.get(k)) for k in self.columns])
        self._file.flush()
        self.rows += 1
        for listener in self.listeners:
            listener(row)

    def _open(self, mode: str) -> None:
        self._file = self.path.open(mode, newline="", encoding="utf-8")
        self._writer = csv.writer(self._file)

    def _rewrite(self, header: list[str], rows: list[list[Any]], suffix: str) -> None:
        """Replace the file with ``header`` and ``rows`` (atomically), then append again."""
        partial = self.path.with_name(self.path.name + suffix)
        with partial.open("w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([header, *rows])
        os.replace(partial, self.path)
        self.columns = list(header)
        self._open("a")

    def write_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def keep_first(self, rows: int) -> None:
        """Continue a resumed run's file: keep its header and first ``rows`` rows, append."""
        self.close()
        if rows == 0 and not self.path.exists():
            return  # nothing was written: the first row writes the header
        with self.path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            kept = [line for _, line in zip(range(rows), reader, strict=False)]
        if header is None or len(kept) < rows:
            raise ConfigError(f"{self.path} has {len(kept)} rows where its checkpoint counted "
                              f"{rows}: it was changed since; cannot resume from it")
        self._rewrite(header, kept, ".resuming")
        self.rows = rows

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class TaggedLog:
    """Rows to ``log`` (if any) with extra columns, e.g. ``TaggedLog(run.metrics, seed=0)``:
    several models of one run share its ``metrics.csv``."""

    def __init__(self, log: CsvLog | TaggedLog | None, **tags: Any) -> None:
        self.log = log
        self.tags = tags

    def write(self, row: Mapping[str, Any]) -> None:
        if self.log is not None:
            self.log.write({**row, **self.tags})


def holds_run(path: Path) -> bool:
    """True if ``path`` already contains the files of a run."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def resume_hint(path: Path) -> str:
    """How to resume the run in ``path`` if it kept a checkpoint, for a refusal message."""
    has_checkpoint = (Path(path) / CHECKPOINT_FILE).is_file()
    return f"; to go on with that run: tlab train --resume {path}" if has_checkpoint else ""


def weights_path(run_dir: Path, seed: int, variant: str | None = None,
                 several: bool = False) -> Path:
    """Where a run keeps a model's final weights: ``model.safetensors`` (one model), else
    ``models/[<variant>/]seed<k>.safetensors``."""
    if variant is None and not several:
        return run_dir / WEIGHTS_FILE
    folder = run_dir / MODELS_DIR
    if variant is not None:
        folder = folder / (re.sub(r"[^A-Za-z0-9._=+-]", "_", variant).lstrip(".") or "_")
    return folder / f"seed{seed}.safetensors"


CLAIM_FILE = ".tlab-claim"  # who claimed a run / sweep directory: {"pid", "host", "time"}


def claimed_by(path: Path) -> str | None:
    """"pid 123 on host h (since ...)" if ``path`` is claimed, else None."""
    marker = Path(path) / CLAIM_FILE
    if not marker.exists():
        return None
    for _ in range(20):  # a claim being written reads empty for a moment
        if owner := read_json(marker):
            break
        time.sleep(0.025)
    return (f"pid {owner.get('pid', '?')} on {owner.get('host', '?')} (since "
            f"{owner.get('time', '?')})")


def _claim(**resuming: bool) -> str:
    """The text of a claim by this process (``resuming=True``: of an interrupted run's folder)."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "time": datetime.now(timezone.utc).isoformat(), "argv": sys.argv,
                       **resuming})


def claim_directory(path: str | Path) -> Path:
    """Claim ``path`` for one run or sweep by creating ``.tlab-claim`` exclusively;
    ``ConfigError`` naming the owner, or why ``path`` cannot be a directory."""
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
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(_claim())
    return path


def reclaim_directory(path: Path) -> None:
    """Take over the claim of an interrupted run's directory (``--resume RUN_DIR``);
    ``ConfigError`` while its owner runs, or for the loser of two resumes."""
    marker = path / CLAIM_FILE
    before = marker.read_text(encoding="utf-8") if marker.exists() else ""
    owner = read_json(marker)
    if owner.get("host") == socket.gethostname() and process_alive(owner.get("pid")):
        raise ConfigError(f"'{path}' is still being run: {claimed_by(path)}; stop it first "
                          "(its checkpoint is resumed from where it stops)")
    lock = path / f"{CLAIM_FILE}.taking-{hashlib.sha256(before.encode()).hexdigest()[:16]}"
    try:
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        raise ConfigError(f"'{path}' is being resumed by another process") from None
    try:
        now = marker.read_text(encoding="utf-8") if marker.exists() else ""
        if now != before:
            raise ConfigError(f"'{path}' was resumed by another process: {claimed_by(path)}")
        partial = path / f"{CLAIM_FILE}.{os.getpid()}"
        partial.write_text(_claim(resuming=True), encoding="utf-8")
        os.replace(partial, marker)
    finally:
        lock.unlink(missing_ok=True)


def process_alive(pid: Any) -> bool:
    """True when a process ``pid`` (not this one) runs on this host."""
    if not isinstance(pid, int) or pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # it exists, owned by someone else
        return True
    except OSError:
        return False
    return True


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


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as plain dicts and lists, resolved (unresolved if an interpolation cannot be)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception:
        return OmegaConf.to_container(cfg)  # type: ignore[return-value]


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
        """A new run's directory; one holding a run is refused unless this process resumes it
        (``reclaim_directory``): then it goes on there, this process added to ``resumes``."""
        path = Path(path)
        run = cls(path, cfg)
        now = datetime.now(timezone.utc).isoformat()
        if holds_run(path):
            claim = read_json(path / CLAIM_FILE)
            if not (claim.get("resuming") and claim.get("pid") == os.getpid()):
                raise ConfigError(f"'{path}' already holds a run; choose another --out directory"
                                  f"{resume_hint(path)}")
            run.info = read_json(path / "run.json")
            resumes = [*(run.info.get("resumes") or []),
                       {"pid": os.getpid(), "argv": sys.argv, "start_time": now,
                        "previous_status": run.info.get("status")}]
            run.info.update(status="running", error=None, resumes=resumes)
        else:
            path.mkdir(parents=True, exist_ok=True)
            torch = sys.modules.get("torch")
            run.info = {"seed": cfg.get("seed"), "routine": cfg.routine.name,
                        "git_commit": git_commit(), "versions": dict(package_versions()),
                        "platform": platform.platform(), "device": cfg.train.device,
                        "threads": torch.get_num_threads() if torch is not None else None,
                        "argv": sys.argv, "pid": os.getpid(), "start_time": now,
                        "status": "running"}
        run.write_info()
        # the trackers ``cfg.logger`` names and the progress bars (``logger.progress``)
        from transformer_lab.results.progress import RunProgress
        from transformer_lab.results.tracking import build_trackers

        logger = cfg.get("logger")
        run.progress = RunProgress.for_terminal(quiet=logger is not None
                                                and not logger.get("progress", True))
        run.trackers = build_trackers(plain_config(cfg), path)
        return run

    def write_config(self) -> None:
        """Save the resolved config (unresolved if an interpolation cannot be resolved)."""
        (self.path / "config.yaml").write_text(OmegaConf.to_yaml(plain_config(self.cfg)))

    def write_info(self) -> None:
        (self.path / "run.json").write_text(json.dumps(self.info, indent=2, default=str))

    def log(self, name: str, columns: Iterable[str] = ()) -> CsvLog:
        """The CSV log ``<name>.csv`` of this run (created on first write)."""
        return self._logs.setdefault(name, CsvLog(self.path / f"{name}.csv", columns))

    @property
    def metrics(self) -> CsvLog:
        if "metrics" not in self._logs:
            listeners = [tracker.log_row for tracker in self.trackers] + \
                ([self.progress.on_row] if self.progress is not None else [])
            self._logs["metrics"] = CsvLog(self.path / "metrics.csv", METRIC_COLUMNS, listeners)
        return self._logs["metrics"]

    def write_table(self, name: str, rows: list[Mapping[str, Any]],
                    columns: Iterable[str] = ()) -> None:
        self.log(name, columns).write_all(rows)

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


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def is_failed_attempt_dir(path: Path) -> bool:
    """True for ``<job>.failed-<n>`` folders (superseded attempts kept by ``tlab --resume``)."""
    return _FAILED_ATTEMPT.match(path.name) is not None
