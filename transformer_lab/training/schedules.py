"""Learning-rate schedules (``train.schedule``): step (1-based), train settings and the training's
length -> lr. ``noam`` is Vaswani et al. 2017, eq. 3 (docs/scale.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from transformer_lab.errors import ConfigError

if TYPE_CHECKING:
    from transformer_lab.config.spec import TrainSettings


def constant(step: int, train: TrainSettings, total_steps: int) -> float:
    return float(train.lr)


def noam(step: int, train: TrainSettings, total_steps: int) -> float:
    step = max(step, 1)
    warmup = max(int(train.warmup), 1)
    return float(train.noam_factor) * train.d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_cosine(step: int, train: TrainSettings, total_steps: int) -> float:
    lr, warmup, total = float(train.lr), int(train.warmup), int(total_steps)
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = float(train.min_lr_ratio) * lr
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


SCHEDULES: dict[str, Callable[[int, TrainSettings, int], float]] = {
    "constant": constant,
    "noam": noam,
    "warmup_cosine": warmup_cosine,
}


def schedule(name: str) -> Callable[[int, TrainSettings, int], float]:
    """The schedule ``train.schedule`` names (``ConfigError`` naming the valid ones)."""
    if name not in SCHEDULES:
        raise ConfigError(f"train.schedule='{name}' is not known; valid: {', '.join(SCHEDULES)}")
    return SCHEDULES[name]
