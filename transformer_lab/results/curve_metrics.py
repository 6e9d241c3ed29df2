"""Numbers read off a training-loss curve: ``early_loss`` (mean over the first 10% of the steps)
and ``late_loss_std`` (std over the last 30%), for compare-activations and ``tlab report``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

EARLY_FRACTION = 0.1
LATE_FRACTION = 0.3
CURVE_METRICS = ("early_loss", "late_loss_std")


def _window(steps: Sequence[int], losses: Sequence[float], fraction: float,
            late: bool) -> list[float]:
    """The losses at the logged steps ``<= floor(fraction * T)`` (``late``: after them); the
    floor robust to 0.7 * 600 = 419.99999999999994."""
    end = math.floor(fraction * max(steps) + 1e-9) if steps else 0
    return [loss for step, loss in zip(steps, losses, strict=True) if (step > end) == late]


def early_loss(steps: Sequence[int], losses: Sequence[float]) -> float:
    """Mean loss over the logged steps ``<= floor(EARLY_FRACTION * T)`` (NaN if none)."""
    window = _window(steps, losses, EARLY_FRACTION, late=False)
    return statistics.fmean(window) if window else math.nan


def late_loss_std(steps: Sequence[int], losses: Sequence[float]) -> float:
    """Population std of the loss over the steps ``> floor((1 - LATE_FRACTION) * T)`` (2+)."""
    window = _window(steps, losses, 1.0 - LATE_FRACTION, late=True)
    return statistics.pstdev(window) if len(window) > 1 else math.nan


def curve_metric(name: str, steps: Sequence[int], losses: Sequence[float]) -> float:
    """The curve metric ``name`` (one of ``CURVE_METRICS``) of one curve."""
    return {"early_loss": early_loss, "late_loss_std": late_loss_std}[name](steps, losses)
