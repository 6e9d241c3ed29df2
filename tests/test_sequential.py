"""The anytime-valid paired test of ``--seeds auto`` (transformer_lab.measures.sequential): the
e-value by hand, the false-positive rate under the null against naive peeking at the fixed test
on the same draws, a clear effect found in few seeds, the confidence sequence's coverage, the
Bonferroni correction over variants, and the benchmark's batched fixed test and last line.

Rates are checked against binomial limits at 99%: with S simulated runs and a true rate at
most alpha, the count of false positives exceeds ``binom.ppf(0.99, S, alpha)`` with
probability at most 1% (and the draws are seeded, so a pass is reproducible)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from transformer_lab.measures.sequential import (
    BETS,
    STOPPED_MAX_SEEDS,
    STOPPED_VERDICT,
    SequentialTest,
    confidence_sequence,
    e_process,
    first_crossing,
)
from transformer_lab.measures.statistics import BETTER, WORSE, holm, sign_flip_p_value

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not an installed package
from benchmarks.sequential_error import main, sign_flip_p_values  # noqa: E402

ALPHA = 0.05
GROUP, MOST = 2, 32
LOOKS = list(range(GROUP, MOST + 1, GROUP))


def two_sided(differences: np.ndarray) -> np.ndarray:
    up, down = e_process(differences, LOOKS[:differences.shape[-1] // GROUP])
    return (up + down) / 2


def upper_limit(runs: int, rate: float = ALPHA) -> int:
    """The most false positives that S runs at a true rate of ``rate`` give at 99%."""
    return int(stats.binom.ppf(0.99, runs, rate))


def naive_peeking(differences: np.ndarray) -> np.ndarray:
    """Per run (runs, n) of one variant: whether the fixed sign-flip test reached p <= alpha
    at any look (stopping there)."""
    hits = np.zeros(len(differences), dtype=bool)
    for n in LOOKS:
        hits |= sign_flip_p_values(differences[:, :n]) <= ALPHA
    return hits


def test_equal_same_signed_differences_give_the_closed_form_e_value():
    """All |d| equal: every weight is 1, so each bet's wealth is (1 + lam)^n on the up side
    and (1 - lam)^n down, mixed evenly over the 19 bets, the two sides averaged."""
    for n in (2, 6, 8, 12):
        e = two_sided(np.full(n, 0.3))[-1]
        by_hand = sum((1 + lam) ** n + (1 - lam) ** n for lam in BETS) / (2 * len(BETS))
        assert e == pytest.approx(by_hand, rel=1e-12)
    assert list(BETS) == pytest.approx([0.05 * k for k in range(1, 20)])


def test_weights_scale_each_bet_by_magnitude_over_the_upper_quartile():
    """One group (3, -1): upper quartile 2.5 (numpy's linear rule), weights (1, 0.4); the up
    side wins on the first seed and loses 0.4 of a bet on the second."""
    up, down = e_process(np.array([3.0, -1.0]), [2])
    assert up[0] == pytest.approx(np.mean((1 + BETS) * (1 - 0.4 * BETS)), rel=1e-12)
    assert down[0] == pytest.approx(np.mean((1 - BETS) * (1 + 0.4 * BETS)), rel=1e-12)
    # weights use the magnitudes seen once a seed's group arrives: (4, 1) -> quartile 3.25
    # (weights 1, 1/3.25), then (4, 1, 2, 8) -> 5 (weights 0.4, 1)
    up, _ = e_process(np.array([4.0, 1.0, 2.0, 8.0]), [2, 4])
    payoff = np.array([1.0, 1 / 3.25, 0.4, 1.0])
    assert up[1] == pytest.approx(np.mean(np.prod(1 + payoff[:, None] * BETS, axis=0)))


def test_the_verdict_comes_at_the_first_group_over_k_over_alpha():
    """Constant positive differences: the e-value is the closed form above; the test decides
    at the first group where it reaches K / alpha, 20 for one variant, 140 for seven."""
    for k in (1, 7):
        names = [f"v{i}" for i in range(k)]
        test = SequentialTest(["base", *names], "base", ALPHA)
        first = next(n for n in LOOKS if two_sided(np.full(n, 1.0))[-1] >= k / ALPHA)
        while not test.done():
            test.update(dict.fromkeys(names, [1.0, 1.0]))
        assert test.threshold == k / ALPHA
        assert all(test.verdict(v) == WORSE and test.seeds_used(v) == first for v in names)
        assert all(test.stopped_because(v) == STOPPED_VERDICT for v in names)
        assert test.e_value("v0") >= k / ALPHA > two_sided(np.full(first - 2, 1.0))[-1]


def test_null_false_positive_rate_is_kept_where_naive_peeking_inflates_it():
    """Normal and heavy-tailed (t, 3 df) differences symmetric about 0, 32 seeds in groups of
    2: auto's false positives stay within alpha's 99% limit; re-running the sign-flip test
    after each group on the same draws flags far more runs, its rate's 99% lower limit
    above alpha."""
    rng = np.random.default_rng(0)
    runs = 400
    draws = np.concatenate([rng.normal(size=(runs // 2, MOST)),
                            rng.standard_t(3, size=(runs // 2, MOST))])
    auto = first_crossing(two_sided(draws), 1 / ALPHA) >= 0
    peeking = naive_peeking(draws)
    assert auto.sum() <= upper_limit(runs)
    lower = stats.binomtest(int(peeking.sum()), runs).proportion_ci(0.98, "exact").low
    assert lower > ALPHA and peeking.sum() > 2 * auto.sum()


def test_a_clear_effect_is_found_in_few_seeds():
    """Differences of 3 standard deviations (the size of most effects in experiments/): every
    run is decided in the right direction, in 12 seeds or fewer on average and never before
    8 (the first look at which the closed form above passes 20); lower-is-better False flips
    the word."""
    rng = np.random.default_rng(1)
    draws = rng.normal(-3.0, 1.0, size=(200, MOST))
    up, down = e_process(draws, LOOKS)
    crossing = first_crossing((up + down) / 2, 1 / ALPHA)
    assert (crossing >= 0).all()
    at = crossing[:, None]
    assert (np.take_along_axis(down, at, 1) > np.take_along_axis(up, at, 1)).all()
    seeds = (crossing + 1) * GROUP
    assert seeds.mean() <= 12 and seeds.min() >= 8
    for lower_is_better, word in ((True, BETTER), (False, WORSE)):
        test = SequentialTest(["b", "v"], "b", ALPHA, lower_is_better=lower_is_better)
        for start in range(0, MOST, GROUP):
            test.update({"v": draws[0, start:start + GROUP]})
        assert test.verdict("v") == word and test.seeds_used("v") == seeds[0]


def test_the_confidence_sequence_covers_the_true_shift():
    """d = 0.7 + noise (normal): over 32 seeds in groups of 2 the interval, the running
    intersection of every group's, holds 0.7 in all but alpha's 99% limit of the runs; its
    ends are where the e-value of d - m crosses 1 / alpha."""
    rng = np.random.default_rng(2)
    runs, shift = 100, 0.7
    draws = shift + rng.normal(size=(runs, MOST))
    intervals = np.array([confidence_sequence(d, LOOKS, ALPHA) for d in draws])
    assert np.isfinite(intervals).all()
    missed = (intervals[:, 0] > shift) | (intervals[:, 1] < shift)
    assert missed.sum() <= upper_limit(runs)
    assert (intervals[:, 1] - intervals[:, 0]).mean() < 2.0  # narrower than +/- 1 sd

    def excluded(d, m):
        return two_sided(d - m).max() >= 1 / ALPHA

    for d, (low, high) in zip(draws[:5], intervals[:5], strict=True):
        width = high - low
        assert not excluded(d, low + 1e-6 * width) and not excluded(d, high - 1e-6 * width)
        assert excluded(d, low - 1e-3 * width) and excluded(d, high + 1e-3 * width)


def test_the_interval_is_unbounded_until_a_sign_bet_can_exclude_anything():
    d = np.random.default_rng(3).normal(size=6)
    assert confidence_sequence(d, [2, 4, 6], ALPHA) == (-math.inf, math.inf)
    constant = confidence_sequence(np.full(12, 0.3), list(range(2, 13, 2)), ALPHA)
    assert constant == pytest.approx((0.3, 0.3))


def test_bonferroni_keeps_the_family_wise_rate_over_variants_sharing_a_baseline():
    """Five variants equal to the baseline in distribution: their differences share the
    baseline's value per seed (dependent), and a false verdict on any of them counts. The
    family-wise rate stays within alpha's 99% limit; at 1 / alpha instead of K / alpha (no
    correction) the same draws flag more runs."""
    rng = np.random.default_rng(4)
    runs, k = 300, 5
    values = rng.normal(size=(runs, k + 1, MOST))
    differences = values[:, 1:] - values[:, :1]  # (runs, K, seeds)
    e = two_sided(differences)
    corrected = (first_crossing(e, k / ALPHA) >= 0).any(axis=1)
    uncorrected = (first_crossing(e, 1 / ALPHA) >= 0).any(axis=1)
    assert corrected.sum() <= upper_limit(runs)
    assert uncorrected.sum() > corrected.sum()
    test = SequentialTest(["b", *map(str, range(k))], "b", ALPHA)
    for _ in range(5):
        test.update({"0": [1.0, 1.0]})
    assert 1 / ALPHA <= test.e_value("0") < k / ALPHA and test.verdict("0") is None


def test_sequential_test_bookkeeping():
    test = SequentialTest(["relu", "gelu", "swish"], "relu", ALPHA, max_seeds=5)
    assert test.variants == test.running() == ["gelu", "swish"] and not test.done()
    with pytest.raises(ValueError, match="'tanh' is not a variant.*valid: gelu, swish"):
        test.update({"tanh": [1.0]})
    test.update_values({"relu": [1.0, 2.0], "gelu": [1.5, math.nan], "swish": [1.0, 2.5]})
    assert test.dropped == {"gelu": 1, "swish": 0}
    assert test.seeds_used("gelu") == 1 and test.seeds_used("swish") == 2
    reference = SequentialTest(["relu", "swish"], "relu", ALPHA)
    reference.update({"swish": [0.0, 0.5]})
    up, down = e_process(np.array([0.0, 0.5]), [2])
    assert test.e_value("swish") == pytest.approx((up[-1] + down[-1]) / 2)
    assert reference.e_value("swish") == pytest.approx(test.e_value("swish"))
    for _ in range(3):
        test.update({"gelu": [0.1, -0.2], "swish": [0.3, 0.2]})
    assert test.seeds_used("gelu") == test.seeds_used("swish") == 5  # capped mid-group
    assert test.stopped_because("gelu") == STOPPED_MAX_SEEDS and test.running() == []
    assert test.done()
    assert test.verdict("gelu") is None and test.interval("gelu") == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="no variant to test"):
        SequentialTest(["relu"], "relu")


def test_batched_fixed_test_equals_the_product_sign_flip_test():
    """The benchmark's batched p-values equal ``statistics.sign_flip_p_value`` where that is
    exact (up to 16 seeds), ties from resampled seeds included."""
    rng = np.random.default_rng(5)
    atoms = rng.normal(0.2, 1.0, size=8)
    for n in (2, 5, 9, 12):
        batch = np.concatenate([rng.normal(0.3, 1.0, size=(4, n)),
                                atoms[rng.integers(0, 8, size=(4, n))]])
        expected = [sign_flip_p_value(row) for row in batch]
        assert sign_flip_p_values(batch) == pytest.approx(expected, rel=1e-12)
    assert holm([0.01, 0.04]) == pytest.approx([0.02, 0.04])


def test_the_benchmark_writes_its_table_and_ends_with_the_summary_line(tmp_path, capsys):
    out = tmp_path / "sequential_error.csv"
    main(["--sims", "4", "--max", "8", "--out", str(out), "--planned-sims", "0"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"false_positive_rate=[0-9.]+ naive_peeking_rate=[0-9.]+ "
                        r"mean_seeds_auto=[0-9.]+ fixed_seeds=(\d+|>8)", last), last
    rows = out.read_text().splitlines()
    assert rows[0].startswith("family,variants,runs,fpr_auto,fpr_auto_low")
    assert rows[-1].startswith("all,22,32,")  # 8 families x 4 runs; 22 variants in all
