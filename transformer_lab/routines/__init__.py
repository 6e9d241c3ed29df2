"""Routines: what a run does once its config is composed. ``routine.name`` picks one.

A routine is ``fn(cfg, run, inputs) -> RoutineOutcome``: ``inputs`` holds the task and the
model that the app built (once) in pre-flight; the routine writes its tables into ``run`` and
returns whether it passed plus the numbers for ``summary.csv``. Its module owns its settings:
``SETTINGS`` (a ``config.schema.Rule`` per ``routine.*`` key, checked by ``check_settings``
before anything is built) and ``check_config(cfg, inputs)`` for what ties them to the task or
the model (both before anything is written). Registered here by import path so that importing
this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from transformer_lab.errors import ConfigError

ROUTINES: dict[str, str] = {
    "smoke": "transformer_lab.routines.smoke:run_smoke",
    "train": "transformer_lab.routines.train:run_train",
    "budget": "transformer_lab.routines.budget:run_budget",
    "check": "transformer_lab.routines.check:run_check",
    "plot_pe": "transformer_lab.routines.plot_pe:run_plot_pe",
    "extrapolate": "transformer_lab.routines.extrapolate.routine:run_extrapolate",
    "reverse_task": "transformer_lab.routines.reverse_task:run_reverse_task",
    "compare": "transformer_lab.routines.compare:run_compare",
    "compare_activations": "transformer_lab.routines.compare:run_compare",
    "validate": "transformer_lab.routines.validate:run_validate",
    "mutants": "transformer_lab.routines.mutants:run_mutants",
}


@dataclass
class JobInputs:
    """What the app built once for a run, while validating its config, and hands to the
    routine: the task (``cfg.model.vocab_size`` taken from it) and the model of ``cfg``, built
    with ``build_model(cfg, seed=cfg.seed)`` and checked against the component protocols."""

    task: Any
    model: Any


@dataclass(frozen=True)
class Workload:
    """What a run holds in memory at once, for the pre-flight's estimate (``app.resources``):
    models, training batch, training length and the longest evaluation length."""

    models: int
    batch: int
    train_len: int
    eval_len: int


@dataclass
class RoutineOutcome:
    passed: bool
    summary: dict[str, Any] = field(default_factory=dict)  # summary.csv fields
    message: str = ""
    result: list[str] = field(default_factory=list)  # the final line's counts ("26 checks")


def get_routine(name: str) -> Callable[..., RoutineOutcome]:
    return getattr(routine_module(name), ROUTINES[name].split(":")[1])


def routine_module(name: str) -> Any:
    """The module of routine ``name`` (``ConfigError`` naming the valid ones)."""
    if name not in ROUTINES:
        raise ConfigError(f"routine.name='{name}' is not known; valid: {', '.join(ROUTINES)}")
    return import_module(ROUTINES[name].split(":")[0])


def check_settings(cfg: Any, name: str | None = None) -> None:
    """``ConfigError`` for the first ``routine.*`` key of ``cfg`` that breaks the rules of
    routine ``name`` (default: ``cfg.routine.name``), its module's ``SETTINGS``, or that they
    do not name (e.g. added with ``+routine.x=1``)."""
    from omegaconf import OmegaConf

    from transformer_lab.config.schema import check_keys, check_known

    name = name or OmegaConf.select(cfg, "routine.name", throw_on_missing=False)
    if name not in ROUTINES:
        return  # get_routine reports it
    module = routine_module(name)
    rules = getattr(module, "SETTINGS", {})
    check_keys(cfg, {f"routine.{key}": rule for key, rule in rules.items()})
    check_known(cfg, "routine", {"name", *(key.split(".")[0] for key in rules)})
    own = getattr(module, "check_values", None)  # values a rule cannot say (before any data)
    if own is not None:
        own(cfg)


def workload(cfg: Any, task: Any) -> Workload:
    """The routine's ``workload(cfg, task)`` where its module defines one, else one model
    trained at ``train.batch_size`` and the task's length."""
    length = int(task.model_seq_len)
    default = Workload(1, int(cfg.train.batch_size), length, length)
    name = cfg.routine.get("name")
    own = getattr(routine_module(name), "workload", None) if name in ROUTINES else None
    return default if own is None else own(cfg, task, default)


def check_routine(cfg: Any, inputs: JobInputs) -> None:
    """The routine's own pre-flight checks: its module may define ``check_config(cfg, inputs)``,
    which raises ``ConfigError`` for bad routine settings (called by the pre-flight, so bad
    input stops with exit 2 before anything is written)."""
    from omegaconf import OmegaConf

    name = OmegaConf.select(cfg, "routine.name", throw_on_missing=False)
    if name not in ROUTINES:
        return  # get_routine reports it
    check = getattr(import_module(ROUTINES[name].split(":")[0]), "check_config", None)
    if check is not None:
        check(cfg, inputs)
