"""Interleaved timing: the order of the calls, their number, and the samples kept per callable."""

from __future__ import annotations

import pytest

from fusiontune.measure import MeasureConfig, interleaved_timings, measure_interleaved


def test_each_round_starts_one_further_along() -> None:
    calls: list[str] = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    samples = measure_interleaved(
        fns, rounds=4, measure=MeasureConfig(warmup=0, number=1), min_sample_s=0.0
    )
    assert [len(s) for s in samples] == [4, 4, 4]
    # Set-up, in list order: one warmup call and one calibration call each.
    assert "".join(calls[:6]) == "aabbcc"
    assert "".join(calls[6:]) == "abc" + "bca" + "cab" + "abc"


def test_calls_are_warmup_plus_calibration_plus_rounds_times_number() -> None:
    calls = {"a": 0, "b": 0}

    def counter(name: str):
        def call() -> None:
            calls[name] += 1

        return call

    timings = interleaved_timings(
        [counter("a"), counter("b")],
        rounds=5,
        measure=MeasureConfig(warmup=3, number=4),
        min_sample_s=0.0,
    )
    assert [t.number for t in timings] == [4, 4]  # no target to raise `number` toward
    assert [t.repeat for t in timings] == [5, 5]
    assert calls == {"a": 3 + 1 + 5 * 4, "b": 3 + 1 + 5 * 4}
    assert all(t.ci_low_s <= t.median_s <= t.ci_high_s for t in timings)


def test_min_sample_raises_the_calls_per_sample_of_a_fast_callable() -> None:
    (t,) = interleaved_timings([lambda: None], rounds=2, min_sample_s=1e-3)
    assert t.number > 1  # a call of well under a microsecond needs many per millisecond


def test_zero_rounds_is_an_error() -> None:
    with pytest.raises(ValueError, match="rounds >= 1"):
        interleaved_timings([lambda: None], rounds=0)
