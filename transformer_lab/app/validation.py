"""Checking a composed config once, before a run starts: sizes, settings, the task and the model
(built once, each component run at the task's length), then the routine's own settings. The
task and the model built here are handed to the routine (``JobInputs``): nothing is built twice.

Raises ``ConfigError`` with a one-line message naming the bad value (exit code 2).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import build_task
from transformer_lab.errors import ConfigError
from transformer_lab.routines import JobInputs, check_routine
from transformer_lab.training.threads import check_threads


def _positive(cfg: DictConfig, keys: list[str]) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            raise ConfigError(f"{key}={value} is not valid; it must be a positive number")


def validate_config(cfg: DictConfig) -> JobInputs:
    """Check sizes, build the task and the model once; return them for the routine.

    Raises ``ConfigError`` with a one-line message naming the bad value.
    """
    _positive(cfg, ["model.d_model", "model.n_heads", "model.n_layers", "model.d_ff",
                    "model.max_len", "train.steps", "train.batch_size", "train.lr",
                    "routine.steps", "routine.batch_size", "routine.n_batches",
                    "routine.seq_len", "routine.vocab_size", "routine.max_len",
                    "routine.measure_batch", "routine.train_steps"])
    m = cfg.model
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by "
                          f"model.n_heads={m.n_heads}")
    from transformer_lab.training.schedules import SCHEDULES

    if cfg.train.schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule='{cfg.train.schedule}' is not known; valid: "
                          f"{', '.join(SCHEDULES)}")
    if cfg.train.precision not in ("fp32", "bf16"):
        raise ConfigError(f"train.precision='{cfg.train.precision}' is not valid; use fp32 or bf16")
    _check_device(cfg.train.device)
    check_threads(cfg.train.get("threads"))
    task = build_task(cfg)
    inputs = JobInputs(task=task, model=_checked_model(cfg, task.model_seq_len))
    import torch

    with torch.random.fork_rng(devices=[]):
        check_routine(cfg, inputs)  # the routine's own settings (e.g. extrapolate's lengths)
    return inputs


def _check_device(device: str) -> None:
    import torch

    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ConfigError(f"train.device='{device}' is not valid; use cpu or cuda")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device='{device}' but torch sees no CUDA device; use cpu")


def _checked_model(cfg: DictConfig, seq_len: int) -> Any:
    """Build the run's model once, seeded with ``cfg.seed`` (errors name the group), and run
    each component at the task length (e.g. a learned PE asked for more positions than its
    table has). The checks draw from their own generator in eval mode, so the model and torch's
    global generator are left as a run that builds the model itself would have them."""
    import torch

    from transformer_lab.config.protocols import check_protocols
    from transformer_lab.model import build_model

    model = build_model(cfg, seed=cfg.seed)
    model.eval()  # e.g. BatchNorm's running statistics stay untouched
    with torch.random.fork_rng(devices=[]):
        check_protocols(cfg, model, seq_len)  # a user's own pe / FFN / norm plugs in (shapes)
    return model.train()
