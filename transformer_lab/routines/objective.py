"""The number a routine hands to a hyper-parameter search (``hydra/sweeper=optuna``): a module's
``OBJECTIVE`` (docs/routines.md)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError

UNSOLVED_PENALTY = 2.0  # x routine.max_steps: an unsolved reversal ranks after every solved one


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # "minimize" | "maximize"
    value: Callable[[RunSpec, Path, Mapping[str, Any]], float]


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def final_loss(spec: RunSpec, run_dir: Path, summary: Mapping[str, Any]) -> float:
    """The run's held-out (smoke: training) loss at its last step."""
    return _float(summary.get("final_loss"))


def steps_to_solve(spec: RunSpec, run_dir: Path, summary: Mapping[str, Any]) -> float:
    """Steps until held-out exact match reached the target; unsolved: a penalty."""
    solved = _float(summary.get("solved_step"))
    return UNSOLVED_PENALTY * float(spec.routine.max_steps) if math.isnan(solved) else solved


def chosen_variant_loss(spec: RunSpec, run_dir: Path, summary: Mapping[str, Any]) -> float:
    """``final_loss`` in ``comparison.csv`` of the run's ``ffn`` (else the first row)."""
    try:
        with (run_dir / "comparison.csv").open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return final_loss(spec, run_dir, summary)
    chosen = str(spec.model.ffn.name)
    row = next((r for r in rows if r.get("activation") == chosen), rows[0] if rows else {})
    return _float(row.get("final_loss"))


def objective_for(routine: str) -> Objective | None:
    """The ``OBJECTIVE`` that routine ``routine`` declares (None if it declares none)."""
    from transformer_lab.routines import ROUTINES

    module = ROUTINES[routine].split(":")[0] if routine in ROUTINES else None
    return getattr(import_module(module), "OBJECTIVE", None) if module else None


def require_objective(routine: str) -> Objective:
    """``objective_for``, or a ``ConfigError`` naming the routines that have one."""
    from transformer_lab.routines import ROUTINES

    objective = objective_for(routine)
    if objective is None:
        searchable = [name for name in ROUTINES if objective_for(name) is not None]
        raise ConfigError(f"hydra/sweeper=optuna: routine '{routine}' returns no objective; "
                          f"searchable: {', '.join(searchable)}")
    return objective


def objective_value(spec: RunSpec, run_dir: Path, summary: Mapping[str, Any]) -> dict | None:
    """``{"name", "direction", "value"}`` for ``run.json``, or None without an objective."""
    objective = objective_for(spec.routine.name)
    return None if objective is None else {"name": objective.name,
                                           "direction": objective.direction,
                                           "value": objective.value(spec, run_dir, summary)}
