"""A sweep that outlives the death of a launcher worker (loky breaks its whole pool): settle the
jobs, then run the unfinished ones again (``docs/cli.md``, "Sweeps")."""

from __future__ import annotations

import dataclasses
import socket
import time
from concurrent.futures import BrokenExecutor
from pathlib import Path

from omegaconf import OmegaConf

from transformer_lab.app.arguments import Arguments
from transformer_lab.app.isolation import POOL_STOPPED, WORKER_DIED, record_job_error
from transformer_lab.app.sweeps import (
    RESUME_ENV,
    RETRY,
    SWEEP_FILE,
    append_row,
    job_dirs,
    job_row,
    latest_rows,
    previous_attempts,
)
from transformer_lab.results.run_directory import process_alive, read_json

BROKEN_POOL = (BrokenExecutor,)  # loky's TerminatedWorkerError is one


def settle_jobs(sweep_dir: Path, cause: BaseException) -> tuple[list[str], list[str], int]:
    """After the launcher's pool broke: the jobs whose worker died, the jobs it stopped
    (recorded ``error``, to run again), and how many jobs hold a final status (not those
    stopped); every job left with a final status and a row."""
    lost, stopped, finished = [], [], 0
    reason = (f"stopped when a worker process of the launcher died ({type(cause).__name__}); "
              "run again in the same sweep")
    rows = latest_rows(sweep_dir)
    here = socket.gethostname()
    for job_dir in job_dirs(sweep_dir):
        while (info := read_json(job_dir / "run.json")).get("status") == "running" \
                and info.get("host", here) == here and process_alive(info.get("pid")):
            time.sleep(0.2)  # until its process (on this host) has finished or is gone
        attempt = previous_attempts(job_dir) + 1
        has_row = rows.get(job_dir.name, {}).get("attempt") == str(attempt)
        if info.get("status") == "running":
            record_job_error(job_dir, reason, int(info.get("pid") or 0), **{POOL_STOPPED: True})
            stopped.append(job_dir.name)
        elif WORKER_DIED in info and not has_row:
            lost.append(job_dir.name)
        info = read_json(job_dir / "run.json")  # as recorded now
        finished += info.get("status") not in (None, "running") and not info.get(POOL_STOPPED)
        if not has_row:  # its worker died before writing it
            overrides_file = job_dir / ".hydra" / "overrides.yaml"
            overrides = [str(o) for o in OmegaConf.load(overrides_file)] \
                if overrides_file.exists() else []
            code = info.get("exit_code", 1)
            append_row(sweep_dir / SWEEP_FILE, job_row(job_dir.name, attempt, overrides, job_dir,
                                                       code if isinstance(code, int) else 1))
    return lost, stopped, finished


def summary(cause: BaseException, lost: list[str], stopped: list[str], again: bool) -> str:
    """The one line the sweep prints when its launcher broke."""
    first = (str(cause).strip().splitlines() or [""])[0]
    parts = [f"a worker process of the launcher died ({type(cause).__name__}: {first[:160]})"]
    if lost:
        parts.append(f"job {', '.join(lost)} recorded as error")
    if stopped:
        parts.append(f"job {', '.join(stopped)} stopped with it")
    parts.append("running the jobs it did not finish again" if again else
                 "giving up on the jobs it did not finish (tlab run --resume DIR runs them)")
    return "; ".join(parts)


def retry_arguments(arguments: Arguments) -> Arguments:
    """``arguments`` relaunched into the same sweep directory: finished jobs skipped, nothing
    rewritten inside their folders (``hydra.output_subdir=null``)."""
    dropped = (f"hydra.job.env_set.{RESUME_ENV}", "hydra.output_subdir")
    overrides = [o for o in arguments.overrides
                 if o.split("=", 1)[0].lstrip("+~") not in dropped]
    overrides += ["hydra.output_subdir=null", f"+hydra.job.env_set.{RESUME_ENV}={RETRY}"]
    return dataclasses.replace(arguments, overrides=overrides)
