"""A sweep job in a forked child of the launcher's worker, so a signal that kills it fails one
job, not the sweep (``docs/cli.md``, "Sweeps")."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import EXIT_FAILED, EXIT_INTERRUPTED
from transformer_lab.processes import die_with_parent, flush_output, signal_name
from transformer_lab.results.console import print_error
from transformer_lab.results.run_directory import read_json

LAUNCHER_ENV = "TLAB_LAUNCHER_PID"  # the launching process's pid, set in every sweep job


def run_isolated(execute: Callable[[DictConfig, Path], int], cfg: DictConfig,
                 run_dir: Path) -> int:
    """``execute(cfg, run_dir)`` in a forked child when this is a launcher's worker process;
    the job's exit code, or ``EXIT_FAILED`` (recorded in ``run.json``) if a signal killed it."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if not hasattr(os, "fork") or launcher in (None, str(os.getpid())):
        return execute(cfg, run_dir)
    flush_output()
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: run the job, never return into the launcher's code
        code = EXIT_FAILED  # on any other exception (execute records its own errors)
        try:
            stop_with_worker(run_dir, worker)
            code = execute(cfg, run_dir)
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        finally:
            flush_output()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    signum = os.WTERMSIG(status)
    hint = {signal.SIGKILL: "; out of memory, or kill -9",
            signal.SIGSEGV: "; a crash in native code"}.get(signum, "")
    record_job_error(run_dir, f"the job's process (pid {pid}) was killed by "
                     f"{signal_name(signum)} (signal {signum}{hint})", pid, signal=signum)
    return EXIT_FAILED


WORKER_DIED = "worker_died"  # run.json key: the pid of the launcher worker that died under it
POOL_STOPPED = "stopped_with_pool"  # run.json key: stopped when another worker's death broke
#                                     the launcher's pool (run again by app.recovery)


def stop_with_worker(run_dir: Path, worker: int) -> None:
    """In a job's forked child (Linux): when its worker dies, record the job ``error`` naming
    the worker's death and exit, instead of running on as an orphan."""
    if not sys.platform.startswith("linux"):
        return

    def worker_died(signum: int, frame: object) -> None:
        record_job_error(run_dir, f"its worker process (pid {worker}) died (killed: kill -9, out "
                         "of memory, or a crash), so the job was stopped", os.getpid(),
                         **{WORKER_DIED: worker})
        flush_output()
        os._exit(EXIT_FAILED)

    signal.signal(signal.SIGUSR2, worker_died)
    if not die_with_parent(signal.SIGUSR2, worker):
        worker_died(signal.SIGUSR2, None)


def record_job_error(run_dir: Path, reason: str, pid: int, **extra: object) -> None:
    """Mark the run in ``run_dir`` ``error`` with ``reason`` and ``extra`` keys in ``run.json``."""
    print_error(f"{run_dir.name}: {reason}")
    info = read_json(run_dir / "run.json")
    info.update(status="error", error=reason, exit_code=EXIT_FAILED, **extra,
                end_time=datetime.now(timezone.utc).isoformat())
    info.setdefault("pid", pid)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(info, indent=2, default=str))
    except OSError as exc:
        print_error(f"{run_dir}: could not record it ({exc.strerror or exc})")


def save_hydra_files(cfg: DictConfig, run_dir: Path, subdir: str = ".hydra") -> None:
    """``<subdir>/{config,hydra,overrides}.yaml`` of the current Hydra job, as Hydra writes them
    (for a job run again in a resumed sweep, which runs with ``hydra.output_subdir=null``)."""
    hydra_cfg = HydraConfig.get()
    target = run_dir / subdir
    target.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, target / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": OmegaConf.to_container(hydra_cfg)}),
                   target / "hydra.yaml")
    OmegaConf.save(hydra_cfg.overrides.task, target / "overrides.yaml")
