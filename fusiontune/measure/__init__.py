"""Measurement: the timing protocol, interleaving, noise, accuracy metrics, and the roofline.

The one measurement path: :func:`time_stable` times one callable (repeating a too-wide
measurement, then flagging it), :func:`time_interleaved` times several round-robin with the same
check, :func:`median_ci` gives every median its confidence interval, :func:`describe_noise` is
the one sentence every command prints about a noisy timing.
"""

from fusiontune.measure.accuracy import METRICS, ErrorMetrics, compare, metric_value
from fusiontune.measure.interleaved import MIN_SAMPLE_S, interleaved_timings, measure_interleaved
from fusiontune.measure.noise import (
    describe_noise,
    format_seconds,
    is_noisy,
    noise_ratio,
    time_interleaved,
    time_stable,
)
from fusiontune.measure.roofline import (
    kernel_bound,
    machine_info,
    measure_copy_bandwidth,
    measure_peak_flops,
    numpy_copy_bandwidth,
    percent_of_bound,
)
from fusiontune.measure.stats import CONFIDENCE, median_ci
from fusiontune.measure.timing import (
    MeasureConfig,
    Runnable,
    Timing,
    last_level_cache_bytes,
    measure_program,
    time_callable,
)

__all__ = [
    "CONFIDENCE",
    "METRICS",
    "MIN_SAMPLE_S",
    "ErrorMetrics",
    "MeasureConfig",
    "Runnable",
    "Timing",
    "compare",
    "describe_noise",
    "format_seconds",
    "interleaved_timings",
    "is_noisy",
    "kernel_bound",
    "last_level_cache_bytes",
    "machine_info",
    "measure_copy_bandwidth",
    "measure_interleaved",
    "measure_peak_flops",
    "measure_program",
    "median_ci",
    "metric_value",
    "noise_ratio",
    "numpy_copy_bandwidth",
    "percent_of_bound",
    "time_callable",
    "time_interleaved",
    "time_stable",
]
