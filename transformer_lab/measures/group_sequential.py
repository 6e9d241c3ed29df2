"""A planned group-sequential design over seeds (``--seeds auto:MAX``): the paired test of every
variant against the baseline is read after each group of seeds up to ``MAX``, each look spending
a share of ``alpha`` given by an alpha-spending function, so that the false-positive rate over
all looks is at most ``alpha`` (Lan & DeMets 1983, "Discrete sequential boundaries for clinical
trials"; Jennison & Turnbull 2000, "Group Sequential Methods", ch. 7).

Where the anytime-valid test (``measures.sequential``) may go on for ever and so pays for it in
seeds, this design knows its last look (``MAX``): a boundary that spends almost nothing early
(O'Brien & Fleming's shape) and nearly all of ``alpha`` at ``MAX`` costs a fixed design of
``MAX`` seeds little power, and stops early when the effect is large.

- **Statistic**: the sum of the paired differences ``d_i = variant - baseline`` seen so far,
  as in the fixed sign-flip test of ``measures.statistics``.
- **Boundary, conditional on the magnitudes** (a sequential permutation test): under H0 (a
  seed's variant and baseline values exchangeable) the signs of the ``d_i`` are fair coins
  given their magnitudes. With the magnitudes seen up to look k, ``SIGN_DRAWS`` random sign
  vectors (one fixed draw per test) give the null law of the sums at looks 1..k; look k's
  boundary ``c_k`` on ``|sum|`` is the smallest value at which the share of draws that first
  cross at look k does not exceed the level spent there. A boundary depends only on the
  magnitudes before it, so the design keeps ``alpha`` for any law of the magnitudes, as the
  fixed sign-flip test does (Jennison & Turnbull ch. 8 for permutation group-sequential tests).
- **Spending**: the level spent by look k is ``spend(t_k) - spend(t_{k-1})`` at information
  fraction ``t_k = n_k / MAX``: ``obrien_fleming`` ``4 - 4 Phi(z_{a/4} / sqrt(t))`` (each side
  O'Brien-Fleming-like at ``a / 2``, as gsDesign's sfLDOF), ``pocock``
  ``a log(1 + (e - 1) t)``, ``hsd:G`` Hwang, Shih & DeCani ``a (1 - e^{-G t}) / (1 - e^{-G})``.
  ``z_boundaries`` gives the normal-theory boundaries of the same spending (the published
  tables' values), which the permutation boundaries approach as the seeds grow.
- **K variants**: Bonferroni, each variant's design at ``alpha / K``.
- **Interval**: a repeated confidence interval at the last look, the t interval
  ``mean +/- t_{n-1}(1 - a_k / 2) sd / sqrt(n)`` at the look's nominal level ``a_k`` (the share
  of sign draws beyond its boundary): an approximation, the verdict is the sum's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from transformer_lab.measures.sequential import STOPPED_MAX_SEEDS, STOPPED_VERDICT
from transformer_lab.measures.statistics import BETTER, WORSE

SPENDING_FUNCTIONS = ("obrien_fleming", "pocock", "hsd:G")
_GRID = 401  # points per look in the numerical integration


def _stats():
    from scipy import stats

    return stats


def spending(name: str, alpha: float) -> Callable[[float], float]:
    """The alpha-spending function ``name`` (``SPENDING_FUNCTIONS``): information fraction in
    [0, 1] -> the level spent up to it (0 at 0, ``alpha`` at 1)."""
    stats = _stats()
    if name == "obrien_fleming":  # each side spends alpha / 2 (as gsDesign's sfLDOF)
        z = stats.norm.isf(alpha / 4)
        return lambda t: 0.0 if t <= 0 else float(4 * stats.norm.sf(z / math.sqrt(min(t, 1.0))))
    if name == "pocock":
        return lambda t: float(alpha * math.log(1 + (math.e - 1) * min(t, 1.0)))
    head, _, gamma = name.partition(":")
    if head == "hsd" and gamma:
        try:
            g = float(gamma)
        except ValueError:
            g = math.nan
        if math.isfinite(g):
            if g == 0:
                return lambda t: float(alpha * min(t, 1.0))
            return lambda t: float(alpha * (1 - math.exp(-g * min(t, 1.0)))
                                   / (1 - math.exp(-g)))
    raise ValueError(f"spending function '{name}': valid are obrien_fleming, pocock and hsd:G "
                     "(G a number, e.g. hsd:-4)")


def z_boundaries(fractions: Sequence[float], alpha: float,
                 spend: str = "obrien_fleming") -> np.ndarray:
    """Two-sided z boundaries ``c_k`` at the information ``fractions`` (increasing, in (0, 1])
    such that under H0 the chance of a first crossing ``|Z_k| >= c_k`` at look k is the level
    spent there. (looks,) -> (looks,)."""
    stats = _stats()
    from scipy.optimize import brentq

    spent = spending(spend, alpha)
    fractions = np.asarray(fractions, dtype=float)
    boundaries = np.empty(len(fractions))
    grid = density = None  # the sub-density of S_k = Z_k sqrt(t_k) on the continuation region
    previous_t, previous_spent = 0.0, 0.0
    for k, t in enumerate(fractions):
        target = max(spent(t) - previous_spent, 0.0)
        previous_spent += target
        if grid is None:
            c = float(stats.norm.isf(target / 2)) if target > 0 else math.inf
        else:
            sd = math.sqrt(t - previous_t)
            weights = density * _simpson(grid)  # (grid,) probability mass per point

            crossing = functools.partial(_crossing_minus_target, grid=grid, weights=weights,
                                         sd=sd, t=t, target=target)
            c = math.inf if target <= 0 or crossing(40.0) > 0 else brentq(crossing, 1e-6, 40.0,
                                                                           xtol=1e-10)
        boundaries[k] = c
        edge = min(c, 40.0) * math.sqrt(t)
        new_grid = np.linspace(-edge, edge, _GRID)
        if grid is None:
            density = stats.norm.pdf(new_grid / math.sqrt(t)) / math.sqrt(t)
        else:
            sd = math.sqrt(t - previous_t)
            kernel = stats.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd  # (new, old)
            density = kernel @ (density * _simpson(grid))
        grid, previous_t = new_grid, t
    return boundaries


def _crossing_minus_target(c: float, grid: np.ndarray, weights: np.ndarray, sd: float,
                           t: float, target: float) -> float:
    """P(first crossing of ``|Z| >= c`` at time ``t`` from the continuation mass ``weights``
    on ``grid``) minus the level ``target`` to spend there."""
    stats = _stats()
    edge = c * math.sqrt(t)
    return float((weights * (stats.norm.sf((edge - grid) / sd)
                             + stats.norm.cdf((-edge - grid) / sd))).sum()) - target


def _simpson(grid: np.ndarray) -> np.ndarray:
    """Simpson's rule weights on an evenly spaced grid of an odd number of points."""
    weights = np.ones(len(grid))
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * (grid[1] - grid[0]) / 3


SIGN_DRAWS = 20_000  # random sign vectors per test: the boundaries' null law


def increments(looks: Sequence[int], max_seeds: int, alpha: float,
               spend: str = "obrien_fleming") -> np.ndarray:
    """The level each look spends (seeds seen at each: ``looks``) in a design planned to
    ``max_seeds``; (looks,) -> (looks,), summing to at most ``alpha``."""
    spent = spending(spend, alpha)
    fractions = np.minimum(np.asarray(looks, dtype=float) / max_seeds, 1.0)
    return np.diff([0.0, *(spent(t) for t in fractions)])


def sign_draws(max_seeds: int, draws: int = SIGN_DRAWS, seed: int = 0) -> np.ndarray:
    """(draws, max_seeds) random signs +/-1 from a fixed seed: one draw serves every look."""
    return np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, max_seeds))


def sign_flip_boundaries(magnitudes: np.ndarray, looks: Sequence[int], spent: np.ndarray,
                         signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries on ``|sum of the first n_k differences|`` at each look (``inf``: no verdict
    possible there) and each look's nominal level (the share of draws beyond its boundary),
    from the magnitudes ``|d_i|`` (..., n) and the null sign draws (draws, >= n); ``spent``:
    the level of each look. Returns two arrays of shape (..., looks)."""
    magnitudes = np.asarray(magnitudes, dtype=float)
    draws = len(signs)
    n = looks[-1]
    running = np.cumsum(signs[:, :n] * magnitudes[..., None, :n], axis=-1)  # (..., draws, n)
    sums = running[..., np.asarray(looks) - 1]  # (..., draws, looks)
    sums = np.abs(np.round(sums, 12))  # equal sums reached in another order stay equal
    bounds = np.full((*magnitudes.shape[:-1], len(looks)), np.inf)
    levels = np.zeros_like(bounds)
    active = np.ones(sums.shape[:-1], dtype=bool)  # (..., draws) not crossed yet
    for k, share in enumerate(spent):
        allowed = np.floor(share * draws + 1e-9)  # draws that may first cross here
        values = np.where(active, sums[..., k], -np.inf)  # (..., draws)
        ordered = -np.sort(-values, axis=-1)  # descending
        if allowed >= 1:
            # the smallest boundary whose first crossings (|sum| >= c among the active)
            # number at most ``allowed``: the allowed-th largest value, raised past a tie
            index = int(allowed) - 1
            candidate = ordered[..., index]  # (...)
            beyond = ordered[..., index + 1] if index + 1 < draws else np.full_like(candidate,
                                                                                   -np.inf)
            tie = beyond >= candidate
            above = np.where(values > candidate[..., None], values, np.inf).min(axis=-1)
            bounds[..., k] = np.where(tie, above, candidate)
            bounds[..., k] = np.where(bounds[..., k] > 0, bounds[..., k], np.inf)
        beyond_bound = sums[..., k] >= bounds[..., k][..., None]  # (..., draws)
        levels[..., k] = beyond_bound.mean(axis=-1)
        active &= ~beyond_bound
    return bounds, levels


class GroupSequentialTest:
    """Every variant against ``baseline`` as groups of paired seeds arrive, each variant a
    group-sequential design at ``alpha / K`` planned to ``max_seeds`` (see the module
    docstring). Same use as ``measures.sequential.SequentialTest``: ``update_values`` per
    group, then ``verdict``, ``interval``, ``p_value``, ``seeds_used``, ``stopped_because``,
    ``running``, ``done``. NaN differences (a diverged seed) are dropped (``dropped``)."""

    design = "group-sequential"

    def __init__(self, variants: Sequence[str], baseline: str, max_seeds: int,
                 alpha: float = 0.05, spend: str = "obrien_fleming",
                 lower_is_better: bool = True) -> None:
        self.variants = [v for v in variants if v != baseline]
        if not self.variants:
            raise ValueError(f"no variant to test against the baseline '{baseline}'")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha={alpha} must lie strictly between 0 and 1")
        spending(spend, alpha)  # a bad name fails here
        self.baseline, self.alpha, self.max_seeds, self.spend = baseline, alpha, max_seeds, spend
        self.lower_is_better = lower_is_better
        self.level = alpha / len(self.variants)  # each variant's design
        self._signs = sign_draws(max_seeds)
        self._differences: dict[str, list[float]] = {v: [] for v in self.variants}
        self._looks: dict[str, list[int]] = {v: [] for v in self.variants}
        self._decided: dict[str, str] = {}
        self.dropped: dict[str, int] = dict.fromkeys(self.variants, 0)

    def update_values(self, values: Mapping[str, Sequence[float]]) -> None:
        """One group as each name's values, the baseline's included, paired by position."""
        if self.baseline not in values:
            raise ValueError(f"the group has no values for the baseline '{self.baseline}'")
        base = np.asarray(values[self.baseline], dtype=float)
        for name, v in values.items():
            if name == self.baseline or not self._running(name):
                continue
            diffs = np.asarray(v, dtype=float) - base
            finite = diffs[~np.isnan(diffs)][:self.max_seeds - self.seeds_used(name)]
            self.dropped[name] += int(np.isnan(diffs).sum())
            if not len(finite):
                continue
            self._differences[name] += finite.tolist()
            self._looks[name].append(self.seeds_used(name))
            total = float(np.sum(self._differences[name]))
            if abs(round(total, 12)) >= self._boundaries(name)[0][-1]:
                higher = total > 0
                self._decided[name] = WORSE if higher == self.lower_is_better else BETTER

    def _boundaries(self, variant: str) -> tuple[np.ndarray, np.ndarray]:
        looks = self._looks[variant]
        spent = increments(looks, self.max_seeds, self.level, self.spend)
        return sign_flip_boundaries(np.abs(self._differences[variant]), looks, spent,
                                    self._signs)

    def nominal_level(self, variant: str) -> float:
        """The nominal two-sided level of the variant's last look (0 before any seed)."""
        return float(self._boundaries(variant)[1][-1]) if self._looks[variant] else 0.0

    def p_value(self, variant: str) -> float:
        """The sign-flip p-value of the variant's sum at its last look (the share of the
        null sign draws at least as far from 0)."""
        d = np.asarray(self._differences[variant])
        if not len(d):
            return 1.0
        sums = np.abs(np.round(self._signs[:, :len(d)] @ np.abs(d), 12))  # (draws,)
        return float((sums >= abs(round(float(d.sum()), 12))).mean())

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

    def seeds_used(self, variant: str) -> int:
        return len(self._differences[variant])

    def verdict(self, variant: str) -> str | None:
        return self._decided.get(variant)

    def _running(self, name: str) -> bool:
        return name not in self._decided and self.seeds_used(name) < self.max_seeds

    def stopped_because(self, variant: str) -> str:
        if variant in self._decided:
            return STOPPED_VERDICT
        return "" if self._running(variant) else STOPPED_MAX_SEEDS

    def running(self) -> list[str]:
        return [v for v in self.variants if self._running(v)]

    def done(self) -> bool:
        return not self.running()

    def describe(self, variant: str) -> str:
        """One line of the variant's state, for the running console lines and the notes."""
        level = self.nominal_level(variant)
        at = f"a verdict at p <= {level:.3g}" if level > 0 else "no verdict possible yet"
        return (f"sign-flip p {self.p_value(variant):.3g} ({at}; {self.spend} spending of "
                f"{self.level:.3g} to {self.max_seeds} seeds)")
