"""Paired statistics over seeds: the verdict columns of every comparison (README, "Verdicts:
how sure a comparison is"). A seed is a block: within it the variants share the initial weights
and the batches, so the tests use ``d_i = x_variant(s_i) - x_baseline(s_i)``. NaN values (a
diverged seed) are dropped and counted, never propagated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from transformer_lab.measures.power_analysis import fewest_seeds_for_a_verdict, seeds_needed

if TYPE_CHECKING:
    import pandas as pd

    from transformer_lab.measures.sequential import SequentialTest


BASELINE = "baseline"
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference"
STOPPED_VERDICT = "verdict"  # a sequential test's stopped_because once it reached a verdict
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


def _finite_pairs(variant: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """The pairs (index i = seed i in both) where both are finite, and how many were dropped."""
    x, y = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired values differ in length: {x.shape} vs {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    return x[keep], y[keep], int((~keep).sum())


def _t_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """``mean -/+ t_{(1+c)/2, n-1} * s / sqrt(n)`` (Student 1908); zero spread -> (mean, mean)."""
    from scipy import stats  # on first use: commands comparing nothing do not pay for it

    if len(values) < 2:
        return math.nan, math.nan
    mean, sem = float(values.mean()), float(stats.sem(values))
    if sem == 0.0:
        return mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
    return float(low), float(high)


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean of the finite ``values`` over seeds and its Student-t confidence interval."""
    array = np.asarray(values, dtype=float).ravel()
    finite = array[~np.isnan(array)]
    mean = float(finite.mean()) if len(finite) else math.nan
    return Interval(mean, *_t_interval(finite, confidence), len(finite), len(array) - len(finite))


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


def sign_flip_p_value(differences: np.ndarray, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of ``mean(d) = 0`` (Fisher
    1935), never below ``2 / 2^n``: all ``2^n`` flips up to :data:`EXACT_UP_TO` seeds, else a
    Monte Carlo with a fixed ``seed``."""
    from scipy import stats

    resamples = math.inf if len(differences) <= EXACT_UP_TO else MONTE_CARLO_RESAMPLES
    result = stats.permutation_test((differences,), np.mean, vectorized=True,
                                    permutation_type="samples", alternative="two-sided",
                                    n_resamples=resamples, rng=np.random.default_rng(seed))
    return float(result.pvalue)


def paired_comparison(variant: Sequence[float] | np.ndarray,
                      baseline: Sequence[float] | np.ndarray,
                      confidence: float = 0.95) -> PairedComparison:
    """Mean paired difference ``variant - baseline`` (index i = seed i in both), its t-interval
    and sign-flip p-value. Pairs with a NaN on either side are dropped; fewer than 2 pairs
    leave the interval and the p-value nan."""
    x, y, dropped = _finite_pairs(variant, baseline)
    differences = x - y  # (n,)
    n = len(differences)
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
    """P(a random seed of the variant beats a random seed of the baseline) of rliable (Agarwal et
    al. 2021) over pairs of *different* seeds, a tie counting 1/2, with a percentile bootstrap
    interval over seeds resampled as pairs (same-seed pairs share weights and batches; README,
    "Verdicts": ``p_improvement``)."""
    x, y, _ = _finite_pairs(variant, baseline)
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
    the initialisation seed's, the data order's and the ``residual`` (their interaction and
    the rest). Unbiased, so one can fall below 0; ``shares`` counts such a one as 0."""

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
        total = self.total
        return tuple(part / total if total > 0 else math.nan
                     for part in (max(self.init, 0.0), max(self.data, 0.0), self.residual))


def variance_by_source(table: Sequence[Sequence[float]] | np.ndarray) -> VarianceComponents:
    """``y_ij = mu + a_i + b_j + e_ij`` by the ANOVA method of moments (Searle, Casella &
    McCulloch 1992, sec. 4.4); ``table``: (I init seeds, J data seeds), complete, I, J >= 2,
    else a ``ValueError``."""
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
    ``p_adj_(k) = max_{j<=k} min(1, (m - j + 1) p_(j))``. NaN p-values stay NaN, not counted."""
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
                  lower_is_better: bool = True, test: SequentialTest | None = None
                  ) -> pd.DataFrame:
    """Per variant (indexed by ``variant``) from rows of (``variant``, ``seed``, ``value``):
    ``<value>_ci_low/high`` over seeds and, paired by seed against ``baseline`` (default: the
    first), :data:`VERDICT_COLUMNS`; with ``--seeds auto``'s ``test``, its verdicts."""
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
        interval = mean_interval(wide[name], confidence)
        row = {f"{value}_ci_low": interval.low, f"{value}_ci_high": interval.high,
               **dict.fromkeys(VERDICT_COLUMNS, math.nan), "verdict": BASELINE,
               "seeds_needed": None, "paired_seeds": None, "note": ""}
        if name != baseline:
            pair = paired_comparison(wide[name], wide[baseline], confidence)
            improvement = probability_of_improvement(wide[name], wide[baseline], confidence,
                                                     lower_is_better)
            row.update(diff_vs_baseline=pair.diff, diff_ci_low=pair.low, diff_ci_high=pair.high,
                       p_value=pair.p_value, paired_seeds=pair.n, p_improvement=improvement.p,
                       p_improvement_low=improvement.low, p_improvement_high=improvement.high,
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
    if test is None:
        return table
    # --seeds auto: the sequential test's verdict, interval and statistics replace the fixed ones
    table["e_value"] = table["sequential_design"] = None
    seeds = runs.groupby(variant, sort=False).size()
    table["seeds_used"] = [int(seeds[name]) for name in table.index]
    table["stopped_because"] = ""
    for name in test.variants:
        low, high = test.interval(name)
        dropped = test.dropped[name]
        values = dict(verdict=test.verdict(name) or NO_DIFFERENCE, diff_ci_low=low,
                      diff_ci_high=high, **test.statistics(name), sequential_design=test.design,
                      seeds_used=test.seeds_used(name), stopped_because=test.stopped_because(name),
                      note=f"seeds auto: {test.design} test, {test.describe(name)} after "
                           f"{test.seeds_used(name)} paired seeds"
                           + (f", {dropped} non-finite dropped" if dropped else ""))
        if values["verdict"] == NO_DIFFERENCE:
            values["seeds_needed"] = None  # the fixed design's power figure does not apply
        for column, cell in values.items():
            table.at[name, column] = cell
    return table


def has_verdict(row: pd.Series | dict) -> bool:
    """Whether ``row`` was tested against its baseline: ``better``, ``worse`` or ``no detectable
    difference`` (not the baseline's own row, nor one without a verdict: None, NaN)."""
    return row.get("verdict") in (BETTER, WORSE, NO_DIFFERENCE)


def _note(pair: PairedComparison) -> str:
    parts = [f"{pair.n} paired seed{'' if pair.n == 1 else 's'}: no test (need 2+)"
             if pair.n < 2 else "",
             f"{pair.dropped} seed{'' if pair.dropped == 1 else 's'} dropped (NaN or missing)"
             if pair.dropped else ""]
    return "; ".join(part for part in parts if part)


def _note_when_no_verdict_is_possible(table: pd.DataFrame, alpha: float) -> None:
    """Where Holm's smallest possible p, ``m * 2 / 2^N`` (m variants tested, at most N paired
    seeds), is above ``alpha``, no row can get a verdict: each tested row's ``note`` says so."""
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


def describe(name: str, row: pd.Series | dict, baseline: str, value: str = "final_loss",
             confidence: float = 0.95) -> str:
    """One line for the terminal (README, "Verdicts"); the CI is in the direction of the word
    (lower / higher)."""
    if row["verdict"] == BASELINE:
        return f"{name}: baseline"
    diff, sequential = row["diff_vs_baseline"], row.get("sequential_design")
    if math.isnan(diff) and not sequential:
        return f"{name} vs {baseline}: {value}: no paired seeds -> {row['verdict']}"
    line = f"{name} vs {baseline}: {value} {abs(diff):.3g} {'lower' if diff < 0 else 'higher'}"
    low, high = sorted((-1.0 if diff < 0 else 1.0) * row[f"diff_ci_{end}"]
                       for end in ("low", "high"))
    if sequential:  # --seeds auto: the sequential test's interval
        stopped = "" if row["stopped_because"] == STOPPED_VERDICT else " (MAX seeds reached)"
        anytime = row.get("e_value") is not None
        statistic = (f"e-value {row['e_value']:.3g}" if anytime
                     else f"group-sequential p {row['p_value']:.3g}")
        return (f"{line}, {'anytime' if anytime else 'repeated'} {confidence:.0%} interval "
                f"{low:.3g} to {high:.3g}, {statistic} after {row['seeds_used']} paired seeds"
                f"{stopped} -> {row['verdict']}")
    if math.isnan(row["p_value"]):
        return f"{line} ({row['note']}) -> {row['verdict']}"
    line += (f" ({confidence:.0%} CI {low:.3g} to {high:.3g}), p = {row['p_value']:.2g}, "
             f"Holm {row['p_adjusted']:.2g}")
    p = row.get("p_improvement", math.nan)
    if p is not None and not math.isnan(p):
        line += (f", P(improvement) {p:.2g} ({confidence:.0%} CI "
                 f"{row['p_improvement_low']:.2g} to {row['p_improvement_high']:.2g})")
    line += f" -> {row['verdict']}"
    if row["verdict"] == NO_DIFFERENCE and row["seeds_needed"] is not None:
        line += f" ({row['seeds_needed']} paired seeds would detect it at 80% power)"
    if row["note"]:
        line += f"; {row['note']}"
    return line
