"""Sweep bookkeeping around Hydra's launchers: ``sweep.csv``, the sweep's exit code, a resumed
job's skip or retry (``docs/cli.md``, "Sweeps")."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import socket
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.table import Table

from transformer_lab.app.isolation import POOL_STOPPED, run_isolated, save_hydra_files
from transformer_lab.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from transformer_lab.results.console import console, print_error
from transformer_lab.results.run_directory import (
    NUMBER_COLUMNS,
    holds_run,
    is_failed_attempt_dir,
    read_json,
)

try:  # POSIX; elsewhere one O_APPEND write of a whole line is the only guard
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

SWEEP_FILE = "sweep.csv"
RESUME_ENV = "TLAB_RESUME"  # set in the jobs of a --resume sweep through hydra.job.env_set
RETRY = "retry"  # RESUME_ENV in a relaunch after a dead worker: only unfinished jobs run
SWEEP_COLUMNS = ["job", "attempt", "status", "exit_code", "overrides", *NUMBER_COLUMNS,
                 "error", "run_dir", "host", "end_time"]
_STATUS_CODES = {"passed": EXIT_OK, "interrupted": EXIT_INTERRUPTED}  # else EXIT_FAILED

# --- the job side ---------------------------------------------------------------------------


def move_aside(run_dir: Path) -> Path:
    """Move the run files of ``run_dir`` into ``<run_dir>.failed-<n>`` (first free n); ``*.log``
    files are copied (the job's log handler writes to them)."""
    n = 1
    while (target := run_dir.with_name(f"{run_dir.name}.failed-{n}")).exists():
        n += 1
    target.mkdir()
    for entry in list(run_dir.iterdir()):
        if entry.suffix == ".log":
            shutil.copy2(entry, target / entry.name)
        else:
            entry.rename(target / entry.name)
    return target


def previous_attempts(run_dir: Path) -> int:
    return sum(1 for p in run_dir.parent.glob(f"{run_dir.name}.failed-*")
               if is_failed_attempt_dir(p))


def _csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file; ``[]`` when it is missing or unreadable."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def job_row(job: int | str, attempt: int, overrides: list[str], run_dir: Path,
            exit_code: int) -> dict[str, Any]:
    """The ``sweep.csv`` row of one finished job, read back from the files the run wrote."""
    info = read_json(run_dir / "run.json")
    summary = next(iter(_csv_rows(run_dir / "summary.csv")), {})
    row: dict[str, Any] = {key: summary.get(key, "") for key in NUMBER_COLUMNS}
    row.update(job=job, attempt=attempt, status=info.get("status", summary.get("status", "")),
               exit_code=exit_code, overrides=" ".join(overrides),
               error=info.get("error") or summary.get("error") or "",
               run_dir=run_dir.name, host=socket.gethostname(),
               end_time=info.get("end_time") or datetime.now(timezone.utc).isoformat())
    return row


def append_row(sweep_csv: Path, row: dict[str, Any]) -> None:
    """Append one row (and the header if the file is new) with a single locked write."""
    sweep_csv.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(sweep_csv, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=SWEEP_COLUMNS, extrasaction="ignore",
                                lineterminator="\n")
        if os.fstat(fd).st_size == 0:
            writer.writeheader()
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in SWEEP_COLUMNS})
        os.write(fd, buffer.getvalue().encode("utf-8"))
    finally:
        os.close(fd)


def run_sweep_job(cfg: DictConfig, execute: Callable[[DictConfig, Path], int]) -> int:
    """Run one job of a sweep (inside the Hydra job): resume logic, then ``sweep.csv``."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    job = run_dir.name  # its number: hydra.sweep.subdir (after earlier launches of a search)
    mode = os.environ.get(RESUME_ENV)
    if mode in ("1", RETRY):
        info = read_json(run_dir / "run.json")  # "unreadable" if broken, None if no run is there
        previous = str(info.get("status") or "unreadable") if holds_run(run_dir) else None
        if mode == RETRY and previous is not None and not info.get(POOL_STOPPED):
            return EXIT_OK  # finished in this sweep's earlier launch (app.recovery)
        if previous == "passed":
            console.print(f"job {job} ({' '.join(overrides)}) passed in an earlier attempt: "
                          "skipped")
            return EXIT_OK
        if previous is not None:
            moved = move_aside(run_dir)
            console.print(f"job {job}: earlier attempt ({previous}) kept in {moved}; running it "
                          "again")
        save_hydra_files(cfg, run_dir)  # Hydra wrote none (output_subdir=null on resume)
    attempt = previous_attempts(run_dir) + 1
    code = run_isolated(execute, cfg, run_dir)
    try:
        append_row(Path(str(hydra_cfg.sweep.dir)).resolve() / SWEEP_FILE,
                   job_row(job, attempt, overrides, run_dir, code))
    except OSError as exc:
        print_error(f"job {job}: its sweep.csv row could not be written ({exc.strerror or exc})")
    return code


# --- the launching side ---------------------------------------------------------------------


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job folders that hold a run (latest attempts; kept failed ones left out)."""
    if not sweep_dir.is_dir():
        return []
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and holds_run(p)
                   and not is_failed_attempt_dir(p)), key=lambda p: (len(p.name), p.name))


def latest_rows(sweep_dir: Path) -> dict[str, dict[str, str]]:
    """The last recorded row of each job (a resumed job's new attempt replaces the old one)."""
    return {row["job"]: row for row in _csv_rows(sweep_dir / SWEEP_FILE) if row.get("job")}


def _code_of(exit_code: object, status: str | None) -> int:
    try:
        return int(str(exit_code))
    except ValueError:
        return _STATUS_CODES.get(status or "", EXIT_FAILED)


def sweep_exit_code(sweep_dir: Path) -> int:
    """Worst exit code over the jobs' latest ``sweep.csv`` rows and job folders with no row."""
    rows = latest_rows(sweep_dir)
    codes = [_code_of(row.get("exit_code", ""), row.get("status")) for row in rows.values()]
    for job_dir in job_dirs(sweep_dir):
        if job_dir.name not in rows:  # killed before its row
            info = read_json(job_dir / "run.json")
            codes.append(_code_of(info.get("exit_code"), info.get("status")))
    return max(codes, default=EXIT_OK)


def print_sweep_summary(sweep_dir: Path, max_rows: int = 30) -> None:
    """A rich table of the sweep's jobs (latest attempt each), or counts and failures if big."""
    rows = sorted(latest_rows(sweep_dir).values(),
                  key=lambda r: int(r["job"]) if r["job"].isdigit() else 10**9)
    if not rows:
        return
    counts = Counter(row["status"] for row in rows)
    shown = rows if len(rows) <= max_rows else [r for r in rows if r["status"] != "passed"]
    table = Table(title=f"sweep {sweep_dir}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for column in ("job", "overrides", "status", "final_loss", "best_exact_match", "error"):
        table.add_column(column, overflow="fold")
    for row in shown[:max_rows]:
        colour = "green" if row["status"] == "passed" else "bold red"
        table.add_row(row["job"], row["overrides"], f"[{colour}]{row['status']}[/]",
                      row.get("final_loss", ""), row.get("best_exact_match", ""),
                      (row.get("error") or "")[:120])
    console.print(table)
    console.print(f"sweep.csv: {sweep_dir / SWEEP_FILE}  (tlab report {sweep_dir})")


def quote_value(value: str) -> str:
    """A path as a Hydra override value (quoted when it has characters the grammar reserves)."""
    if re.fullmatch(r"[\w./~@%+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
