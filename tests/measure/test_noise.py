"""Noise: a too-wide measurement is taken again up to `retries` times, then flagged.

The samples are injected (a scripted ``measure_once`` / ``measure_round``): nothing here sleeps or
depends on how busy the machine is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fusiontune.errors import UserError
from fusiontune.measure import (
    MeasureConfig,
    Timing,
    describe_noise,
    is_noisy,
    noise_ratio,
    time_interleaved,
    time_stable,
)
from fusiontune.workloads.space import loads_space

QUIET = (1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00)  # CV ~0.012, IQR 2% of the median
BUSY = (1.0, 3.0, 0.9, 2.5, 1.1, 4.0, 1.0)  # CV ~0.6, IQR 140%
LOUDER = (1.0, 9.0, 0.9, 7.5, 1.1, 8.0, 1.0)


def timing(samples: Sequence[float]) -> Timing:
    return Timing.from_samples(tuple(samples), number=1)


class Script:
    """A ``measure_once`` that returns the scripted sample sets in turn and counts its calls."""

    def __init__(self, *attempts: Sequence[float]) -> None:
        self.attempts = list(attempts)
        self.calls = 0

    def __call__(self, fn: Callable[[], Any], cfg: MeasureConfig) -> Timing:
        self.calls += 1
        return timing(self.attempts[min(self.calls, len(self.attempts)) - 1])


# ---- the decision ------------------------------------------------------------------------------
def test_quiet_samples_are_not_noisy_and_busy_ones_are() -> None:
    cfg = MeasureConfig()
    assert not is_noisy(timing(QUIET), cfg)
    assert is_noisy(timing(BUSY), cfg)


def test_a_cv_above_max_cv_alone_is_noise() -> None:
    one_outlier = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0)  # IQR 0, CV 0.31
    t = timing(one_outlier)
    assert t.iqr_s == 0 and t.cv > 0.3
    assert is_noisy(t, MeasureConfig(max_cv=0.3, max_iqr=0.1))
    assert not is_noisy(t, MeasureConfig(max_cv=0.4, max_iqr=0.1))


def test_an_iqr_above_max_iqr_times_the_median_alone_is_noise() -> None:
    t = timing((1.0, 1.0, 1.2, 1.2, 1.4, 1.4))  # IQR 0.3 on a 1.2 median: 25%
    assert t.iqr_ratio == pytest.approx(0.25)
    assert is_noisy(t, MeasureConfig(max_cv=10.0, max_iqr=0.2))
    assert not is_noisy(t, MeasureConfig(max_cv=10.0, max_iqr=0.3))


def test_noise_ratio_is_the_worse_of_the_two_ratios() -> None:
    t = timing(BUSY)
    cfg = MeasureConfig(max_cv=0.5, max_iqr=2.0)
    assert noise_ratio(t, cfg) == pytest.approx(max(t.cv / 0.5, t.iqr_ratio / 2.0))


def test_a_timing_without_samples_is_not_noisy() -> None:
    assert noise_ratio(Timing.not_timed(), MeasureConfig()) == 0.0


def test_limits_must_be_positive_and_retries_not_negative() -> None:
    for bad in ({"max_cv": 0.0}, {"max_iqr": -1.0}, {"retries": -1}):
        with pytest.raises(ValueError):
            MeasureConfig(**bad)


# ---- the retries -------------------------------------------------------------------------------
def test_a_quiet_first_measurement_is_kept_without_retry() -> None:
    script = Script(QUIET, BUSY)
    t = time_stable(lambda: None, MeasureConfig(retries=5), measure_once=script)
    assert script.calls == 1 and (t.attempts, t.noisy) == (1, False)


def test_a_busy_measurement_is_taken_again_until_one_is_quiet() -> None:
    script = Script(BUSY, LOUDER, QUIET, BUSY)
    t = time_stable(lambda: None, MeasureConfig(retries=5), measure_once=script)
    assert script.calls == 3
    assert (t.attempts, t.noisy, t.samples_s) == (3, False, QUIET)


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_retries_bound_the_measurements_then_the_timing_is_flagged(retries: int) -> None:
    script = Script(BUSY)
    t = time_stable(lambda: None, MeasureConfig(retries=retries), measure_once=script)
    assert script.calls == retries + 1
    assert (t.attempts, t.noisy) == (retries + 1, True)


def test_when_every_attempt_is_noisy_the_one_with_the_smallest_spread_is_kept() -> None:
    script = Script(LOUDER, BUSY, LOUDER)
    t = time_stable(lambda: None, MeasureConfig(retries=2), measure_once=script)
    assert t.samples_s == BUSY and t.noisy and t.attempts == 3


def test_time_stable_runs_the_real_protocol_once_per_attempt() -> None:
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1

    cfg = MeasureConfig(warmup=1, number=2, repeat=3)
    t = time_stable(fn, cfg)
    assert calls == t.attempts * (1 + 2 * 3) and 1 <= t.attempts <= cfg.retries + 1


def test_interleaved_callables_are_measured_again_together() -> None:
    rounds: list[list[Timing]] = [
        [timing(QUIET), timing(BUSY)],
        [timing(QUIET), timing(QUIET)],
    ]
    seen: list[int] = []

    def measure_round(fns: Sequence[Callable[[], Any]], n: int, cfg: MeasureConfig, m: float):
        seen.append(len(fns))
        return rounds[len(seen) - 1]

    a, b = time_interleaved(
        [lambda: None] * 2, 5, MeasureConfig(retries=4), measure_round=measure_round
    )
    assert seen == [2, 2]  # both again, though only the second was too wide
    assert (a.attempts, b.attempts, a.noisy, b.noisy) == (2, 2, False, False)


def test_interleaved_flags_only_the_callable_that_stayed_wide() -> None:
    def measure_round(fns: Sequence[Callable[[], Any]], n: int, cfg: MeasureConfig, m: float):
        return [timing(QUIET), timing(BUSY)]

    a, b = time_interleaved(
        [lambda: None] * 2, 5, MeasureConfig(retries=1), measure_round=measure_round
    )
    assert (a.noisy, b.noisy, a.attempts, b.attempts) == (False, True, 2, 2)


# ---- the words ---------------------------------------------------------------------------------
def test_describe_noise_says_spread_median_and_attempts_in_one_line() -> None:
    t = Timing((), 34.60e-3, 52.98e-3, 0.73, 1e-3, 1, 9, 1e-3, 0.12, True, 3)
    assert describe_noise(t) == (
        "noisy: CV 0.73, IQR 52.98 ms on a 34.60 ms median after 3 measurements;"
        " the machine is busy, figures are not reliable"
    )


def test_describe_noise_of_one_measurement_is_singular() -> None:
    t = Timing((), 12e-6, 5e-6, 0.4, 1e-6, 1, 7, 1e-6, 2e-5, True, 1)
    assert "IQR 5.0 us on a 12.0 us median after 1 measurement;" in describe_noise(t)


# ---- the [measure] keys ------------------------------------------------------------------------
MINIMAL = '[workload]\nname = "mlp"\n'


def test_the_space_reads_the_noise_limits() -> None:
    space = loads_space(
        MINIMAL + "[measure]\nmax_cv = 0.2\nmax_iqr = 0.15\nretries = 4\n", "x.toml"
    )
    assert (space.measure.max_cv, space.measure.max_iqr, space.measure.retries) == (0.2, 0.15, 4)


def test_the_space_defaults_are_measure_configs() -> None:
    d = MeasureConfig()
    m = loads_space(MINIMAL, "x.toml").measure
    assert (m.max_cv, m.max_iqr, m.retries) == (d.max_cv, d.max_iqr, d.retries) == (0.1, 0.1, 2)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("max_cv = 0", "x.toml: measure.max_cv: must be > 0, got 0"),
        ('max_iqr = "10%"', "x.toml: measure.max_iqr: expected a number, got a string"),
        ("retries = -1", "x.toml: measure.retries: must be >= 0, got -1"),
        ("retries = 1.5", "x.toml: measure.retries: expected an integer, got a float"),
        ("max_cvv = 0.1", "x.toml: measure.max_cvv: unknown key (known: warmup, number, repeat"),
    ],
)
def test_a_bad_noise_key_is_one_line_naming_it(table: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        loads_space(MINIMAL + "[measure]\n" + table + "\n", "x.toml")
    text = str(info.value)
    assert "\n" not in text and text.startswith(message)
