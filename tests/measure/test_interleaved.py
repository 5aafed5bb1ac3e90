"""Interleaved timing: the order of the calls, their number, and the samples kept per callable."""

from __future__ import annotations

import time

import pytest

from fusiontune.measure import MeasureConfig, Timing, interleaved_timings, measure_interleaved


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


class SelfTimed:
    """A callable that times itself elsewhere (as a peer in its own process does): its samples
    are what it reports, whatever its plain calls cost here."""

    def __init__(self, per_call_s: float) -> None:
        self.per_call_s = per_call_s
        self.calls = 0
        self.asked: list[int] = []

    def __call__(self) -> None:
        self.calls += 1
        time.sleep(0.002)  # the pipe: slow, and never in the figures

    def time_callable(self, cfg: MeasureConfig) -> Timing:
        self.asked.append(cfg.number)
        return Timing.from_samples((self.per_call_s,) * cfg.repeat, cfg.number)


def test_a_callable_that_times_itself_gives_its_own_samples_and_calibration() -> None:
    remote, local_calls = SelfTimed(per_call_s=1e-4), []
    timings = interleaved_timings(
        [remote, lambda: local_calls.append(1)],
        rounds=3,
        measure=MeasureConfig(warmup=2),
        min_sample_s=5e-3,
    )
    assert remote.calls == 2  # the warm-up only: calibration and samples are its own timings
    assert remote.asked == [1, 50, 50, 50]  # calibrated at 0.1 ms a call: 50 calls make 5 ms
    assert timings[0].samples_s == (1e-4,) * 3 and timings[0].number == 50
    assert len(local_calls) == 2 + 1 + 3 * timings[1].number  # the plain callable is timed here
