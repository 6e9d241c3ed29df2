"""A planned group-sequential design over seeds (``--seeds auto:MAX``): the paired test of every
variant against the baseline is read after each group of seeds up to ``MAX``, each look at a
nominal level from an alpha-spending function, so that the false-positive rate over all looks
is at most ``alpha`` (Lan & DeMets 1983, "Discrete sequential boundaries for clinical
trials"; Jennison & Turnbull 2000, "Group Sequential Methods", ch. 7).

Where the anytime-valid test (``measures.sequential``) may go on for ever and so pays for it in
seeds, this design knows its last look (``MAX``): a boundary that spends almost nothing early
(O'Brien & Fleming's shape) and nearly all of ``alpha`` at ``MAX`` costs a fixed design of
``MAX`` seeds little power, and stops early when the effect is large.

- **Statistic**: the paired t statistic of the differences ``d_i = variant - baseline`` seen so
  far (seeds independent, differences normal enough for a t-test; the "significance level"
  approach of Jennison & Turnbull section 3.8: each look compares its t-test p-value with the
  nominal level that the normal-theory boundary gives).
- **Boundary**: information fraction ``t_k = n_k / MAX``; the level spent by look k is
  ``spend(t_k) - spend(t_{k-1})``; the z-boundary ``c_k`` is solved by numerical integration of
  the Brownian motion that the z statistics follow under H0 (Armitage, McPherson & Rowe 1969).
  The nominal two-sided level at look k is ``2 (1 - Phi(c_k))``.
- **Spending functions**: ``obrien_fleming`` ``4 - 4 Phi(z_{a/4} / sqrt(t))`` (each side
  O'Brien-Fleming-like at ``a / 2``), ``pocock``
  ``a log(1 + (e - 1) t)``, ``hsd:G`` Hwang, Shih & DeCani ``a (1 - e^{-G t}) / (1 - e^{-G})``.
- **K variants**: Bonferroni, each variant's design at ``alpha / K``.
- **Interval**: the repeated confidence interval at the variant's last look,
  ``mean +/- t_{n-1}(1 - level_k / 2) * sd / sqrt(n)`` (Jennison & Turnbull ch. 9): at every
  look at once it covers the mean difference with probability at least ``1 - alpha / K``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from transformer_lab.measures.statistics import BETTER, WORSE
from transformer_lab.measures.sequential import STOPPED_MAX_SEEDS, STOPPED_VERDICT

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

            def crossing(c: float, sd: float = sd, t: float = t, weights: np.ndarray = weights
                         ) -> float:
                edge = c * math.sqrt(t)
                return float((weights * (stats.norm.sf((edge - grid) / sd)
                                         + stats.norm.cdf((-edge - grid) / sd))).sum()) - target
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


def _simpson(grid: np.ndarray) -> np.ndarray:
    """Simpson's rule weights on an evenly spaced grid of an odd number of points."""
    weights = np.ones(len(grid))
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * (grid[1] - grid[0]) / 3


def nominal_levels(looks: Sequence[int], max_seeds: int, alpha: float,
                   spend: str = "obrien_fleming") -> np.ndarray:
    """The two-sided nominal level of each look (seeds seen at each: ``looks``) of a design
    planned to ``max_seeds``, spending ``alpha`` at t-tests' first crossings
    (``_t_levels``); (looks,) -> (looks,)."""
    return _levels(tuple(int(n) for n in looks), int(max_seeds), float(alpha), spend).copy()


@functools.lru_cache(maxsize=256)
def _levels(looks: tuple[int, ...], max_seeds: int, alpha: float, spend: str) -> np.ndarray:
    fractions = np.minimum(np.asarray(looks, dtype=float) / max_seeds, 1.0)
    spent = spending(spend, alpha)
    increments = np.diff([0.0, *(spent(t) for t in fractions)])  # (looks,)
    return _t_levels(looks, increments)


def _t_levels(looks: tuple[int, ...], increments: np.ndarray, sims: int = 100_000
              ) -> np.ndarray:
    """Nominal t-test levels that spend ``increments`` at ``looks``: on ``sims`` runs of
    normal differences under H0 (a fixed seed: the same levels every time), look k's level is
    the p-value below which the share ``increments[k]`` of all runs first crosses there. A t
    statistic's law under H0 depends neither on the differences' mean nor on their spread, so
    one simulation serves every study; with few seeds its tails are heavier than the z
    statistic's that the normal-theory boundaries assume."""
    rng = np.random.default_rng(20_241_204)
    d = rng.standard_normal((sims, looks[-1]))  # (sims, n)
    active = np.ones(sims, dtype=bool)
    levels = np.zeros(len(looks))
    for k, (n, increment) in enumerate(zip(looks, increments, strict=True)):
        p = t_p_values(d[active, :n])  # (active,)
        count = int(round(increment * sims))
        if count <= 0 or n < 2:
            continue  # nothing to spend here (level 0: no verdict at this look)
        ordered = np.sort(p)
        count = min(count, len(ordered))
        above = ordered[count] if count < len(ordered) else 1.0
        levels[k] = (ordered[count - 1] + above) / 2
        active[np.flatnonzero(active)[p <= levels[k]]] = False
    return levels


def t_p_values(differences: np.ndarray) -> np.ndarray:
    """Two-sided paired t-test p-values of ``mean = 0`` over the last axis; (..., n) -> (...);
    1 where n < 2 or every difference is equal and 0, 0 where they are equal and not 0."""
    d = np.asarray(differences, dtype=float)
    n = d.shape[-1]
    if n < 2:
        return np.ones(d.shape[:-1])
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(n))
    p = 2 * _stats().t.sf(np.abs(t), n - 1)
    return np.where(sd > 0, p, np.where(mean == 0, 1.0, 0.0))


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
            level = self.nominal_level(name)
            if level > 0 and self.p_value(name) <= level:
                higher = float(np.mean(self._differences[name])) > 0
                self._decided[name] = WORSE if higher == self.lower_is_better else BETTER

    def nominal_level(self, variant: str) -> float:
        """The nominal two-sided level of the variant's last look (0 before any seed)."""
        looks = self._looks[variant]
        if not looks:
            return 0.0
        planned = self._planned_looks(looks[0])
        if looks == planned[:len(looks)]:  # one design for every look (cached)
            return float(nominal_levels(planned, self.max_seeds, self.level,
                                        self.spend)[len(looks) - 1])
        return float(nominal_levels(looks, self.max_seeds, self.level, self.spend)[-1])

    def _planned_looks(self, group: int) -> list[int]:
        """Looks every ``group`` seeds up to ``max_seeds`` (the last one at ``max_seeds``)."""
        return sorted({*range(group, self.max_seeds, group), self.max_seeds})

    def p_value(self, variant: str) -> float:
        """The paired t-test's two-sided p-value at the variant's last look."""
        return float(t_p_values(np.asarray(self._differences[variant])))

    def interval(self, variant: str) -> tuple[float, float]:
        """The repeated confidence interval for the mean difference at the last look."""
        d = np.asarray(self._differences[variant])
        if len(d) < 2:
            return -math.inf, math.inf
        level = self.nominal_level(variant)
        half = _stats().t.isf(level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
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
        return (f"p {self.p_value(variant):.3g} (a verdict at {self.nominal_level(variant):.3g},"
                f" {self.spend} spending of {self.level:.3g} to {self.max_seeds} seeds)")
