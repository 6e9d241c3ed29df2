"""The planned group-sequential design of ``--seeds auto:MAX`` (Lan & DeMets 1983; Jennison &
Turnbull 2000, ch. 7-8): each variant's sum of paired differences is read after every seed up to
MAX against a boundary from the sign-flip null law of the magnitudes seen (a sequential
permutation test), each look spending its share of ``alpha / K`` by an alpha-spending function;
a look spends what earlier looks could not (their discrete levels). docs/statistics.md; the
measured costs: README, "A planned design".
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import numpy as np

from transformer_lab.measures.sequential import SequentialTest

DEFAULT_SPENDING = "obrien_fleming"
_GRID = 401  # points per look in the numerical integration


def spending(name: str, alpha: float) -> Callable[[float], float]:
    """The alpha-spending function ``name`` (``obrien_fleming``, ``pocock``, ``hsd:G``):
    information fraction in [0, 1] -> the level spent up to it (0 at 0, ``alpha`` at 1)."""
    from scipy import stats

    if name == "obrien_fleming":  # each side spends alpha / 2 (as gsDesign's sfLDOF)
        z = stats.norm.isf(alpha / 4)
        return lambda t: 0.0 if t <= 0 else float(4 * stats.norm.sf(z / math.sqrt(min(t, 1.0))))
    if name == "pocock":
        return lambda t: float(alpha * math.log(1 + (math.e - 1) * min(t, 1.0)))
    g = math.nan
    if name.startswith("hsd:"):
        with contextlib.suppress(ValueError):
            g = float(name.removeprefix("hsd:"))
    if g == 0:
        return lambda t: float(alpha * min(t, 1.0))
    if math.isfinite(g):
        return lambda t: float(alpha * (1 - math.exp(-g * min(t, 1.0))) / (1 - math.exp(-g)))
    raise ValueError(f"spending function '{name}': valid are obrien_fleming, pocock and hsd:G "
                     "(G a number, e.g. hsd:-4)")


SIGN_DRAWS = 20_000  # random sign vectors per test: the boundaries' null law


def increments(looks: Sequence[int], max_seeds: int, alpha: float,
               spend: str = "obrien_fleming") -> np.ndarray:
    """The level each look spends (seeds seen at each: ``looks``) in a design planned to
    ``max_seeds``; (looks,) -> (looks,), summing to at most ``alpha``."""
    spent = spending(spend, alpha)
    fractions = np.minimum(np.asarray(looks, dtype=float) / max_seeds, 1.0)
    return np.diff([0.0, *(spent(t) for t in fractions)])


def sign_draws(max_seeds: int, draws: int = SIGN_DRAWS, seed: int = 0) -> np.ndarray:
    """(draws, max_seeds) signs +/-1 for every look: all 2^max_seeds patterns when there are at
    most ``draws`` (exact boundaries), else random ones from a fixed seed."""
    if 2 ** max_seeds <= draws:
        patterns = np.arange(2 ** max_seeds)[:, None] >> np.arange(max_seeds)  # (2^n, n)
        return np.where(patterns & 1, -1.0, 1.0)
    return np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, max_seeds))


def sign_flip_boundaries(magnitudes: np.ndarray, looks: Sequence[int], spent: np.ndarray,
                         signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries on ``|sum of the first n_k differences|`` at each look (``inf``: no verdict
    there) and each look's nominal level, from the magnitudes ``|d_i|`` (..., n), the null sign
    draws (draws, >= n) and each look's ``spent`` level; two arrays of shape (..., looks)."""
    magnitudes = np.asarray(magnitudes, dtype=float)
    draws = len(signs)
    n = looks[-1]
    running = np.cumsum(signs[:, :n] * magnitudes[..., None, :n], axis=-1)  # (..., draws, n)
    sums = running[..., np.asarray(looks) - 1]  # (..., draws, looks)
    sums = np.abs(np.round(sums, 12))  # equal sums reached in another order stay equal
    bounds = np.full((*magnitudes.shape[:-1], len(looks)), np.inf)
    levels = np.zeros_like(bounds)
    active = np.ones(sums.shape[:-1], dtype=bool)  # (..., draws) not crossed yet
    for k, spent_so_far in enumerate(np.cumsum(spent)):
        # draws that may first cross here: the level spent so far less those crossed before
        allowed = np.floor(spent_so_far * draws + 1e-9) - (~active).sum(axis=-1)  # (...)
        values = np.where(active, sums[..., k], -np.inf)  # (..., draws)
        ordered = np.concatenate([-np.sort(-values, axis=-1),
                                  np.full((*values.shape[:-1], 1), -np.inf)], axis=-1)
        # the smallest boundary whose first crossings (|sum| >= c among the active) number
        # at most ``allowed``: the allowed-th largest value, raised past a tie
        index = np.clip(allowed.astype(int) - 1, 0, draws - 1)[..., None]
        candidate = np.take_along_axis(ordered, index, axis=-1)[..., 0]  # (...)
        beyond = np.take_along_axis(ordered, index + 1, axis=-1)[..., 0]
        above = np.where(values > candidate[..., None], values, np.inf).min(axis=-1)
        bound = np.where(beyond >= candidate, above, candidate)
        bounds[..., k] = np.where((allowed >= 1) & (bound > 0), bound, np.inf)
        beyond_bound = sums[..., k] >= bounds[..., k][..., None]  # (..., draws)
        levels[..., k] = beyond_bound.mean(axis=-1)
        active &= ~beyond_bound
    return bounds, levels


class GroupSequentialTest(SequentialTest):
    """``SequentialTest`` with each variant a group-sequential design at ``alpha / K`` planned
    to ``max_seeds`` (the module docstring): its own decision, ``interval`` and ``statistics``."""

    design = "group-sequential"

    def __init__(self, variants: Sequence[str], baseline: str, max_seeds: int,
                 alpha: float = 0.05, spend: str = DEFAULT_SPENDING,
                 lower_is_better: bool = True) -> None:
        super().__init__(variants, baseline, alpha, max_seeds, lower_is_better)
        spending(spend, alpha)  # a bad name fails here
        self.spend = spend
        self.level = alpha / len(self.variants)  # each variant's design
        self._signs = sign_draws(max_seeds)
        self._bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # at the latest look

    def _crossed(self, name: str) -> bool | None:
        looks = self._looks[name]
        spent = increments(looks, self.max_seeds, self.level, self.spend)
        self._bounds[name] = sign_flip_boundaries(np.abs(self._differences[name]), looks,
                                                  spent, self._signs)
        total = float(np.sum(self._differences[name]))
        if abs(round(total, 12)) < self._bounds[name][0][-1]:
            return None
        return total > 0

    def nominal_level(self, variant: str) -> float:
        """The nominal two-sided level of the variant's last look (0 before any seed)."""
        return float(self._bounds[variant][1][-1]) if variant in self._bounds else 0.0

    def p_value(self, variant: str) -> float:
        """The sign-flip p-value of the variant's sum at its last look (the share of the
        null sign draws at least as far from 0)."""
        d = np.asarray(self._differences[variant])
        if not len(d):
            return 1.0
        sums = np.abs(np.round(self._signs[:, :len(d)] @ np.abs(d), 12))  # (draws,)
        return float((sums >= abs(round(float(d.sum()), 12))).mean())

    def statistics(self, variant: str) -> dict[str, float | None]:
        """``p_value`` (the sign-flip p at the last look), ``p_adjusted`` (that p scaled so
        that it is at most alpha exactly when the look's boundary was crossed), no e-value."""
        p_value, level = self.p_value(variant), self.nominal_level(variant)
        return {"p_value": p_value, "e_value": None,
                "p_adjusted": min(1.0, p_value * self.alpha / level) if level > 0 else 1.0}

    def interval(self, variant: str) -> tuple[float, float]:
        """The repeated confidence interval for the mean difference at the last look (the t
        interval at the look's nominal level; unbounded while no verdict is possible)."""
        from scipy import stats

        d = np.asarray(self._differences[variant])
        level = self.nominal_level(variant)
        if len(d) < 2 or level <= 0:
            return -math.inf, math.inf
        half = stats.t.isf(level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        return float(d.mean() - half), float(d.mean() + half)

    def describe(self, variant: str) -> str:
        """One line of the variant's state, for the running console lines and the notes."""
        level = self.nominal_level(variant)
        at = f"a verdict at p <= {level:.3g}" if level > 0 else "no verdict possible yet"
        return (f"sign-flip p {self.p_value(variant):.3g} ({at}; {self.spend} spending of "
                f"{self.level:.3g} to {self.max_seeds} seeds)")
