"""Measurement: the timing protocol, accuracy metrics, and the roofline."""

from fusiontune.measure.accuracy import METRICS, ErrorMetrics, compare, metric_value
from fusiontune.measure.roofline import (
    kernel_bound,
    machine_info,
    measure_copy_bandwidth,
    numpy_copy_bandwidth,
    percent_of_bound,
)
from fusiontune.measure.timing import (
    MeasureConfig,
    Runnable,
    Timing,
    last_level_cache_bytes,
    measure_program,
    time_callable,
)

__all__ = [
    "METRICS",
    "ErrorMetrics",
    "MeasureConfig",
    "Runnable",
    "Timing",
    "compare",
    "kernel_bound",
    "last_level_cache_bytes",
    "machine_info",
    "measure_copy_bandwidth",
    "measure_program",
    "metric_value",
    "numpy_copy_bandwidth",
    "percent_of_bound",
    "time_callable",
]
