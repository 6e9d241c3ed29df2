"""Run one job in its run directory and record its status (``passed``, ``failed``,
``diverged``, ``error``, ``interrupted``) and exit code."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from transformer_lab.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    Diverged,
)
from transformer_lab.results.console import print_error, print_final_line
from transformer_lab.results.run_directory import SUMMARY_COLUMNS, RunDirectory
from transformer_lab.routines import JobInputs, get_routine
from transformer_lab.routines.objective import objective_value
from transformer_lab.training.threads import torch_threads


def summary_row(cfg: DictConfig, **numbers: Any) -> dict[str, Any]:
    """The component choices and sizes of ``cfg`` plus the routine's numbers."""
    m = cfg.model
    return {
        "routine": cfg.routine.name, "arch": "decoder" if cfg.arch.causal else "encoder",
        "pe": cfg.pe.get("name"), "norm": cfg.block.get("name"),
        "norm_layer": cfg.norm_layer.get("name"), "activation": cfg.ffn.get("name"),
        "d_model": m.d_model, "n_heads": m.n_heads, "n_layers": m.n_layers, "d_ff": m.d_ff,
        "seq_len": cfg.task.get("seq_len"), "vocab_size": m.vocab_size, "seed": cfg.seed,
        **numbers,
    }


def execute(cfg: DictConfig, run_dir: Path, inputs: JobInputs | None = None) -> int:
    """Run ``cfg.routine.name`` in ``run_dir``; the exit code. ``inputs``: what the pre-flight
    built (a single run); without them (a sweep's job) the pre-flight runs here."""
    from transformer_lab.app.preflight import preflight

    try:
        run = RunDirectory.create(run_dir, cfg)
    except ConfigError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    status, error, code, numbers, result = "error", None, EXIT_FAILED, {}, []
    started = time.perf_counter()
    try:
        if inputs is None:
            inputs = preflight(cfg)  # also fills in model.vocab_size from the task
        with torch_threads(cfg.train.get("threads")):
            run.info["threads"] = cfg.train.get("threads") or run.info["threads"]
            outcome = get_routine(cfg.routine.name)(inputs.spec, run, inputs)
        numbers, result = outcome.summary, outcome.result
        if len(outcome.seeds) > 1:
            run.write_table("seeds", outcome.seeds)
        status, code = ("passed", EXIT_OK) if outcome.passed else ("failed", EXIT_FAILED)
        run.info["objective"] = objective_value(inputs.spec, run.path, numbers)  # for a search
        error = None if outcome.passed else outcome.message or None
    except ConfigError as exc:
        error, code = str(exc), EXIT_USAGE
        print_error(error)
    except Diverged as exc:
        status, error, code = "diverged", str(exc), EXIT_FAILED
        print_error(f"run diverged: {exc}; rows so far are kept in {run.path / 'metrics.csv'}")
    except KeyboardInterrupt as exc:  # Ctrl-C, or ``Interrupted`` (SIGINT/SIGTERM, state kept)
        status, error = "interrupted", str(exc) or "interrupted by the user"
        code = getattr(exc, "exit_code", EXIT_INTERRUPTED)
        raise
    except Exception as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if isinstance(exc, OSError):  # disk full, an I/O error: the reason, not a traceback
            error = f"I/O error: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename
                                                           else "")
            print_error(f"{error}; rows written so far are kept in {run.path}")
        else:
            error = f"{type(exc).__name__}: {exc}"
            print_error(f"{error} (set HYDRA_FULL_ERROR=1 for the traceback)")
    finally:
        _record(run, cfg, numbers, status, error, code)
        if status != "interrupted":  # the routine's counts, else summary.csv's final numbers
            result = result or [f"{label} {float(numbers[key]):.4g}"
                                for key, label in FINAL_NUMBERS.items()
                                if isinstance(numbers.get(key), int | float)]
            print_final_line(str(cfg.routine.name).replace("_", "-"), FINAL_STATUS[status],
                             result, time.perf_counter() - started)
    return code


FINAL_STATUS = {"passed": "PASS", "failed": "FAIL", "diverged": "DIVERGED", "error": "ERROR"}
FINAL_NUMBERS = {"final_loss": "held-out loss", "final_ppl": "ppl",
                 "final_exact_match": "exact match"}


def _record(run: RunDirectory, cfg: DictConfig, numbers: dict[str, Any], status: str,
            error: str | None, code: int) -> None:
    """Write the config, summary row and final ``run.json``; a failed write (a full disk) is one
    line and makes the run ``error``."""
    try:
        run.write_config()
        row = summary_row(cfg, **numbers, status=status, error=error)
        run.write_table("summary", [row], SUMMARY_COLUMNS)
    except OSError as exc:
        reason = f"I/O error: {exc.strerror or exc}"
        if status != "error":
            print_error(f"{reason}; the run's files are incomplete in {run.path}")
        status, error, code = "error", error or reason, max(code, EXIT_FAILED)
    try:
        run.finish(status, error, exit_code=code)
    except OSError as exc:
        print_error(f"run.json could not be written ({exc.strerror or exc}); status {status}")
