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
    z_boundaries,
)
from transformer_lab.measures.statistics import sign_flip_p_value

FIVE_LOOKS = [0.2, 0.4, 0.6, 0.8, 1.0]


@pytest.mark.parametrize("spend, published", [
    # Lan-DeMets spending, two-sided alpha 0.05, five equal looks (Jennison & Turnbull 2000,
    # table 7.6; gsDesign's sfLDOF / sfLDPocock with test.type=2), to the 4 decimals printed
    ("obrien_fleming", [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
    ("pocock", [2.4380, 2.4268, 2.4101, 2.3966, 2.3860]),
])
def test_boundaries_equal_the_published_ones(spend, published):
    assert z_boundaries(FIVE_LOOKS, 0.05, spend) == pytest.approx(published, abs=2e-4)


def test_three_looks_spend_what_an_independent_integration_says():
    # The first-crossing probabilities of the boundaries, from scipy's multivariate normal CDF
    # (Genz's method: independent of the grid recursion), equal the levels spent.
    fractions = np.array([1 / 3, 2 / 3, 1.0])
    c = z_boundaries(fractions, 0.05, "pocock")
    spent = spending("pocock", 0.05)
    corr = np.sqrt(np.minimum.outer(fractions, fractions) / np.maximum.outer(fractions, fractions))
    stay = []
    for k in range(1, 4):
        mvn = stats.multivariate_normal(mean=np.zeros(k), cov=corr[:k, :k])
        # P(|Z_j| < c_j for j <= k) by inclusion-exclusion over the box's corners
        total = 0.0
        for corner in np.ndindex(*(2,) * k):
            signs = np.where(np.array(corner) == 1, 1.0, -1.0)
            upper = signs * c[:k]
            total += np.prod(signs) * mvn.cdf(upper)
        stay.append(total)
    crossed = 1 - np.array(stay)
    assert crossed == pytest.approx([spent(t) for t in fractions], abs=2e-4)


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
