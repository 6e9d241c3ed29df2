"""Paired statistics over seeds (transformer_lab.measures.statistics, seeds needed in
measures.power_analysis): intervals, sign-flip p-values, Holm, verdicts, seeds needed, the
per-variant verdict table, the probability of improvement, the variance by seed source."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from transformer_lab.measures.power_analysis import (
    fewest_seeds_for_a_verdict,
    paired_t_power,
    seeds_needed,
)
from transformer_lab.measures.statistics import (
    BASELINE,
    BETTER,
    NO_DIFFERENCE,
    WORSE,
    describe,
    has_verdict,
    holm,
    mean_interval,
    paired_comparison,
    probability_of_improvement,
    sign_flip_p_value,
    variance_by_source,
    verdict,
    verdict_table,
)


def _mean(x, axis):
    return np.mean(x, axis=axis)


def _runs(values: dict[str, list[float]]) -> pd.DataFrame:
    """Long rows (activation, seed, final_loss) from {variant: one value per seed}."""
    return pd.DataFrame([(name, seed, value) for name, column in values.items()
                         for seed, value in enumerate(column)],
                        columns=["activation", "seed", "final_loss"])


def test_mean_interval_is_students_t_interval():
    values = np.random.default_rng(0).normal(2.0, 0.3, size=7)
    interval = mean_interval(values, confidence=0.9)
    low, high = stats.t.interval(0.9, 6, loc=values.mean(), scale=values.std(ddof=1) / 7**0.5)
    assert interval.n == 7 and interval.dropped == 0
    assert interval.mean == pytest.approx(values.mean(), rel=1e-12)
    assert (interval.low, interval.high) == pytest.approx((low, high), rel=1e-12)


def test_mean_interval_drops_nan_and_handles_one_or_constant_values():
    with_nan = mean_interval([1.0, math.nan, 2.0, 4.0])
    assert (with_nan.n, with_nan.dropped) == (3, 1)
    clean = mean_interval([1.0, 2.0, 4.0])
    assert (with_nan.mean, with_nan.low, with_nan.high) == (clean.mean, clean.low, clean.high)
    one = mean_interval([2.5])
    assert one.mean == 2.5 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    constant = mean_interval([3.0] * 4)
    assert constant.low == constant.high == constant.mean == 3.0
    assert math.isnan(mean_interval([math.nan]).mean)


def test_paired_comparison_matches_scipy_on_the_differences():
    rng = np.random.default_rng(1)
    baseline = rng.normal(2.0, 0.2, size=9)
    variant = baseline + rng.normal(-0.02, 0.05, size=9)
    pair = paired_comparison(variant, baseline)
    differences = variant - baseline
    expected = stats.permutation_test((differences,), _mean, vectorized=True,
                                      permutation_type="samples", n_resamples=np.inf)
    assert pair.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    assert len(expected.null_distribution) == 2**9  # all sign flips: exact
    sem = differences.std(ddof=1) / 3
    low, high = stats.t.interval(0.95, 8, loc=differences.mean(), scale=sem)
    assert (pair.diff, pair.low, pair.high) == pytest.approx((differences.mean(), low, high))
    assert pair.sd == pytest.approx(differences.std(ddof=1))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_signed_differences_reach_the_minimum_p(sign):
    baseline = np.linspace(1.0, 2.0, 8)
    variant = baseline + sign * np.linspace(0.01, 0.08, 8)
    assert paired_comparison(variant, baseline).p_value == 2 / 256
    assert paired_comparison(variant[:5], baseline[:5]).p_value == 2 / 32  # 0.0625 > 0.05
    assert paired_comparison(variant[:6], baseline[:6]).p_value == 2 / 64


def test_monte_carlo_p_beyond_exact_range_is_close_and_reproducible():
    differences = np.random.default_rng(2).normal(0.3, 1.0, size=17)
    exact = stats.permutation_test((differences,), _mean, vectorized=True,
                                   permutation_type="samples", n_resamples=np.inf).pvalue
    monte_carlo = sign_flip_p_value(differences)  # 17 > EXACT_UP_TO: sampled flips
    assert monte_carlo != exact
    assert monte_carlo == pytest.approx(exact, abs=0.01)
    assert sign_flip_p_value(differences) == monte_carlo


def test_paired_comparison_drops_pairs_with_nan_and_needs_two():
    pair = paired_comparison([1.0, math.nan, 3.0, 5.0], [0.0, 1.0, math.nan, 3.0])
    assert (pair.n, pair.dropped, pair.diff) == (2, 2, 1.5)
    single = paired_comparison([1.0, math.nan], [0.5, 0.2])
    assert (single.n, single.dropped, single.diff) == (1, 1, 0.5)
    assert math.isnan(single.p_value) and math.isnan(single.low) and math.isnan(single.sd)
    with pytest.raises(ValueError, match="length"):
        paired_comparison([1.0, 2.0], [1.0])


def test_identical_values_give_p_one_and_a_constant_shift_a_point_interval():
    values = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    same = paired_comparison(values, values)
    assert same.diff == 0.0 and same.p_value == 1.0 and same.low == same.high == 0.0
    shifted = paired_comparison(np.add(values, 0.1), values)
    assert shifted.sd == pytest.approx(0.0, abs=1e-12)
    assert shifted.low == pytest.approx(0.1) and shifted.high == pytest.approx(0.1)
    assert shifted.p_value == 2 / 64


def test_holm_by_hand():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]).tolist() == [1.0, 1.0]  # capped at 1
    with_nan = holm([0.01, math.nan, 0.02])  # NaN: not a test, m = 2
    assert with_nan[0] == pytest.approx(0.02) and with_nan[2] == pytest.approx(0.02)
    assert math.isnan(with_nan[1])
    assert holm([0.02]).tolist() == [0.02]


def test_holm_is_monotone_and_never_below_the_raw_p():
    p = np.random.default_rng(3).uniform(0, 0.2, size=12)
    adjusted = holm(p)
    order = np.argsort(p)
    assert np.all(np.diff(adjusted[order]) >= 0)
    assert np.all(adjusted >= p) and np.all(adjusted <= 1)
    assert adjusted[order[0]] == pytest.approx(12 * p[order[0]])


def test_verdict_direction_and_alpha():
    assert verdict(-0.1, 0.01) == BETTER and verdict(0.1, 0.01) == WORSE
    assert verdict(-0.1, 0.01, lower_is_better=False) == WORSE  # e.g. accuracy
    assert verdict(-0.1, 0.06) == NO_DIFFERENCE
    assert verdict(-0.1, 0.06, alpha=0.1) == BETTER
    assert verdict(-0.1, math.nan) == NO_DIFFERENCE


def test_verdict_table_better_worse_noise_over_eight_seeds():
    base = [2.00, 2.10, 1.95, 2.05, 2.20, 1.90, 2.02, 2.08]
    noise = [0.05, -0.04, 0.03, -0.03, 0.02, -0.02, 0.01, -0.01]
    runs = _runs({"relu": base,
                  "gelu": [b - 0.1 + 0.01 * (i % 3) for i, b in enumerate(base)],
                  "swish": [b + n for b, n in zip(base, noise, strict=True)],
                  "tanh": [b + 0.1 - 0.01 * (i % 2) for i, b in enumerate(base)]})
    table = verdict_table(runs, "activation")
    assert table.index.tolist() == ["relu", "gelu", "swish", "tanh"]
    assert table.loc["relu", "verdict"] == BASELINE
    assert math.isnan(table.loc["relu", "p_value"]) and table.loc["relu", "seeds_needed"] is None
    assert table.loc["gelu", "verdict"] == BETTER and table.loc["tanh", "verdict"] == WORSE
    assert table.loc["swish", "verdict"] == NO_DIFFERENCE and table.loc["swish", "p_value"] > 0.5
    assert table.loc["gelu", "p_value"] == 2 / 256
    assert table.loc["gelu", "p_adjusted"] == pytest.approx(3 * 2 / 256)  # Holm over 3 tests
    assert table.loc["swish", "p_adjusted"] == pytest.approx(table.loc["swish", "p_value"])
    low, high = table.loc["gelu", ["final_loss_ci_low", "final_loss_ci_high"]]
    gelu = runs[runs.activation == "gelu"].final_loss
    assert (low, high) == pytest.approx((mean_interval(gelu).low, mean_interval(gelu).high))
    assert low < gelu.mean() < high
    assert table.loc["gelu", "diff_ci_high"] < 0 < table.loc["tanh", "diff_ci_low"]
    assert table.loc["gelu", "paired_seeds"] == 8
    assert table.loc["swish", "seeds_needed"] > 8  # the noise would need many more seeds


def test_verdict_table_higher_is_better_and_baseline_choice():
    runs = _runs({"a": [0.5, 0.6, 0.55, 0.52, 0.58, 0.61], "b": [0.7, 0.8, 0.75, 0.71, 0.79, 0.8]})
    runs = runs.rename(columns={"final_loss": "accuracy"})
    table = verdict_table(runs, "activation", value="accuracy", lower_is_better=False)
    assert table.loc["b", "verdict"] == BETTER and "accuracy_ci_low" in table.columns
    flipped = verdict_table(runs, "activation", value="accuracy", baseline="b",
                            lower_is_better=False)
    assert flipped.loc["b", "verdict"] == BASELINE and flipped.loc["a", "verdict"] == WORSE
    with pytest.raises(ValueError, match="baseline 'c'"):
        verdict_table(runs, "activation", value="accuracy", baseline="c")
    with pytest.raises(ValueError, match="twice"):
        verdict_table(pd.concat([runs, runs.iloc[:1]]), "activation", value="accuracy")


def test_five_seeds_cannot_decide_and_say_six_are_needed():
    base = [2.0, 2.1, 1.9, 2.05, 1.95]
    table = verdict_table(_runs({"relu": base, "gelu": [b - 0.5 for b in base]}), "activation")
    row = table.loc["gelu"]
    assert row["p_value"] == 0.0625 and row["verdict"] == NO_DIFFERENCE
    assert row["seeds_needed"] == 6
    assert "6 paired seeds would detect it" in describe("gelu", row, "relu")
    assert "no verdict possible" in row["note"] and "6+ seeds" in row["note"]


def test_eight_seeds_over_seven_variants_say_no_verdict_is_possible():
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02, 2.07, 1.98]
    variants = {"relu": base, **{f"v{i}": [b - 0.5 for b in base] for i in range(7)}}
    row = verdict_table(_runs(variants), "activation").loc["v0"]
    assert row["p_value"] == 2 / 2**8 and row["p_adjusted"] == pytest.approx(7 * 2 / 2**8)
    assert row["verdict"] == NO_DIFFERENCE  # every seed agrees, yet 0.055 > 0.05
    assert "no verdict possible" in row["note"] and "9+ seeds" in row["note"]
    assert [fewest_seeds_for_a_verdict(m) for m in (1, 2, 3, 4, 6, 7, 12, 13)] == \
        [6, 7, 7, 8, 8, 9, 9, 10]
    nine = {k: [*v, v[0]] for k, v in variants.items()}
    assert verdict_table(_runs(nine), "activation").loc["v0"]["note"] == ""


def test_no_verdict_note_counts_the_variants_tested_and_the_most_seeds():
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02, 2.07, 1.98, 2.03, 1.97]
    # b has 4 NaN seeds (6 paired) but a has 10: Holm can reach 0.05, so no such note
    runs = _runs({"base": base, "a": [x - 0.5 for x in base],
                  "b": [x - 0.5 for x in base[:6]] + [math.nan] * 4})
    table = verdict_table(runs, "activation")
    assert table.loc["b", "verdict"] == BETTER and "4 seeds dropped" in table.loc["b", "note"]
    assert "no verdict possible" not in table.loc["b", "note"]
    # an untested variant (1 paired seed) does not count as a Holm comparison: 3 x 2/2^7 < 0.05
    seven = base[:7]
    runs = _runs({"base": seven, **{k: [x - 0.5 for x in seven] for k in "abc"},
                  "d": [1.0] + [math.nan] * 6})
    table = verdict_table(runs, "activation")
    assert table.loc["a", "verdict"] == BETTER and table.loc["a", "note"] == ""


def test_verdict_table_nan_seed_and_single_seed():
    runs = _runs({"relu": [2.0, 2.1, 1.9, 2.05, 1.95, 2.02, 2.07],
                  "gelu": [1.8, math.nan, 1.7, 1.85, 1.75, 1.81, 1.86]})
    row = verdict_table(runs, "activation").loc["gelu"]
    assert row["paired_seeds"] == 6 and "1 seed dropped" in row["note"]
    assert row["p_value"] == 2 / 64 and row["verdict"] == BETTER
    single = verdict_table(_runs({"relu": [2.0], "gelu": [1.5]}), "activation").loc["gelu"]
    assert math.isnan(single["p_value"]) and single["verdict"] == NO_DIFFERENCE
    assert single["diff_vs_baseline"] == -0.5 and single["seeds_needed"] is None
    assert "1 paired seed: no test" in single["note"]
    assert math.isnan(single["final_loss_ci_low"])
    line = describe("gelu", single, "relu")
    assert "0.5 lower" in line and line.endswith(NO_DIFFERENCE)


def test_identical_variants_get_p_one_and_no_seeds_needed():
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02]
    row = verdict_table(_runs({"relu": base, "copy": base}), "activation").loc["copy"]
    assert row["p_value"] == 1.0 and row["verdict"] == NO_DIFFERENCE
    assert row["seeds_needed"] is None


def test_seeds_needed_matches_a_direct_noncentral_t_power_computation():
    for effect in (0.5, 0.8, 1.0):
        n = seeds_needed(0.1 * effect, 0.1)
        critical = stats.t.ppf(0.975, n - 1)
        power = stats.nct.sf(critical, n - 1, effect * n**0.5) + stats.nct.cdf(
            -critical, n - 1, effect * n**0.5)
        critical = stats.t.ppf(0.975, n - 2)
        below = stats.nct.sf(critical, n - 2, effect * (n - 1)**0.5)
        assert power >= 0.8 > below and n >= 6
        assert paired_t_power(n, effect) == pytest.approx(power)
    # the G*Power table for a two-tailed one-sample t-test at 80% power: 34, 15, 10 pairs
    assert [seeds_needed(d, 1.0) for d in (0.5, 0.8, 1.0)] == [34, 15, 10]


def test_seeds_needed_limits():
    assert seeds_needed(-0.5, 1.0) == seeds_needed(0.5, 1.0)
    assert seeds_needed(2.0, 1.0) == seeds_needed(4.0, 1.0) == 6  # t needs 4: sign-flip floor
    assert seeds_needed(0.3, 1.0) > seeds_needed(0.6, 1.0)  # larger effect, fewer seeds
    assert seeds_needed(0.1, 0.0) == 6 and seeds_needed(0.1, 0.0, alpha=0.01) == 8
    assert seeds_needed(0.0, 1.0) is None and seeds_needed(math.nan, 1.0) is None
    assert seeds_needed(0.1, math.nan) is None
    assert seeds_needed(0.1, 1.0, cap=100) is None  # needs 787
    # Holm over 3 variants: its strictest step is alpha / 3, so 2 / 2^n <= 0.0167 -> n >= 7
    assert seeds_needed(0.1, 0.0, comparisons=3) == 7
    assert seeds_needed(0.5, 1.0, comparisons=3) > seeds_needed(0.5, 1.0)


def test_six_seeds_cannot_decide_between_three_variants_and_say_seven_are_needed():
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02]
    table = verdict_table(_runs({"relu": base, **{name: [b - 0.5 for b in base]
                                                  for name in ("gelu", "swish", "silu")}}),
                          "activation")
    assert table["p_value"].iloc[1:].tolist() == [2 / 64] * 3
    assert table["p_adjusted"].iloc[1:].tolist() == pytest.approx([3 * 2 / 64] * 3)  # 0.094
    assert (table["verdict"].iloc[1:] == NO_DIFFERENCE).all()
    assert table["seeds_needed"].iloc[1:].tolist() == [7] * 3


def test_describe_reads_in_the_direction_of_the_difference():
    base = [2.00, 2.10, 1.95, 2.05, 2.20, 1.90, 2.02, 2.08]
    table = verdict_table(_runs({"relu": base, "gelu": [b - 0.012 - 0.001 * (i % 3)
                                                        for i, b in enumerate(base)]}),
                          "activation")
    row = table.loc["gelu"]
    line = describe("gelu", row, "relu")
    assert line.startswith(f"gelu vs relu: final_loss {-row['diff_vs_baseline']:.3g} lower ")
    assert f"95% CI {-row['diff_ci_high']:.3g} to {-row['diff_ci_low']:.3g}" in line
    assert (f"p = {row['p_value']:.2g}, Holm {row['p_adjusted']:.2g}, P(improvement) "
            f"{row['p_improvement']:.2g} (95% CI {row['p_improvement_low']:.2g} to "
            f"{row['p_improvement_high']:.2g}) -> better") in line
    assert describe("relu", table.loc["relu"], "relu") == "relu: baseline"


def test_has_verdict_only_for_rows_tested_against_a_baseline():
    """The one filter of every comparison's verdict lines: a baseline's own row, a row without
    a verdict (None, or NaN as a pandas pivot has it) and a missing column are left out."""
    assert [has_verdict({"verdict": v}) for v in (BETTER, WORSE, NO_DIFFERENCE)] == [True] * 3
    assert not any(has_verdict(row) for row in ({"verdict": BASELINE}, {"verdict": None},
                                                {"verdict": math.nan}, {}))
    assert not has_verdict(pd.Series({"verdict": math.nan}))
    assert has_verdict(pd.Series({"verdict": BETTER}))


def test_module_imports_no_torch_hydra_or_omegaconf():
    code = ("import sys, transformer_lab.measures.statistics; "
            "print(sorted(m for m in ('torch', 'hydra', 'omegaconf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _improvement_by_hand(x, y, lower_is_better=True) -> float:
    """The share of ordered pairs of different seeds (i, j) where x[i] beats y[j], ties 1/2."""
    scores = [0.5 if a == b else float((a < b) == lower_is_better)
              for i, a in enumerate(x) for j, b in enumerate(y) if i != j]
    return sum(scores) / len(scores)


def test_probability_of_improvement_by_hand():
    x, y = [1.0, 2.0, 3.0], [2.0, 2.0, 4.0]
    lower = probability_of_improvement(x, y)
    higher = probability_of_improvement(x, y, lower_is_better=False)
    assert lower.p == pytest.approx(3.5 / 6) == _improvement_by_hand(x, y)
    assert higher.p == pytest.approx(2.5 / 6) == _improvement_by_hand(x, y, False)
    assert lower.low <= lower.p <= lower.high
    assert tuple(probability_of_improvement(x + [math.nan], y + [0.0])) == tuple(lower)
    assert all(math.isnan(v) for v in probability_of_improvement([1.0], [2.0]))
    assert tuple(probability_of_improvement([1.0, 2.0, 3.0], [5.0, 6.0, 7.0])) == (1.0, 1.0, 1.0)


def test_probability_of_improvement_is_unbiased_for_a_random_seed_against_a_random_seed():
    """Seeds with a shared effect (sd 3, both sides) and the baseline 0.5 higher: a random
    seed of the variant beats a random seed of the baseline with P = Phi(0.5 / sqrt(20)); the
    same seed's pair wins far more often (Phi(0.5 / sqrt(2))), which is why same-seed pairs
    are left out. Over 3000 sets of 8 seeds the mean estimate is within 4 standard errors of
    the first."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 3, size=(3000, 8))
    x = shared + rng.normal(size=shared.shape)
    y = shared + 0.5 + rng.normal(size=shared.shape)
    estimates = np.array([probability_of_improvement(a, b, resamples=1).p
                          for a, b in zip(x, y, strict=True)])
    standard_error = estimates.std(ddof=1) / math.sqrt(len(estimates))
    assert abs(estimates.mean() - stats.norm.cdf(0.5 / math.sqrt(20))) < 4 * standard_error
    assert stats.norm.cdf(0.5 / math.sqrt(2)) - estimates.mean() > 20 * standard_error


def test_probability_of_improvement_interval_is_a_paired_bootstrap():
    rng = np.random.default_rng(1)
    widths = []
    for n in (8, 32):
        x, y = rng.normal(size=n), rng.normal(0.5, 1, size=n)
        result = probability_of_improvement(x, y)
        assert result.low <= result.p <= result.high
        assert tuple(probability_of_improvement(x, y)) == tuple(result)  # fixed seed
        widths.append(result.high - result.low)
    assert widths[1] < widths[0]


def test_verdict_table_has_the_probability_of_improvement():
    base = [2.00, 2.10, 1.95, 2.05, 2.20, 1.90, 2.02, 2.08]
    gelu = [b - 0.05 + 0.04 * (i % 2) for i, b in enumerate(base)]
    table = verdict_table(_runs({"relu": base, "gelu": gelu}), "activation")
    row = table.loc["gelu"]
    assert row["p_improvement"] == pytest.approx(_improvement_by_hand(gelu, base))
    assert row["p_improvement_low"] <= row["p_improvement"] <= row["p_improvement_high"]
    assert math.isnan(table.loc["relu", "p_improvement"])
    flipped = verdict_table(_runs({"relu": base, "gelu": gelu}), "activation",
                            lower_is_better=False)
    assert flipped.loc["gelu", "p_improvement"] == pytest.approx(1 - row["p_improvement"])


def test_variance_by_source_recovers_an_additive_table():
    """y = a_i + b_j: the init and data variances are the sample variances of a and b, no
    residual; an interaction u_i v_j (rows and columns summing to 0) is residual only."""
    a, b = np.array([0.0, 1.0, 2.0]), np.array([0.0, 10.0, 0.0, -10.0])
    parts = variance_by_source(a[:, None] + b[None, :])
    assert (parts.init, parts.data, parts.residual) == pytest.approx(
        (a.var(ddof=1), b.var(ddof=1), 0.0), abs=1e-12)
    assert (parts.n_init, parts.n_data, parts.mean) == (3, 4, pytest.approx(1.0))
    assert parts.shares == pytest.approx((1 / (1 + 200 / 3), (200 / 3) / (1 + 200 / 3), 0.0))
    u, v = np.array([1.0, 0.0, -1.0]), np.array([1.0, -1.0, 1.0, -1.0])
    parts = variance_by_source(a[:, None] + b[None, :] + 0.3 * u[:, None] * v[None, :])
    residual = 0.09 * (u ** 2).sum() * (v ** 2).sum() / (2 * 3)
    assert parts.residual == pytest.approx(residual)
    assert parts.init == pytest.approx(a.var(ddof=1) - residual / 4)
    assert parts.data == pytest.approx(b.var(ddof=1) - residual / 3)


def test_variance_by_source_is_unbiased_under_the_random_effects_model():
    """3000 tables of 4 init x 5 data seeds with var_init 1, var_data 4, var_residual 0.25:
    each mean estimate within 4 standard errors of the truth (a negative estimate counted as
    it is)."""
    rng = np.random.default_rng(2)
    shape = (3000, 4, 5)
    tables = (rng.normal(0, 1.0, size=(3000, 4, 1)) + rng.normal(0, 2.0, size=(3000, 1, 5))
              + rng.normal(0, 0.5, size=shape))
    estimates = np.array([[p.init, p.data, p.residual]
                          for p in map(variance_by_source, tables)])  # (3000, 3)
    errors = estimates.std(axis=0, ddof=1) / math.sqrt(len(estimates))
    assert np.all(np.abs(estimates.mean(axis=0) - [1.0, 4.0, 0.25]) < 4 * errors)


def test_variance_by_source_refuses_an_incomplete_table():
    with pytest.raises(ValueError, match="at least 2 x 2 runs, got shape \\(1, 3\\)"):
        variance_by_source([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="1 of 4 cells have no value"):
        variance_by_source([[1.0, 2.0], [math.nan, 3.0]])
