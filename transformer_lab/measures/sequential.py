"""The anytime-valid paired test of ``--seeds auto`` (a sequential sign-flip test by betting:
a test martingale per variant and side, Ville's inequality, e-value Bonferroni over variants, a
confidence sequence by inverting the tests). The construction and its references:
docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from transformer_lab.measures.statistics import BETTER, STOPPED_VERDICT, WORSE

BETS = np.linspace(0.05, 0.95, 19)  # the bet fractions lam, mixed with equal weight per side
SCALE_QUANTILE = 0.75                # a seed at or above this quantile of |d| bets fully
STOPPED_MAX_SEEDS = "max_seeds"      # MAX paired seeds without a verdict
_REFINEMENTS, _REFINED = 5, 33  # rounds, shifts per round between the last kept and first out
_GRID = np.linspace(-3.0, 3.0, 241)  # shifts tried around the median, in units of the spread


def _weights(magnitudes: np.ndarray, looks: Sequence[int]) -> np.ndarray:
    """``min(1, |d_i| / q)`` per difference, ``q`` the upper quartile of ``|d_1..d_t|`` and
    ``t`` the end of its group; (..., n) -> (..., n). ``q = 0`` (most differences exactly 0)
    gives weight 1."""
    weights = np.ones_like(magnitudes)
    start = 0
    for end in looks:
        scale = np.quantile(magnitudes[..., :end], SCALE_QUANTILE, axis=-1,
                            keepdims=True)  # (..., 1)
        block = magnitudes[..., start:end]
        weights[..., start:end] = np.minimum(1.0, np.divide(
            block, scale, out=np.ones_like(block), where=scale > 0))
        start = end
    return weights


def e_process(differences: np.ndarray, looks: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The mixture wealth betting on positive (``up``) and negative (``down``) differences after
    each group (``looks``: differences seen by its end, increasing to ``n``); (..., n) -> two
    (..., len(looks)); the two-sided e-value is their mean. No NaN allowed."""
    differences = np.asarray(differences, dtype=float)
    if not len(looks) or looks[-1] != differences.shape[-1] or min(np.diff(looks, prepend=0)) < 1:
        raise ValueError(f"looks {list(looks)} must increase to the {differences.shape[-1]} "
                         "differences")
    payoff = np.sign(differences) * _weights(np.abs(differences), looks)  # (..., n) in [-1, 1]
    at_looks = np.asarray(looks) - 1
    sides = []
    for side in (1.0, -1.0):
        log_wealth = np.cumsum(np.log1p(side * payoff[..., None] * BETS), axis=-2)  # (..., n, B)
        sides.append(np.exp(log_wealth[..., at_looks, :]).mean(axis=-1))  # (..., looks)
    return sides[0], sides[1]


def first_crossing(e_values: np.ndarray, threshold: float) -> np.ndarray:
    """Index of the first group whose e-value reaches ``threshold``, -1 where none does;
    (..., looks) -> (...)."""
    crossed = np.asarray(e_values) >= threshold
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1), -1)


def confidence_sequence(differences: Sequence[float] | np.ndarray, looks: Sequence[int],
                        alpha: float) -> tuple[float, float]:
    """(low, high): the hull of the shifts ``m`` whose two-sided e-value of ``d_i - m`` stayed
    below ``1 / alpha`` at every group (``+/-inf``: none that far excluded yet; ``nan``: every
    shift excluded). How it is searched: docs/statistics.md."""
    d = np.asarray(differences, dtype=float)
    threshold = 1 / alpha

    def excluded(shifts: np.ndarray) -> np.ndarray:
        up, down = e_process(d[None, :] - shifts[:, None], looks)  # (shifts, looks)
        return ((up + down) / 2).max(axis=-1) >= threshold

    centre = float(np.median(d))
    spread = float(d.max() - d.min()) or (abs(centre) or 1.0)
    grid = centre + spread * _GRID
    inside = np.flatnonzero(~excluded(grid))
    if not len(inside):
        return math.nan, math.nan
    # a shift far beyond the data: every d_i - m has the same sign and weight 1
    n = np.asarray(looks, dtype=float)[:, None]
    far_excluded = bool((((1 + BETS) ** n + (1 - BETS) ** n).mean(axis=-1) / 2 >= threshold).any())
    ends = []
    for side, index in ((-1, inside[0]), (1, inside[-1])):
        kept, neighbour = float(grid[index]), index + side
        if 0 <= neighbour < len(grid):
            out = float(grid[neighbour])
        elif not far_excluded:
            ends.append(side * math.inf)
            continue
        else:  # kept at the grid's end: step outward, doubling, until a shift is excluded
            step = side * spread
            while math.isfinite(kept + step) and not excluded(np.array([kept + step]))[0]:
                kept, step = kept + step, 2 * step
            out = kept + step
            if math.isinf(out):  # no shift excluded before the floats run out
                ends.append(out)
                continue
        for _ in range(_REFINEMENTS):  # the last kept and first excluded shift, ever closer
            between = np.linspace(kept, out, _REFINED)
            first_out = int(np.argmax(excluded(between)))  # between[-1] == out is excluded
            kept, out = float(between[first_out - 1]), float(between[first_out])
        ends.append(kept)
    return ends[0], ends[1]


class SequentialTest:
    """Every variant against ``baseline`` as groups of paired seeds arrive (``update``): decided
    (final) once its e-value reaches ``K / alpha``, stopped without a verdict at ``max_seeds``
    (None: no cap); NaN differences are dropped and counted in ``dropped``."""

    design = "anytime-valid"

    def __init__(self, variants: Sequence[str], baseline: str, alpha: float = 0.05,
                 max_seeds: int | None = None, lower_is_better: bool = True) -> None:
        self.variants = [v for v in variants if v != baseline]
        if not self.variants:
            raise ValueError(f"no variant to test against the baseline '{baseline}'")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha={alpha} must lie strictly between 0 and 1")
        self.baseline, self.alpha, self.max_seeds = baseline, alpha, max_seeds
        self.lower_is_better = lower_is_better
        self.threshold = len(self.variants) / alpha
        self._differences: dict[str, list[float]] = {v: [] for v in self.variants}
        self._looks: dict[str, list[int]] = {v: [] for v in self.variants}
        self._decided: dict[str, str] = {}
        self.dropped: dict[str, int] = dict.fromkeys(self.variants, 0)

    def update(self, differences: Mapping[str, Sequence[float]]) -> None:
        """One group: per variant, the new seeds' ``variant - baseline`` (a variant may be
        absent: no new seed; a decided or capped one is ignored)."""
        for name, values in differences.items():
            if name not in self._differences:
                raise ValueError(f"'{name}' is not a variant of this test; valid: "
                                 f"{', '.join(self.variants)}")
            if not self._running(name):
                continue
            values = np.asarray(values, dtype=float).ravel()
            finite = values[~np.isnan(values)]
            self.dropped[name] += len(values) - len(finite)
            if self.max_seeds is not None:
                finite = finite[:self.max_seeds - len(self._differences[name])]
            if not len(finite):
                continue
            self._differences[name] += finite.tolist()
            self._looks[name].append(len(self._differences[name]))
            higher = self._crossed(name)
            if higher is not None:
                self._decided[name] = WORSE if higher == self.lower_is_better else BETTER

    def _crossed(self, name: str) -> bool | None:
        """After the variant's latest group: None while undecided, else whether the variant is
        higher than the baseline (the e-value reached the threshold)."""
        up, down = e_process(np.asarray(self._differences[name]), self._looks[name])
        if (up[-1] + down[-1]) / 2 < self.threshold:
            return None
        return bool(up[-1] >= down[-1])

    def statistics(self, variant: str) -> dict[str, float | None]:
        """``comparison.csv``'s ``p_value`` (1 / e-value), ``p_adjusted`` (K / e-value), both
        anytime-valid, and ``e_value``."""
        e_value = self.e_value(variant)
        return {"p_value": min(1.0, 1 / e_value), "e_value": e_value,
                "p_adjusted": min(1.0, len(self.variants) / e_value)}

    def update_values(self, values: Mapping[str, Sequence[float]]) -> None:
        """One group as each name's values, the baseline's included (position i: one seed)."""
        if self.baseline not in values:
            raise ValueError(f"the group has no values for the baseline '{self.baseline}'")
        base = np.asarray(values[self.baseline], dtype=float)
        self.update({name: np.asarray(v, dtype=float) - base
                     for name, v in values.items() if name != self.baseline})

    def _running(self, name: str) -> bool:
        capped = self.max_seeds is not None and self.seeds_used(name) >= self.max_seeds
        return name not in self._decided and not capped

    def verdict(self, variant: str) -> str | None:
        """``better`` / ``worse`` once decided, else None."""
        return self._decided.get(variant)

    def e_value(self, variant: str) -> float:
        """The two-sided e-value after the variant's last group (1 before any seed)."""
        if not self._looks[variant]:
            return 1.0
        up, down = e_process(np.asarray(self._differences[variant]), self._looks[variant])
        return float((up[-1] + down[-1]) / 2)

    def interval(self, variant: str) -> tuple[float, float]:
        """The confidence sequence for the paired difference's centre at level ``alpha / K``
        (simultaneous over the variants): ``(-inf, inf)`` before any seed."""
        if not self._looks[variant]:
            return -math.inf, math.inf
        return confidence_sequence(self._differences[variant], self._looks[variant],
                                   self.alpha / len(self.variants))

    def seeds_used(self, variant: str) -> int:
        """Paired seeds taken by the variant (up to its verdict)."""
        return len(self._differences[variant])

    def stopped_because(self, variant: str) -> str:
        """``verdict``, ``max_seeds``, or ``""`` while the variant still takes seeds."""
        if variant in self._decided:
            return STOPPED_VERDICT
        return "" if self._running(variant) else STOPPED_MAX_SEEDS

    def describe(self, variant: str) -> str:
        """The variant's e-value against the verdict threshold, for console lines and notes."""
        return f"e-value {self.e_value(variant):.3g} (a verdict at {self.threshold:.3g})"

    def running(self) -> list[str]:
        """The variants that still take seeds (the next group trains these and the baseline)."""
        return [v for v in self.variants if self._running(v)]

    def done(self) -> bool:
        """True when no variant takes more seeds (each decided or at ``max_seeds``)."""
        return not self.running()
