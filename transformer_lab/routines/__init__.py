"""Routines: what a run does once its config is composed. ``routine.name`` picks one.

A routine is ``fn(cfg, run) -> RoutineOutcome``; it writes its tables into ``run`` and returns
whether it passed plus the numbers for ``summary.csv``. Registered here by import path so that
importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from transformer_lab.errors import ConfigError

ROUTINES: dict[str, str] = {
    "smoke": "transformer_lab.routines.smoke:run_smoke",
}


@dataclass
class RoutineOutcome:
    passed: bool
    summary: dict[str, Any] = field(default_factory=dict)  # summary.csv fields
    message: str = ""


def get_routine(name: str) -> Callable[..., RoutineOutcome]:
    if name not in ROUTINES:
        raise ConfigError(f"routine.name='{name}' is not known; valid: {', '.join(ROUTINES)}")
    module, function = ROUTINES[name].split(":")
    return getattr(import_module(module), function)
