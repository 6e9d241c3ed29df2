"""Numbers read off a training-loss curve: how low it starts and how much it shakes at the end.

    early_loss      mean training loss over the logged steps in the first ``EARLY_FRACTION``
                    (10%) of the run: steps 1 .. floor(0.1 T), T the last logged step
    late_loss_std   standard deviation (population) of the training loss over the logged steps
                    in the last ``LATE_FRACTION`` (30%): steps floor(0.7 T) + 1 .. T; the
                    oscillation figure (a still-falling curve adds its trend to it)

With ``train.log_every=1`` (compare-activations' default) every step counts; a coarser log uses
the logged steps in each window, and a window without one gives NaN (as does a late window with
fewer than two). ``compare-activations`` writes both per (activation, seed) to
``compare_runs.csv`` and their seed means to ``comparison.csv``; ``tlab report --metric
early_loss`` (or ``late_loss_std``) computes them from each run's ``metrics.csv``: one
definition, so the two agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

EARLY_FRACTION = 0.1
LATE_FRACTION = 0.3
CURVE_METRICS = ("early_loss", "late_loss_std")


def _window_end(last_step: int, fraction: float) -> int:
    """``floor(fraction * last_step)``, robust to 0.7 * 600 = 419.99999999999994."""
    return math.floor(fraction * last_step + 1e-9)


def early_loss(steps: Sequence[int], losses: Sequence[float]) -> float:
    """Mean loss over the logged steps ``<= floor(EARLY_FRACTION * T)`` (NaN if none)."""
    if not steps:
        return math.nan
    end = _window_end(max(steps), EARLY_FRACTION)
    window = [loss for step, loss in zip(steps, losses, strict=True) if step <= end]
    return statistics.fmean(window) if window else math.nan


def late_loss_std(steps: Sequence[int], losses: Sequence[float]) -> float:
    """Population std of the loss over the logged steps ``> floor((1 - LATE_FRACTION) * T)``
    (NaN with fewer than two)."""
    if not steps:
        return math.nan
    start = _window_end(max(steps), 1.0 - LATE_FRACTION)
    window = [loss for step, loss in zip(steps, losses, strict=True) if step > start]
    return statistics.pstdev(window) if len(window) > 1 else math.nan


def curve_metric(name: str, steps: Sequence[int], losses: Sequence[float]) -> float:
    """The curve metric ``name`` (one of ``CURVE_METRICS``) of one curve."""
    functions = {"early_loss": early_loss, "late_loss_std": late_loss_std}
    return functions[name](steps, losses)
