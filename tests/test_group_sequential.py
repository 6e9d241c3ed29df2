"""The group-sequential design of ``--seeds auto:MAX`` (``measures.group_sequential``): its
boundaries equal published ones and an independent integration, its t-test levels keep the
false-positive rate at alpha over all looks, and ``GroupSequentialTest`` decides as the rule
says."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from transformer_lab.measures.group_sequential import (
    GroupSequentialTest,
    increments,
    sign_draws,
    sign_flip_boundaries,
    spending,
)
from transformer_lab.measures.statistics import sign_flip_p_value


@pytest.mark.parametrize("spend, first_boundary", [
    # Lan-DeMets spending, two-sided alpha 0.05, five equal looks: the first look's z boundary
    # (Jennison & Turnbull 2000, table 7.6; gsDesign's sfLDOF / sfLDPocock with test.type=2),
    # to the 4 decimals printed; at the first look it is the spent level's normal quantile
    ("obrien_fleming", 4.8769),
    ("pocock", 2.4380),
])
def test_the_spending_functions_are_the_published_ones(spend, first_boundary):
    spent = spending(spend, 0.05)
    assert stats.norm.isf(spent(0.2) / 2) == pytest.approx(first_boundary, abs=1e-4)
    assert spent(1.0) == pytest.approx(0.05, rel=1e-12) and spent(0.0) == 0.0


def test_hwang_shih_decani_at_zero_spends_linearly():
    spent = spending("hsd:0", 0.05)
    assert [spent(t) for t in (0.25, 0.5, 1.0)] == pytest.approx([0.0125, 0.025, 0.05])


def test_obrien_fleming_spends_almost_nothing_early_and_alpha_in_all():
    spent = increments(list(range(2, 17, 2)), 16, 0.05)
    assert spent[0] < 1e-6 and np.all(np.diff(spent) > 0)
    assert spent.sum() == pytest.approx(0.05, rel=1e-9)


def test_one_look_is_the_fixed_sign_flip_test():
    # A design with one look at MAX spends all of alpha there: its verdict is the fixed
    # sign-flip test's (statistics.sign_flip_p_value, exact at 10 seeds) away from the edge.
    rng = np.random.default_rng(2)
    signs = sign_draws(10, 20_000)
    for shift in (0.0, 0.3, 0.6, 0.9, 1.2):
        d = rng.normal(shift, 1.0, size=10)
        p = sign_flip_p_value(d)
        if abs(p - 0.05) < 0.01:
            continue
        bound, level = sign_flip_boundaries(np.abs(d), [10], np.array([0.05]), signs)
        assert (abs(d.sum()) >= bound[-1]) == (p <= 0.05)
        assert 0.04 < level[-1] <= 0.05 + 3 * math.sqrt(0.05 / 20_000)


def test_the_design_keeps_the_false_positive_rate_on_heavy_tailed_differences():
    # Symmetric Laplace differences with a few huge ones (no normality): the share of runs with
    # a verdict at any of 10 looks is at most alpha, within 4 binomial standard errors.
    looks, runs, alpha = list(range(2, 21, 2)), 3_000, 0.05
    rng = np.random.default_rng(7)
    d = rng.laplace(size=(runs, 20)) * np.where(rng.random((runs, 20)) < 0.05, 50.0, 1.0)
    bounds, _ = sign_flip_boundaries(np.abs(d), looks, increments(looks, 20, alpha),
                                     sign_draws(20, 2_000))
    sums = np.abs(np.round(np.stack([d[:, :n].sum(axis=1) for n in looks], axis=1), 12))
    rate = float((sums >= bounds).any(axis=1).mean())
    assert rate <= alpha + 4 * math.sqrt(alpha * (1 - alpha) / runs)
    assert rate > alpha / 2  # not a test that never speaks
    # peeking with the fixed level at every look would not keep it
    fixed_bounds, _ = sign_flip_boundaries(np.abs(d), [20], np.array([alpha]),
                                           sign_draws(20, 2_000))
    assert float((sums[:, -1] >= fixed_bounds[:, 0]).mean()) <= alpha + 0.02


def test_the_test_decides_a_clear_effect_early_and_not_a_null_one():
    rng = np.random.default_rng(3)
    test = GroupSequentialTest(["base", "clear", "same"], "base", max_seeds=16)
    while not test.done():
        base = rng.normal(2.0, 0.01, size=2)
        test.update_values({"base": base, "clear": base - 0.05 + rng.normal(0, 0.01, 2),
                            "same": base + rng.normal(0, 0.01, 2)})
    assert test.verdict("clear") == "better" and test.seeds_used("clear") < 16
    assert test.stopped_because("clear") == "verdict"
    low, high = test.interval("clear")
    assert low < -0.05 < high < 0  # the repeated interval holds the true shift, excludes 0
    assert test.seeds_used("same") == 16 or test.verdict("same") is not None
    assert test.level == pytest.approx(0.05 / 2)


def test_a_bad_spending_function_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="obrien_fleming, pocock and hsd:G"):
        GroupSequentialTest(["a", "b"], "a", max_seeds=8, spend="linear")


def test_a_look_spends_what_earlier_looks_could_not():
    # Eight equal magnitudes, a look after every seed, all 2^8 sign patterns (exact): at 6
    # seeds the smallest share beyond a boundary (2 / 2^6) exceeds the level spent so far, at
    # 7 seeds 2 / 2^7 does not exceed it. The level left unspent at looks 1-6 carries over, so
    # the run of seven equal signs stops at look 7, and no look overspends the cumulative level.
    looks, alpha = list(range(1, 9)), 0.05
    spent = increments(looks, 8, alpha)
    assert spent[:6].sum() < 2 / 2 ** 6 and spent[6] < 2 / 2 ** 7 <= spent[:7].sum()
    signs = sign_draws(8)
    assert len(np.unique(signs, axis=0)) == len(signs) == 2 ** 8  # every pattern once
    bounds, levels = sign_flip_boundaries(np.ones(8), looks, spent, signs)
    assert np.all(np.isinf(bounds[:6])) and bounds[6] == 7.0
    assert np.all(np.cumsum(levels) <= np.cumsum(spent) + 1e-12)
    assert levels.sum() == pytest.approx(2 / 2 ** 7)  # look 7's all-equal runs only
