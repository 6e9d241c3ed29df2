"""Paired statistics over seeds: the verdict columns of every comparison (README, "Verdicts:
how sure a comparison is").

A comparison trains every variant with the same seeds ``s_1 .. s_n``; within a seed the variants
share the initial weights (where shapes allow) and the batches, so the seed is a block and the
variant's effect is measured on the paired differences ``d_i = x_variant(s_i) - x_baseline(s_i)``:

    mean_interval        Student-t CI of a mean over seeds (``Interval``)
    paired_comparison    mean of d, its t-interval, sign-flip permutation p (``PairedComparison``)
    holm                 Holm step-down adjustment over the variants
    verdict              better | worse | no detectable difference, on the adjusted p
    seeds_needed         paired seeds for 80% power at the observed effect (with the power
                         calculation, in ``measures.power_analysis``)
    probability_of_improvement
                         P(a random seed of the variant beats a random seed of the baseline)
                         with a paired bootstrap interval (``Improvement``)
    variance_by_source   a crossed seed_init x seed_data table -> the variance from each
                         (``VarianceComponents``)
    verdict_table        per-(variant, seed) rows -> the per-variant columns of comparison.csv
    describe             one plain-language line per variant for the terminal

NaN values (a diverged seed) are dropped, never propagated, and the number dropped is reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from transformer_lab.measures.power_analysis import fewest_seeds_for_a_verdict, seeds_needed

if TYPE_CHECKING:
    import pandas as pd


def _stats() -> Any:
    """``scipy.stats``, imported on first use (about 0.4 s that commands comparing nothing do
    not pay)."""
    from scipy import stats

    return stats


BASELINE = "baseline"
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference"
EXACT_UP_TO = 16  # seeds: all 2^n sign flips up to here (65,536), Monte Carlo beyond
MONTE_CARLO_RESAMPLES = 99_999
BOOTSTRAP_RESAMPLES = 9_999  # probability of improvement's interval


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` finite values with its two-sided t-interval (``dropped`` NaNs left out).
    ``n = 1``: ``low = high = nan`` (no spread to estimate); ``n = 0``: everything nan."""

    mean: float
    low: float
    high: float
    n: int
    dropped: int = 0


def _finite(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, int]:
    array = np.asarray(values, dtype=float).ravel()
    keep = ~np.isnan(array)
    return array[keep], int((~keep).sum())


def _t_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """``mean -/+ t_{(1+c)/2, n-1} * s / sqrt(n)`` (Student 1908); zero spread -> (mean, mean)."""
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean, sem = float(values.mean()), float(_stats().sem(values))
    if sem == 0.0:
        return mean, mean
    low, high = _stats().t.interval(confidence, n - 1, loc=mean, scale=sem)
    return float(low), float(high)


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean of the finite ``values`` over seeds and its Student-t confidence interval."""
    finite, dropped = _finite(values)
    mean = float(finite.mean()) if len(finite) else math.nan
    return Interval(mean, *_t_interval(finite, confidence), n=len(finite), dropped=dropped)


@dataclass(frozen=True)
class PairedComparison:
    """Variant minus baseline over ``n`` seeds where both are finite (``dropped`` pairs left out).
    ``sd``: sample standard deviation of the differences (nan for ``n < 2``)."""

    diff: float
    low: float
    high: float
    p_value: float
    sd: float
    n: int
    dropped: int = 0


def _mean_statistic(x: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x, axis=axis)


def sign_flip_p_value(differences: np.ndarray, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of ``mean(d) = 0``.

    Under H0 (the variant does not matter) every difference is as likely to be ``+d_i`` as
    ``-d_i``; the p-value is the share of the ``2^n`` sign patterns whose mean is at least as
    extreme as the observed one (two-sided: twice the smaller tail, capped at 1; Fisher 1935,
    Good, "Permutation Tests", 2005). It fits comparisons over few seeds: exact at any n, no
    normality assumed (a loss over 5 seeds is rarely normal; one slow seed breaks a t-test).
    Its price: the smallest attainable p is ``2 / 2^n``. n = 5 gives 0.0625, which can never
    reach alpha = 0.05; n = 6 gives 0.031, n = 8 gives 0.0078 (room for a Holm correction over
    a few variants). So 6 paired seeds is the least for any verdict at 0.05, 8 a sound default.
    All ``2^n`` flips for ``n <= EXACT_UP_TO``, else a Monte Carlo with a fixed ``seed``.
    """
    n = len(differences)
    resamples = math.inf if n <= EXACT_UP_TO else MONTE_CARLO_RESAMPLES
    result = _stats().permutation_test((differences,), _mean_statistic, vectorized=True,
                                    permutation_type="samples", alternative="two-sided",
                                    n_resamples=resamples, rng=np.random.default_rng(seed))
    return float(result.pvalue)


def paired_comparison(variant: Sequence[float] | np.ndarray,
                      baseline: Sequence[float] | np.ndarray,
                      confidence: float = 0.95) -> PairedComparison:
    """Mean paired difference ``variant - baseline`` (index i = seed i in both), its t-interval
    and sign-flip p-value. Pairs with a NaN on either side are dropped; fewer than 2 pairs
    leave the interval and the p-value nan."""
    x, y = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired values differ in length: {x.shape} vs {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    differences = x[keep] - y[keep]  # (n,)
    n, dropped = len(differences), int((~keep).sum())
    diff = float(differences.mean()) if n else math.nan
    if n < 2:
        return PairedComparison(diff, math.nan, math.nan, math.nan, math.nan, n, dropped)
    low, high = _t_interval(differences, confidence)
    return PairedComparison(diff, low, high, sign_flip_p_value(differences),
                            float(differences.std(ddof=1)), n, dropped)


class Improvement(NamedTuple):
    """A probability of improvement with its interval (all nan under 2 paired seeds)."""

    p: float
    low: float
    high: float


def probability_of_improvement(variant: Sequence[float] | np.ndarray,
                               baseline: Sequence[float] | np.ndarray,
                               confidence: float = 0.95, lower_is_better: bool = True,
                               resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Improvement:
    """P(a random seed of the variant beats a random seed of the baseline): the probability of
    improvement of rliable (Agarwal et al. 2021, "Deep reinforcement learning at the edge of
    the statistical precipice"), ``U / (n m)`` of the Mann-Whitney test. Beating is a lower
    value when ``lower_is_better``, a tie counts 1/2; index i is seed i in both.

    Estimator: over the n seeds where both values are finite, the share of the ``n (n - 1)``
    ordered pairs of *different* seeds (i, j) where the variant at seed i beats the baseline
    at seed j. Same-seed pairs are left out: a seed's variant and baseline share the initial
    weights and the batches, so they would measure the within-seed win rate, not the
    random-seed-against-random-seed probability (without them the estimate is unbiased for
    it: a U-statistic). Interval: percentile bootstrap over the seeds resampled as pairs
    (keeping each seed's dependence; rliable resamples the two sides independently because
    its runs are unpaired), ``resamples`` draws from a fixed ``seed``, pairs of resampled
    positions that are one original seed left out as above. A percentile interval over few
    seeds is narrower than its nominal level, and collapses to a point when every seed of the
    variant beats every seed of the baseline: read it with ``paired_seeds``.
    """
    x, y = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired values differ in length: {x.shape} vs {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 2:
        return Improvement(math.nan, math.nan, math.nan)
    beats = x[:, None] < y[None, :] if lower_is_better else x[:, None] > y[None, :]
    wins = beats + 0.5 * (x[:, None] == y[None, :])  # (n, n): variant seed i vs baseline seed j
    np.fill_diagonal(wins, 0.0)
    p = float(wins.sum() / (n * (n - 1)))
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    flat = (np.arange(resamples)[:, None] * n + draws).ravel()
    counts = np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(float)
    # counts: (resamples, n), how often each seed was drawn
    pairs = n * n - (counts ** 2).sum(axis=1)  # ordered position pairs from different seeds
    won = np.einsum("ri,ij,rj->r", counts, wins, counts)
    shares = np.divide(won, pairs, out=np.full(resamples, math.nan), where=pairs > 0)
    low, high = np.nanpercentile(shares, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Improvement(p, float(low), float(high))


@dataclass(frozen=True)
class VarianceComponents:
    """A metric's variance split by source over a crossed ``n_init x n_data`` table of runs:
    ``init`` and ``data`` (the initialisation seed's and the data-order seed's), ``residual``
    (their interaction and everything else: one run per cell cannot tell those apart). The
    estimates are unbiased, so one can fall below 0 (a source whose effect is within the
    noise); ``shares`` counts such a one as 0."""

    init: float
    data: float
    residual: float
    n_init: int
    n_data: int
    mean: float

    @property
    def total(self) -> float:
        """Variance of one run with both seeds drawn at random (negative parts as 0)."""
        return max(self.init, 0.0) + max(self.data, 0.0) + self.residual

    @property
    def shares(self) -> tuple[float, float, float]:
        """(init, data, residual) as fractions of ``total`` (nan when it is 0)."""
        parts = (max(self.init, 0.0), max(self.data, 0.0), self.residual)
        total = self.total
        return tuple(part / total if total > 0 else math.nan for part in parts)


def variance_by_source(table: Sequence[Sequence[float]] | np.ndarray) -> VarianceComponents:
    """The two-way random-effects model without replication, ``y_ij = mu + a_i + b_j + e_ij``
    with ``a_i ~ (0, var_init)`` for initialisation seed i, ``b_j ~ (0, var_data)`` for
    data-order seed j and ``e_ij ~ (0, var_residual)``, estimated by the ANOVA method of
    moments (Searle, Casella & McCulloch 1992, "Variance Components", Section 4.4): with the
    mean squares of rows, columns and residual, ``E[MS_init] = var_residual + J var_init``,
    ``E[MS_data] = var_residual + I var_data``, ``E[MS_residual] = var_residual``, so
    ``var_init = (MS_init - MS_residual) / J`` and alike. ``table``: (I init seeds, J data
    seeds), complete (no NaN), I, J >= 2; a ``ValueError`` otherwise."""
    y = np.asarray(table, dtype=float)
    if y.ndim != 2 or min(y.shape) < 2:
        raise ValueError(f"need a table of at least 2 x 2 runs, got shape {y.shape}")
    if np.isnan(y).any():
        raise ValueError(f"{int(np.isnan(y).sum())} of {y.size} cells have no value")
    rows, cols = y.shape
    grand, row_means, col_means = y.mean(), y.mean(axis=1), y.mean(axis=0)  # (), (I,), (J,)
    ms_init = cols * ((row_means - grand) ** 2).sum() / (rows - 1)
    ms_data = rows * ((col_means - grand) ** 2).sum() / (cols - 1)
    residuals = y - row_means[:, None] - col_means[None, :] + grand  # (I, J)
    ms_residual = (residuals ** 2).sum() / ((rows - 1) * (cols - 1))
    return VarianceComponents(float((ms_init - ms_residual) / cols),
                              float((ms_data - ms_residual) / rows), float(ms_residual),
                              rows, cols, float(grand))


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjustment over m tests: with ``p_(1) <= .. <= p_(m)``,
    ``p_adj_(k) = max_{j<=k} min(1, (m - j + 1) p_(j))``. Controls the family-wise error rate
    without assumptions on how the tests depend. NaN p-values stay NaN and do not count in m."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p, math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])  # (m,) in ascending-p order
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def verdict(diff: float, p_adjusted: float, alpha: float = 0.05,
            lower_is_better: bool = True) -> str:
    """``better`` / ``worse`` when the adjusted p is at most ``alpha`` (the sign of the mean
    difference variant - baseline decides which), else ``no detectable difference``."""
    if math.isnan(p_adjusted) or p_adjusted > alpha or diff == 0 or math.isnan(diff):
        return NO_DIFFERENCE
    return BETTER if (diff < 0) == lower_is_better else WORSE


VERDICT_COLUMNS = ["diff_vs_baseline", "diff_ci_low", "diff_ci_high", "p_value", "p_adjusted",
                   "verdict", "p_improvement", "p_improvement_low", "p_improvement_high",
                   "seeds_needed", "paired_seeds", "note"]


def verdict_table(runs: pd.DataFrame, variant: str = "variant", value: str = "final_loss",
                  baseline: str | None = None, alpha: float = 0.05, confidence: float = 0.95,
                  lower_is_better: bool = True) -> pd.DataFrame:
    """One row per variant (order of first appearance, indexed by ``variant``) from rows of
    (``variant``, ``seed``, ``value``): ``<value>_ci_low``, ``<value>_ci_high`` over seeds,
    then against ``baseline`` (default: the first variant), pairing rows by seed, the columns
    ``VERDICT_COLUMNS``; Holm runs over the variants that have a p-value, ``p_improvement``
    is ``probability_of_improvement`` (beating = lower when ``lower_is_better``), ``seeds_needed``
    counts every non-baseline variant as a comparison (see ``seeds_needed``). The baseline's
    paired columns are empty and its verdict is ``baseline``; ``note`` says why a row has no
    test, or how many seeds were dropped."""
    names = list(dict.fromkeys(runs[variant]))
    if not names:
        raise ValueError("no rows to compare")
    m = len(names) - 1  # comparisons against the baseline
    baseline = names[0] if baseline is None else baseline
    if baseline not in names:
        raise ValueError(f"baseline '{baseline}' is not among the variants: {', '.join(names)}")
    if runs.duplicated([variant, "seed"]).any():
        raise ValueError(f"a ({variant}, seed) pair appears twice")
    wide = runs.pivot(index="seed", columns=variant, values=value)  # (seeds, variants)
    rows: dict[str, dict] = {}
    for name in names:
        interval = mean_interval(wide[name].to_numpy(), confidence)
        row = {f"{value}_ci_low": interval.low, f"{value}_ci_high": interval.high,
               "diff_vs_baseline": math.nan, "diff_ci_low": math.nan, "diff_ci_high": math.nan,
               "p_value": math.nan, "p_adjusted": math.nan, "verdict": BASELINE,
               "p_improvement": math.nan, "p_improvement_low": math.nan,
               "p_improvement_high": math.nan, "seeds_needed": None, "paired_seeds": None,
               "note": ""}
        if name != baseline:
            pair = paired_comparison(wide[name].to_numpy(), wide[baseline].to_numpy(),
                                     confidence)
            improvement = probability_of_improvement(wide[name].to_numpy(),
                                                     wide[baseline].to_numpy(), confidence,
                                                     lower_is_better)
            row.update(diff_vs_baseline=pair.diff, diff_ci_low=pair.low, diff_ci_high=pair.high,
                       p_value=pair.p_value, paired_seeds=pair.n,
                       p_improvement=improvement.p, p_improvement_low=improvement.low,
                       p_improvement_high=improvement.high,
                       seeds_needed=seeds_needed(pair.diff, pair.sd, alpha, comparisons=m),
                       note=_note(pair))
        rows[name] = row
    import pandas as pd

    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = variant
    table["p_adjusted"] = holm(table["p_value"].to_numpy())
    _note_when_no_verdict_is_possible(table, alpha)
    table["verdict"] = [
        BASELINE if name == baseline else verdict(row.diff_vs_baseline, row.p_adjusted, alpha,
                                                  lower_is_better)
        for name, row in table.iterrows()]
    for column in ("seeds_needed", "paired_seeds"):  # ints or None (an empty CSV cell)
        table[column] = pd.Series([None if pd.isna(v) else int(v) for v in table[column]],
                                  index=table.index, dtype=object)
    return table


def has_verdict(row: pd.Series | dict) -> bool:
    """Whether ``row`` was tested against its baseline: ``better``, ``worse`` or ``no detectable
    difference`` (not the baseline's own row, nor one without a verdict: None, NaN)."""
    return row.get("verdict") in (BETTER, WORSE, NO_DIFFERENCE)


def _note(pair: PairedComparison) -> str:
    parts = []
    if pair.n < 2:
        parts.append(f"{pair.n} paired seed{'' if pair.n == 1 else 's'}: no test (need 2+)")
    if pair.dropped:
        plural = "" if pair.dropped == 1 else "s"
        parts.append(f"{pair.dropped} seed{plural} dropped (NaN or missing)")
    return "; ".join(parts)


def _note_when_no_verdict_is_possible(table: pd.DataFrame, alpha: float) -> None:
    """Every p over n seeds is >= 2 / 2^n, so with m variants tested and at most N paired seeds
    Holm's smallest adjusted p is >= m * 2 / 2^N: above ``alpha``, no row can get a verdict
    whatever the data, and each tested row's ``note`` says so."""
    tested = table["p_value"].notna()
    if not tested.any():
        return
    m, most = int(tested.sum()), int(table.loc[tested, "paired_seeds"].max())
    floor = m * 2 / 2**most
    if floor <= alpha:
        return
    fewest = fewest_seeds_for_a_verdict(m, alpha)
    text = (f"no verdict possible: over {most} seeds and {m} comparison{'' if m == 1 else 's'} "
            f"Holm's p is at least {min(floor, 1.0):.2g} > {alpha:g}; {fewest}+ seeds can reach it")
    table.loc[tested, "note"] = [f"{note}; {text}" if note else text
                                 for note in table.loc[tested, "note"]]


def _improvement_text(row: pd.Series | dict, confidence: float) -> str:
    """``, P(improvement) 0.91 (95% CI 0.75 to 1)``, or "" without one."""
    p = row.get("p_improvement", math.nan)
    if p is None or math.isnan(p):
        return ""
    low, high = row.get("p_improvement_low", math.nan), row.get("p_improvement_high", math.nan)
    return f", P(improvement) {p:.2g} ({confidence:.0%} CI {low:.2g} to {high:.2g})"


def describe(name: str, row: pd.Series | dict, baseline: str, value: str = "final_loss",
             confidence: float = 0.95) -> str:
    """One line for the terminal, e.g. ``gelu vs relu: final_loss 0.012 lower (95% CI 0.004 to
    0.020), p = 0.008, Holm 0.016, P(improvement) 0.91 (95% CI 0.75 to 1) -> better``; the
    CI is in the same direction as the word."""
    if row["verdict"] == BASELINE:
        return f"{name}: baseline"
    diff = row["diff_vs_baseline"]
    head = f"{name} vs {baseline}: {value}"
    if math.isnan(diff):
        return f"{head}: no paired seeds -> {row['verdict']}"
    sign = -1.0 if diff < 0 else 1.0
    line = f"{head} {abs(diff):.3g} {'lower' if diff < 0 else 'higher'}"
    if math.isnan(row["p_value"]):
        return f"{line} ({row['note']}) -> {row['verdict']}"
    low, high = sorted((sign * row["diff_ci_low"], sign * row["diff_ci_high"]))
    line += (f" ({confidence:.0%} CI {low:.3g} to {high:.3g}), p = {row['p_value']:.2g}, "
             f"Holm {row['p_adjusted']:.2g}{_improvement_text(row, confidence)} "
             f"-> {row['verdict']}")
    if row["verdict"] == NO_DIFFERENCE and row["seeds_needed"] is not None:
        line += f" ({row['seeds_needed']} paired seeds would detect it at 80% power)"
    if row["note"]:
        line += f"; {row['note']}"
    return line
