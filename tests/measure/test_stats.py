"""The confidence interval of the median: its order statistics, and its coverage on real draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusiontune.measure import Timing, median_ci


def _exact_coverage(n: int, confidence: float = 0.95) -> float:
    """The coverage the interval claims for ``n`` samples, from scipy's binomial (not our sum)."""
    from scipy.stats import binom

    j = 0
    while j < n // 2 and binom.cdf(j, n, 0.5) <= (1 - confidence) / 2:
        j += 1
    return 1.0 if j == 0 else 1 - 2 * binom.cdf(j - 1, n, 0.5)


def test_median_ci_of_15_samples_is_the_4th_to_12th_order_statistic() -> None:
    samples = np.random.default_rng(0).permutation(np.arange(1.0, 16.0))
    assert median_ci(samples) == (4.0, 12.0)  # coverage 1 - 2 P(Bin(15, 1/2) <= 3) = 96.5%


def test_median_ci_of_fewer_than_6_samples_is_the_range() -> None:
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)
    assert median_ci([2.0]) == (2.0, 2.0)


@given(n=st.integers(1, 200), confidence=st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]))
def test_median_ci_picks_the_order_statistics_scipy_binomial_picks(
    n: int, confidence: float
) -> None:
    from scipy.stats import binom

    x = np.arange(float(n))  # sorted: the value is the 0-based order statistic
    j = 0
    while j < n // 2 and binom.cdf(j, n, 0.5) <= (1 - confidence) / 2:
        j += 1
    expected = (0.0, n - 1.0) if j == 0 else (float(j - 1), float(n - j))
    assert median_ci(x[::-1], confidence) == expected


@pytest.mark.parametrize("n", [7, 15, 21, 40])
def test_median_ci_covers_the_true_median_at_its_stated_rate(n: int) -> None:
    """Lognormal draws (skewed, like timings), true median e^0 = 1: the share of intervals that
    cover it is the binomial coverage, within 4 standard errors, and never below 95% by more."""
    rng = np.random.default_rng(n)
    trials = 4000
    hits = 0
    for _ in range(trials):
        low, high = median_ci(rng.lognormal(0.0, 0.5, size=n))
        hits += low <= 1.0 <= high
    claimed = _exact_coverage(n)
    assert claimed >= 0.95
    se = math.sqrt(claimed * (1 - claimed) / trials)
    assert abs(hits / trials - claimed) <= 4 * se


def test_a_narrower_interval_would_break_the_coverage() -> None:
    """The interval is the tightest that keeps 95%: one order statistic inward covers less."""
    n = 21
    from scipy.stats import binom

    j = 6  # median_ci's j for 21 samples: [x_(6), x_(16)]
    assert median_ci(np.arange(1.0, n + 1)) == (float(j), float(n - j + 1))
    assert 1 - 2 * binom.cdf(j, n, 0.5) < 0.95 <= 1 - 2 * binom.cdf(j - 1, n, 0.5)


def test_median_ci_rejects_no_samples_and_a_bad_confidence() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        median_ci([])
    with pytest.raises(ValueError, match="confidence"):
        median_ci([1.0, 2.0], confidence=1.0)


def test_a_timing_carries_the_ci_of_its_median() -> None:
    samples = tuple(float(v) for v in np.random.default_rng(3).permutation(np.arange(1.0, 16.0)))
    t = Timing.from_samples(samples, number=1)
    assert (t.ci_low_s, t.ci_high_s) == (4.0, 12.0)
    assert t.ci_low_s <= t.median_s <= t.ci_high_s
    assert (t.noisy, t.attempts) == (False, 1)


def test_not_timed_has_no_interval_and_no_attempt() -> None:
    t = Timing.not_timed()
    assert math.isnan(t.ci_low_s) and math.isnan(t.ci_high_s) and t.attempts == 0
