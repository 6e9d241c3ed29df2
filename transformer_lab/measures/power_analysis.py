"""How many paired seeds a comparison needs: the power of the paired t-test, and the fewest
seeds whose sign-flip test can reach alpha after Holm (``statistics.verdict_table``'s
``seeds_needed``)."""

from __future__ import annotations

import math

import numpy as np

SEEDS_CAP = 10_000


def paired_t_power(n: int | np.ndarray, effect: float, alpha: float = 0.05) -> np.ndarray:
    """Power of the two-sided paired t-test with n pairs at effect size ``mean(d) / sd(d)``:
    ``P(|T| > t_{1-a/2, n-1})`` for ``T ~ nct(df = n - 1, nc = effect * sqrt(n))``."""
    n = np.asarray(n, dtype=float)
    df, nc = n - 1, abs(effect) * np.sqrt(n)
    from scipy import stats  # on first use: commands comparing nothing do not pay for it

    critical = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(critical, df, nc) + stats.nct.cdf(-critical, df, nc)


def seeds_needed(diff: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                 comparisons: int = 1, cap: int = SEEDS_CAP) -> int | None:
    """Fewest paired seeds that detect ``diff`` (mean of variant - baseline; ``sd`` that of the
    differences): the paired t-test reaches ``power`` at ``a = alpha / comparisons`` (Holm's
    strictest step; Cohen 1988) and the sign-flip test can reach ``a`` (``2 / 2^n <= a``).
    None when ``diff`` is 0 or nan, ``sd`` is nan, or no n up to ``cap`` suffices."""
    if math.isnan(diff) or diff == 0 or math.isnan(sd):
        return None
    level = alpha / max(1, comparisons)
    least = fewest_seeds_for_a_verdict(comparisons, alpha)  # 2 / 2^n <= level
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
    ``comparisons`` variants: ``comparisons * 2 / 2^n <= alpha``."""
    return max(2, math.ceil(math.log2(2 * max(comparisons, 1) / alpha)))
