"""Measurement: the timing protocol's call counts, the accuracy metrics, the roofline."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import numpy as np
import pytest

from fusiontune.errors import UserError
from fusiontune.measure import (
    METRICS,
    ErrorMetrics,
    MeasureConfig,
    Runnable,
    compare,
    kernel_bound,
    machine_info,
    measure_copy_bandwidth,
    measure_program,
    metric_value,
    numpy_copy_bandwidth,
    percent_of_bound,
    time_callable,
)
from fusiontune.measure import timing as timing_module


class _Counter:
    def __init__(self, sleep_s: float = 0.0) -> None:
        self.calls = 0
        self.sleep_s = sleep_s

    def __call__(self) -> None:
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)


class _FakeProgram:
    def __init__(self) -> None:
        self.seen: list[Mapping[str, np.ndarray]] = []

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seen.append(inputs)
        return {"y": inputs["x"] * 2}


# ---- timing ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("warmup", "number", "repeat"), [(2, 1, 7), (0, 3, 4), (5, 2, 1)])
def test_time_callable_makes_warmup_plus_number_times_repeat_calls(
    warmup: int, number: int, repeat: int
) -> None:
    fn = _Counter()
    t = time_callable(fn, MeasureConfig(warmup=warmup, number=number, repeat=repeat))
    assert fn.calls == warmup + number * repeat
    assert (t.number, t.repeat, len(t.samples_s)) == (number, repeat, repeat)


def test_defaults_make_nine_calls() -> None:
    fn = _Counter()
    time_callable(fn, MeasureConfig())
    assert fn.calls == 2 + 1 * 7


def test_min_repeat_ms_raises_number_from_the_fastest_warmup_call() -> None:
    fn = _Counter(sleep_s=0.001)
    t = time_callable(fn, MeasureConfig(warmup=3, number=1, repeat=2, min_repeat_ms=20.0))
    # One call lasts a bit over 1 ms, so a 20 ms sample needs at most 20 calls, and several.
    assert 1 < t.number <= 20
    assert fn.calls == 3 + t.number * 2
    assert all(s >= 0.001 for s in t.samples_s)


def test_min_repeat_ms_without_warmup_makes_one_calibration_call() -> None:
    fn = _Counter()
    t = time_callable(fn, MeasureConfig(warmup=0, number=1, repeat=3, min_repeat_ms=0.01))
    assert fn.calls == 1 + t.number * 3


def test_flush_cache_adds_no_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    timing_module._flush_buffer.cache_clear()
    monkeypatch.setattr(timing_module, "_flush_nbytes", lambda: 1 << 16)
    try:
        fn = _Counter()
        time_callable(fn, MeasureConfig(warmup=1, number=2, repeat=3, flush_cache=True))
        assert fn.calls == 1 + 2 * 3
    finally:
        timing_module._flush_buffer.cache_clear()


def test_timing_summary_matches_samples() -> None:
    t = timing_module.Timing.from_samples((1.0, 2.0, 3.0, 4.0, 5.0), number=1)
    assert (t.median_s, t.min_s, t.iqr_s) == (3.0, 1.0, 2.0)
    assert t.cv == pytest.approx(np.std([1, 2, 3, 4, 5]) / 3.0)


def test_measure_program_times_run_on_the_given_inputs() -> None:
    program = _FakeProgram()
    assert isinstance(program, Runnable)
    inputs = {"x": np.ones(3, dtype=np.float32)}
    t = measure_program(program, inputs, MeasureConfig(warmup=1, number=2, repeat=3))
    assert len(program.seen) == 7
    assert all(seen is inputs for seen in program.seen)
    assert t.median_s > 0


def test_measure_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        MeasureConfig(repeat=0)


# ---- accuracy ----------------------------------------------------------------------------------
def test_identical_outputs_have_zero_error() -> None:
    ref = {"y": np.linspace(-1, 1, 11)}
    m = compare({"y": ref["y"].astype(np.float32)}, ref)
    assert m.finite and m.cosine < 1e-12 and m.max_abs < 1e-7


def test_metrics_on_known_arrays() -> None:
    ref = {"y": np.array([3.0, 4.0])}
    m = compare({"y": np.array([3.0, 5.0])}, ref)
    assert m.max_abs == 1.0
    assert m.max_rel == pytest.approx(0.25)
    assert m.rel_l2 == pytest.approx(1.0 / 5.0)
    assert m.cosine == pytest.approx(1.0 - 29.0 / (5.0 * math.sqrt(34.0)))
    assert m.finite


def test_max_rel_floor_caps_error_near_zero() -> None:
    ref = {"y": np.array([1000.0, 0.0])}
    out = {"y": np.array([1000.0, 1e-3])}
    # The zero element counts relative to 1e-3 * 1000 = 1, not to 0.
    assert compare(out, ref).max_rel == pytest.approx(1e-3)
    assert compare(out, ref, floor_frac=1e-6).max_rel == pytest.approx(1.0)


def test_nan_output_is_not_finite_and_infinitely_wrong() -> None:
    m = compare({"y": np.array([1.0, np.nan])}, {"y": np.array([1.0, 2.0])})
    assert not m.finite
    assert all(math.isinf(metric_value(m, name)) for name in METRICS)


def test_worst_output_wins() -> None:
    ref = {"a": np.ones(4), "b": np.ones(4)}
    m = compare({"a": np.ones(4), "b": np.full(4, 1.5)}, ref)
    assert m.max_abs == 0.5 and m.max_rel == 0.5


def test_cosine_distance_of_opposite_outputs_is_two() -> None:
    assert compare({"y": -np.ones(3)}, {"y": np.ones(3)}).cosine == pytest.approx(2.0)


def test_compare_rejects_missing_or_misshapen_outputs() -> None:
    with pytest.raises(KeyError):
        compare({}, {"y": np.ones(2)})
    with pytest.raises(ValueError):
        compare({"y": np.ones(3)}, {"y": np.ones(2)})


def test_metric_value_names_closest_metric() -> None:
    m = ErrorMetrics.exact()
    assert metric_value(m, "rel_l2") == 0.0
    with pytest.raises(UserError, match="max_rel"):
        metric_value(m, "max_rell")


# ---- roofline ----------------------------------------------------------------------------------
def test_copy_bandwidth_is_positive_and_plausible() -> None:
    bw = measure_copy_bandwidth(8 << 20, repeat=3)
    assert 1e8 < bw < 1e13  # 0.1 GB/s .. 10 TB/s
    assert measure_copy_bandwidth(8 << 20, repeat=3) == bw  # cached per process
    assert 1e8 < numpy_copy_bandwidth(8 << 20, repeat=3) < 1e13


def test_kernel_bound_is_the_slower_roof() -> None:
    assert kernel_bound(1e9, 0.0, bandwidth=1e10) == pytest.approx(0.1)
    assert kernel_bound(1e9, 1e12, bandwidth=1e10, peak_flops=1e12) == pytest.approx(1.0)
    assert percent_of_bound(0.2, 0.1) == pytest.approx(50.0)
    assert math.isnan(percent_of_bound(0.0, 0.1))


def test_machine_info_names_the_machine() -> None:
    info = machine_info()
    assert info["cpu_count"] >= 1 and info["numba_threads"] >= 1
    assert {"hostname", "cpu_model", "numpy", "numba"} <= set(info)
