"""How many paired seeds a comparison needs (moved out of ``measures.statistics``, whose verdict
table fills its ``seeds_needed`` column from here):

    paired_t_power               power of the two-sided paired t-test at n pairs and an effect size
    seeds_needed                 paired seeds for 80% power at the observed effect
    fewest_seeds_for_a_verdict   the least n whose sign-flip test can reach alpha after Holm

``scipy.stats`` is imported on first use, as in ``statistics``.
"""

from __future__ import annotations

import math

import numpy as np

SEEDS_CAP = 10_000


def paired_t_power(n: int | np.ndarray, effect: float, alpha: float = 0.05) -> np.ndarray:
    """Power of the two-sided paired t-test with n pairs at effect size ``mean(d) / sd(d)``:
    ``P(|T| > t_{1-a/2, n-1})`` for ``T ~ nct(df = n - 1, nc = effect * sqrt(n))``."""
    n = np.asarray(n, dtype=float)
    df, nc = n - 1, abs(effect) * np.sqrt(n)
    from scipy import stats  # on first use, as ``statistics._stats``

    critical = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(critical, df, nc) + stats.nct.cdf(-critical, df, nc)


def seeds_needed(diff: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                 comparisons: int = 1, cap: int = SEEDS_CAP) -> int | None:
    """Smallest number of paired seeds that would detect ``diff`` (mean of variant - baseline,
    with ``sd`` the standard deviation of the differences): the paired t-test reaches
    ``power`` at level ``a = alpha / comparisons`` (``paired_t_power``, Cohen 1988) AND the
    sign-flip test can reach it at all (``2 / 2^n <= a``). ``comparisons`` > 1: the variants
    are Holm-adjusted together; ``a`` is Holm's strictest step (Bonferroni), so the number
    holds whatever the variant's rank (3 variants: the floor is 7 seeds, not 6). ``None`` when
    ``diff`` is 0 or nan (nothing to detect), ``sd`` is nan, or no n up to ``cap`` suffices.
    ``sd = 0``: the second condition only.
    """
    if math.isnan(diff) or diff == 0 or math.isnan(sd):
        return None
    level = alpha / max(1, comparisons)
    least = max(2, math.ceil(math.log2(2 / level)))  # 2 / 2^n <= level
    if sd == 0:
        return least if least <= cap else None
    start = least
    while start <= cap:  # growing blocks: cheap for large effects, exact smallest n for all
        block = np.arange(start, min(cap, 2 * start) + 1)
        reached = np.flatnonzero(paired_t_power(block, diff / sd, level) >= power)
        if len(reached):
            return int(block[reached[0]])
        start = int(block[-1]) + 1
    return None


def fewest_seeds_for_a_verdict(comparisons: int, alpha: float = 0.05) -> int:
    """The least n whose exact sign-flip test can reach ``alpha`` after Holm over
    ``comparisons`` variants: the smallest two-sided p over n seeds is 2 / 2^n, and Holm
    multiplies the smallest by the number of comparisons (1 -> 6, 2-3 -> 7, 4-6 -> 8, 7-12 -> 9)."""
    return max(2, math.ceil(math.log2(2 * max(comparisons, 1) / alpha)))
