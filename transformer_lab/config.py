"""Composing and validating tlab's Hydra configs (the tree itself: ``config_tree``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config_tree import CONFIG_DIR, GROUPS, group_choices
from transformer_lab.errors import ConfigError
from transformer_lab.threads import check_threads

__all__ = ["CONFIG_DIR", "GROUPS", "build_task", "compose", "group_choices", "validate_config"]


def _div(a: int, b: int) -> int:
    return int(a) // int(b) if int(b) else 0


def register_resolvers() -> None:
    """``${tlab.div:a,b}`` integer division, ``${tlab.not:x}`` boolean negation."""
    if not OmegaConf.has_resolver("tlab.div"):
        OmegaConf.register_new_resolver("tlab.div", _div)
    if not OmegaConf.has_resolver("tlab.not"):
        OmegaConf.register_new_resolver("tlab.not", lambda x: not x)


register_resolvers()


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: Path = CONFIG_DIR,
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the config outside a Hydra app (tests, pre-flight checks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides),
                             return_hydra_config=return_hydra_config)


def _positive(cfg: DictConfig, keys: list[str]) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            raise ConfigError(f"{key}={value} is not valid; it must be a positive number")


def build_task(cfg: DictConfig) -> Any:
    """Instantiate ``cfg.task`` and copy its vocabulary size into ``cfg.model.vocab_size``."""
    from transformer_lab.model import instantiate_component
    from transformer_lab.tasks.language import LanguageModelTask

    task = instantiate_component(cfg, "task")
    if isinstance(task, LanguageModelTask) and not cfg.arch.causal:
        raise ConfigError(f"task={cfg.task.name} is next-token prediction and needs "
                          "arch=decoder (an encoder would see the token it must predict)")
    cfg.model.vocab_size = task.vocab_size
    return task


def validate_config(cfg: DictConfig) -> Any:
    """Check sizes, build the task and the model once; return the task.

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
    from transformer_lab.schedules import SCHEDULES

    if cfg.train.schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule='{cfg.train.schedule}' is not known; valid: "
                          f"{', '.join(SCHEDULES)}")
    if cfg.train.precision not in ("fp32", "bf16"):
        raise ConfigError(f"train.precision='{cfg.train.precision}' is not valid; use fp32 or bf16")
    _check_device(cfg.train.device)
    check_threads(cfg.train.get("threads"))
    task = build_task(cfg)
    _check_model(cfg, task.model_seq_len)
    from transformer_lab.routines import check_routine

    check_routine(cfg, task)  # the routine's own settings (e.g. extrapolate's lengths)
    return task


def _check_device(device: str) -> None:
    import torch

    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ConfigError(f"train.device='{device}' is not valid; use cpu or cuda")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device='{device}' but torch sees no CUDA device; use cpu")


def _check_model(cfg: DictConfig, seq_len: int) -> None:
    """Build the model once (errors name the group) and run each component at the task length
    (e.g. a learned PE asked for more positions than its table has)."""
    from transformer_lab.components.protocol import check_protocols
    from transformer_lab.model import build_model

    model = build_model(cfg)
    check_protocols(cfg, model, seq_len)  # a user's own pe / FFN / norm plugs in (shapes)
