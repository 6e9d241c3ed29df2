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
    nominal_levels,
    spending,
    t_p_values,
    z_boundaries,
)

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


def test_obrien_fleming_spends_almost_nothing_early_and_about_alpha_at_the_end():
    levels = nominal_levels(list(range(2, 17, 2)), 16, 0.05)
    assert levels[0] == 0 and np.all(np.diff(levels[levels > 0]) > 0)
    assert 0.02 < levels[-1] < 0.05


def test_the_t_levels_keep_the_false_positive_rate_over_all_looks():
    # Normal differences under H0 (another seed than the levels' own simulation): the share of
    # runs with a verdict at any look is alpha, within 4 binomial standard errors.
    looks, runs, alpha = list(range(2, 21, 2)), 40_000, 0.05
    d = np.random.default_rng(7).standard_normal((runs, 20)) * 3.0
    levels = nominal_levels(looks, 20, alpha)
    p = np.stack([t_p_values(d[:, :n]) for n in looks], axis=1)
    rate = float(((p <= levels) & (levels > 0)).any(axis=1).mean())
    assert abs(rate - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / runs)
    # peeking at the fixed level every look would not keep it
    assert float((p <= alpha).any(axis=1).mean()) > 2 * alpha


def test_t_p_values_equal_scipys_paired_t_test():
    d = np.random.default_rng(1).normal(0.3, 1.0, size=(5, 9))
    expected = [stats.ttest_1samp(row, 0.0).pvalue for row in d]
    assert t_p_values(d) == pytest.approx(expected, rel=1e-9)


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
