"""The timing protocol: warm up, then ``repeat`` timed samples of ``number`` calls each.

Follows ``timeit`` and TVM's ``time_evaluator``: a sample times a batch of calls with one clock
read on each side, so clock overhead is amortized when one call is short; the samples' median is
the figure of merit, its confidence interval and the samples' spread (IQR, CV) say how much to
trust it. :func:`time_callable` is the single-shot primitive; :func:`fusiontune.measure.time_stable`
repeats a measurement whose spread is too wide and flags it (:mod:`fusiontune.measure.noise`).
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fusiontune.measure.stats import median_ci

# An estimate of one call below this is clock noise; it would ask for an unbounded `number`.
_MIN_CALL_ESTIMATE_S = 1e-6
_FALLBACK_LLC_BYTES = 32 << 20
_MAX_FLUSH_BYTES = 1 << 30


@dataclass(frozen=True)
class MeasureConfig:
    """How a callable is timed. Exactly these calls happen, in this order:

    1. ``warmup`` untimed calls (compilation, page faults, caches). When ``min_repeat_ms > 0``
       there is at least one, and each one is timed alone to estimate the cost of one call
       (these timings are not samples).
    2. The effective number of calls per sample is ``number`` when ``min_repeat_ms == 0``,
       otherwise ``max(number, ceil(min_repeat_ms / 1000 / t))`` where ``t`` is the fastest
       warmup call (at least 1 microsecond), so that one sample lasts about ``min_repeat_ms``.
    3. ``repeat`` timed samples, each of ``number`` (effective) back-to-back calls. With
       ``flush_cache``, before each sample a buffer larger than the last-level cache (twice its
       size, at most 1 GiB) is written, outside the timed region.

    Total calls of one measurement: ``max(warmup, 1 if min_repeat_ms > 0 else 0) +
    number_effective * repeat``. The garbage collector is paused during each sample.

    4. Noise (:func:`fusiontune.measure.time_stable`, used by ``run``, the tuning loop, the
       confirmation and the benchmarks; :func:`fusiontune.measure.time_callable` alone makes one
       measurement): a measurement is too wide when its samples' CV exceeds ``max_cv`` or its IQR
       exceeds ``max_iqr`` times its median. A too-wide measurement is taken again, steps 1-3
       whole, up to ``retries`` more times (so at most ``retries + 1`` times the calls above);
       the first one within both limits is kept, else the one with the smallest spread, flagged
       ``noisy``.

    The noise defaults follow pyperf, which warns when the standard deviation is above 10% of the
    mean; on a quiet machine a kernel of a millisecond or more stays well below both.

    Attributes:
        warmup: untimed calls before the samples.
        number: calls per timed sample (a lower bound when ``min_repeat_ms > 0``).
        repeat: timed samples.
        min_repeat_ms: minimum duration of one sample; raises ``number``. 0 keeps ``number``.
        flush_cache: evict the caches before each sample (cold-cache timing).
        max_cv: the widest coefficient of variation (std / mean of the samples) that is not noise.
        max_iqr: the widest IQR, as a fraction of the median, that is not noise.
        retries: how many times a too-wide measurement is taken again before it is flagged.
    """

    warmup: int = 2
    number: int = 1
    repeat: int = 7
    min_repeat_ms: float = 0.0
    flush_cache: bool = False
    max_cv: float = 0.10
    max_iqr: float = 0.10
    retries: int = 2

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.number < 1 or self.repeat < 1 or self.min_repeat_ms < 0:
            raise ValueError(
                f"MeasureConfig needs warmup >= 0, number >= 1, repeat >= 1, min_repeat_ms >= 0; got {self}"
            )
        if not (self.max_cv > 0 and self.max_iqr > 0) or self.retries < 0:
            raise ValueError(
                f"MeasureConfig needs max_cv > 0, max_iqr > 0, retries >= 0; got {self}"
            )


@dataclass(frozen=True)
class Timing:
    """The result of timing one callable.

    Attributes:
        samples_s: seconds per call, one entry per sample (the sample's time / ``number``).
        median_s: median of ``samples_s``.
        iqr_s: interquartile range (75th minus 25th percentile) of ``samples_s``.
        cv: coefficient of variation (standard deviation / mean) of ``samples_s``.
        min_s: fastest sample, seconds per call.
        number: calls per sample (after any raise by ``min_repeat_ms``).
        repeat: number of samples.
        ci_low_s: low end of the 95% confidence interval of the median (:func:`median_ci`).
        ci_high_s: high end of that interval.
        noisy: the spread is still too wide after the retries (``MeasureConfig.max_cv``,
            ``max_iqr``); False when it was never judged (:func:`time_callable` alone).
        attempts: how many measurements were taken; these figures are those of one of them.
    """

    samples_s: tuple[float, ...]
    median_s: float
    iqr_s: float
    cv: float
    min_s: float
    number: int
    repeat: int
    ci_low_s: float = math.nan
    ci_high_s: float = math.nan
    noisy: bool = False
    attempts: int = 1

    @property
    def iqr_ratio(self) -> float:
        """The IQR as a fraction of the median (0 when both are 0, NaN when not timed)."""
        if self.median_s > 0:
            return self.iqr_s / self.median_s
        return 0.0 if self.iqr_s == 0 else math.inf if self.iqr_s > 0 else math.nan

    @staticmethod
    def not_timed() -> Timing:
        """No measurement (an accuracy-only check): NaN times, no samples, no attempt."""
        nan = float("nan")
        return Timing((), nan, nan, nan, nan, 0, 0, nan, nan, False, 0)

    @staticmethod
    def from_samples(samples_s: tuple[float, ...], number: int) -> Timing:
        """Summarize per-call sample times.

        Args:
            samples_s: seconds per call, one per sample (at least one).
            number: calls per sample.

        Returns:
            The timing record, not judged for noise (one attempt, ``noisy`` False).
        """
        arr = np.asarray(samples_s, dtype=np.float64)
        q25, q50, q75 = np.percentile(arr, [25, 50, 75])
        mean = float(arr.mean())
        cv = float(arr.std() / mean) if mean > 0 else 0.0
        low, high = median_ci(arr)
        return Timing(
            tuple(float(s) for s in arr),
            float(q50),
            float(q75 - q25),
            cv,
            float(arr.min()),
            number,
            len(arr),
            low,
            high,
        )


@runtime_checkable
class Runnable(Protocol):
    """What :func:`measure_program` times: a compiled program (``fusiontune.runtime.Program``)."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once on ``inputs``; return the outputs by name."""
        ...


def time_callable(fn: Callable[[], Any], cfg: MeasureConfig = MeasureConfig()) -> Timing:
    """Time ``fn()`` once following ``cfg`` (steps 1-3 of :class:`MeasureConfig`); no retry.

    Args:
        fn: a callable taking no arguments.
        cfg: the protocol.

    Returns:
        Per-call sample times and their summary.
    """
    clock = time.perf_counter_ns
    warmup = max(cfg.warmup, 1 if cfg.min_repeat_ms > 0 else 0)
    fastest_ns = math.inf
    for _ in range(warmup):
        t0 = clock()
        fn()
        fastest_ns = min(fastest_ns, clock() - t0)
    number = cfg.number
    if cfg.min_repeat_ms > 0:
        per_call_s = max(fastest_ns * 1e-9, _MIN_CALL_ESTIMATE_S)
        number = max(number, math.ceil(cfg.min_repeat_ms * 1e-3 / per_call_s))
    flush = _flush_buffer() if cfg.flush_cache else None
    samples: list[float] = []
    gc_was_enabled = gc.isenabled()
    try:
        for i in range(cfg.repeat):
            if flush is not None:
                flush.fill(i & 0xFF)
            gc.disable()
            t0 = clock()
            for _ in range(number):
                fn()
            elapsed = clock() - t0
            if gc_was_enabled:
                gc.enable()
            samples.append(elapsed * 1e-9 / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing.from_samples(tuple(samples), number)


def measure_program(
    program: Runnable, inputs: Mapping[str, np.ndarray], cfg: MeasureConfig = MeasureConfig()
) -> Timing:
    """Time ``program.run(inputs)`` following ``cfg``.

    Args:
        program: anything with ``run(inputs) -> outputs`` (a compiled ``Program``).
        inputs: the arrays every call runs on.
        cfg: the protocol.

    Returns:
        Per-call sample times and their summary.
    """
    return time_callable(lambda: program.run(inputs), cfg)


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache reported by Linux sysfs, or 32 MiB when it cannot be read."""
    sizes: list[int] = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=_FALLBACK_LLC_BYTES)


def _flush_nbytes() -> int:
    # Twice the LLC: with non-inclusive or partitioned caches, one LLC's worth may not evict it all.
    # Capped because some VMs report a host-wide L3 of hundreds of MiB through sysfs.
    return min(2 * last_level_cache_bytes(), _MAX_FLUSH_BYTES)


@functools.cache
def _flush_buffer() -> np.ndarray:
    buf = np.empty(_flush_nbytes(), dtype=np.uint8)
    buf.fill(0)
    return buf
