"""Routines: what a run does once its config is composed; ``routine.name`` picks one.

The protocol (``fn(spec, run, inputs) -> RoutineOutcome``, a module's ``SETTINGS`` and
``check_config``) is in docs/routines.md.
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
    "extrapolate": "transformer_lab.routines.extrapolate:run_extrapolate",
    "reverse_task": "transformer_lab.routines.reverse_task:run_reverse_task",
    "compare": "transformer_lab.routines.compare:run_compare",
    "compare_activations": "transformer_lab.routines.compare:run_compare",
    "validate": "transformer_lab.routines.validate:run_validate",
    "mutants": "transformer_lab.routines.mutants:run_mutants",
}


@dataclass
class JobInputs:
    """The run's typed spec (the model's vocabulary filled in from the task), and the task and
    model (checked) the pre-flight built once for the routine."""

    spec: Any  # config.spec.RunSpec
    task: Any
    model: Any


@dataclass(frozen=True)
class Workload:
    """What a run holds in memory at once, for the pre-flight's estimate (``app.resources``)."""

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
    # seeds.csv (written with 2+): per seed, the numbers a one-seed run of it puts in summary
    seeds: list[dict[str, Any]] = field(default_factory=list)


def get_routine(name: str) -> Callable[..., RoutineOutcome]:
    return getattr(routine_module(name), ROUTINES[name].split(":")[1])


def routine_module(name: str) -> Any:
    """The module of routine ``name`` (``ConfigError`` naming the valid ones)."""
    if name not in ROUTINES:
        raise ConfigError(f"routine.name='{name}' is not known; valid: {', '.join(ROUTINES)}")
    return import_module(ROUTINES[name].split(":")[0])


def own(name: Any, attribute: str) -> Any:
    """``attribute`` of routine ``name``'s module; None where it has none or the routine is
    unknown (``get_routine`` reports that)."""
    return getattr(routine_module(name), attribute, None) if name in ROUTINES else None


def check_settings(cfg: Any) -> None:
    """``ConfigError`` for the first ``routine.*`` key of the composed ``cfg`` that breaks or is
    not in the routine module's ``SETTINGS``."""
    from omegaconf import OmegaConf

    from transformer_lab.config.schema import check_keys, check_known

    rules = own(OmegaConf.select(cfg, "routine.name", throw_on_missing=False), "SETTINGS")
    if rules is None:
        return
    check_keys(cfg, {f"routine.{key}": rule for key, rule in rules.items()})
    check_known(cfg, "routine", {"name", *(key.split(".")[0] for key in rules)})


def check_values(spec: Any) -> None:
    """The routine module's ``check_values(spec)``: values a rule cannot say, before any data."""
    if (check := own(spec.routine.name, "check_values")) is not None:
        check(spec)


def check_unread(spec: Any, overrides: list[str]) -> None:
    """``ConfigError`` for a key on the command line the routine would not read: where its
    module's ``STEPS`` is ``None`` (it trains no model) any ``train.*`` or ``optimizer`` key but
    ``train.threads``; ``train.steps`` where ``STEPS`` names another training length; and
    ``train.checkpoint`` / ``train.checkpoint_every`` outside ``tlab train`` (the only routine
    that keeps checkpoints: ``KEEPS_CHECKPOINTS``)."""
    given = {text.lstrip("+~").split("=", 1)[0]: text.lstrip("+~") for text in overrides}
    name, module = spec.routine.name, routine_module(spec.routine.name)
    command = f"tlab {name.replace('_', '-')}"
    steps = getattr(module, "STEPS", "train.steps")
    for key, text in given.items():
        training = key.startswith(("train.", "optimizer.")) or key == "optimizer"
        if steps is None and training and key != "train.threads":
            raise ConfigError(f"{text} is not used by {command}: it trains no model")
    if "train.steps" in given and steps != "train.steps":
        raise ConfigError(f"{given['train.steps']} is not used by {command}: its training "
                          f"length is {steps}")
    for key in ("train.checkpoint", "train.checkpoint_every"):
        if key in given and not getattr(module, "KEEPS_CHECKPOINTS", False):
            raise ConfigError(f"{given[key]} is not used by {command}: only tlab train keeps "
                              "checkpoints")


def workload(spec: Any, task: Any) -> Workload:
    """The routine module's ``workload``, else one model at ``train.batch_size``."""
    length = int(task.model_seq_len)
    default = Workload(1, spec.train.batch_size, length, length)
    estimate = own(spec.routine.name, "workload")
    return default if estimate is None else estimate(spec, task, default)


def check_routine(spec: Any, inputs: JobInputs) -> None:
    """The routine module's ``check_config(spec, inputs)``, where it defines one."""
    if (check := own(spec.routine.name, "check_config")) is not None:
        check(spec, inputs)
