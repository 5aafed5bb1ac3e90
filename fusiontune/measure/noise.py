"""Noise: a measurement whose spread is too wide is taken again, then flagged.

A busy machine shows in the samples before it shows in the median: their coefficient of variation
and their IQR grow. A measurement is *too wide* when ``cv > max_cv`` or ``iqr > max_iqr * median``
(the limits of :class:`~fusiontune.measure.MeasureConfig`). Its spread is summarized by one
number, :func:`noise_ratio` (the larger of the two ratios to their limits: above 1 is too wide).

:func:`time_stable` (one callable) and :func:`time_interleaved` (several, round-robin) take a
too-wide measurement again up to ``retries`` times. They keep the first measurement within the
limits; when none is, the one with the smallest :func:`noise_ratio` (the quietest moment seen,
the earliest on a tie), marked ``noisy``. Every report of a noisy timing says so in the words of
:func:`describe_noise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from fusiontune.measure.interleaved import MIN_SAMPLE_S, interleaved_timings
from fusiontune.measure.timing import MeasureConfig, Timing, time_callable

MeasureOnce = Callable[[Callable[[], Any], MeasureConfig], Timing]
"""One measurement of one callable: :func:`time_callable` (a test passes its own samples)."""

MeasureRound = Callable[[Sequence[Callable[[], Any]], int, MeasureConfig, float], list[Timing]]
"""One interleaved measurement of several callables: :func:`interleaved_timings`."""


def noise_ratio(timing: Timing, cfg: MeasureConfig) -> float:
    """How wide ``timing`` is against the limits: ``max(cv / max_cv, iqr_ratio / max_iqr)``.

    Above 1 the measurement is too wide. A timing without samples (not timed) is 0.

    Args:
        timing: a measurement.
        cfg: holds the limits ``max_cv`` and ``max_iqr``.

    Returns:
        The ratio (``inf`` when the median is 0 and the IQR is not).
    """
    if not timing.samples_s:
        return 0.0
    ratios = (timing.cv / cfg.max_cv, timing.iqr_ratio / cfg.max_iqr)
    return max((r for r in ratios if not math.isnan(r)), default=0.0)


def is_noisy(timing: Timing, cfg: MeasureConfig) -> bool:
    """Whether ``timing``'s CV is above ``cfg.max_cv`` or its IQR above ``cfg.max_iqr`` x median."""
    return noise_ratio(timing, cfg) > 1.0


def time_stable(
    fn: Callable[[], Any],
    cfg: MeasureConfig | None = None,
    *,
    measure_once: MeasureOnce = time_callable,
) -> Timing:
    """Time ``fn()``; take a too-wide measurement again, up to ``cfg.retries`` times; flag it.

    Each attempt is one whole :func:`time_callable` (warmup included), so at most
    ``cfg.retries + 1`` times the calls that :class:`MeasureConfig` counts happen.

    Args:
        fn: a callable taking no arguments.
        cfg: the protocol and the noise limits (default ``MeasureConfig()``).
        measure_once: takes one measurement (a test injects samples here).

    Returns:
        The first measurement within the limits, else the one with the smallest
        :func:`noise_ratio`, ``noisy`` set; ``attempts`` is the number of measurements taken.
    """
    cfg = cfg or MeasureConfig()
    kept: Timing | None = None
    attempts = 0
    while attempts <= cfg.retries:
        timing = measure_once(fn, cfg)
        attempts += 1
        if kept is None or noise_ratio(timing, cfg) < noise_ratio(kept, cfg):
            kept = timing
        if not is_noisy(timing, cfg):
            break
    assert kept is not None
    return replace(kept, noisy=is_noisy(kept, cfg), attempts=attempts)


def time_interleaved(
    fns: Sequence[Callable[[], Any]],
    rounds: int,
    cfg: MeasureConfig | None = None,
    min_sample_s: float = MIN_SAMPLE_S,
    *,
    measure_round: MeasureRound = interleaved_timings,
    stop: Callable[[Sequence[Sequence[float]]], Iterable[int]] | None = None,
) -> list[Timing]:
    """Time several callables interleaved (:func:`interleaved_timings`), with the noise check.

    The callables are compared with each other, so they are measured again together: when any
    of them is too wide, all are, up to ``cfg.retries`` times. The attempt kept is the first in
    which none is too wide, else the one whose widest timing has the smallest
    :func:`noise_ratio`; in it each timing is flagged ``noisy`` on its own spread.

    Args:
        fns: the callables (programs bound to their inputs).
        rounds: samples per callable in one attempt.
        cfg: the protocol (warmup, number, min_repeat_ms, flush_cache) and the noise limits
            (default ``MeasureConfig()``).
        min_sample_s: the shortest sample wanted.
        measure_round: takes one interleaved measurement (a test injects samples here).
        stop: racing (:func:`interleaved_timings`' ``stop``), passed to ``measure_round``; every
            attempt races afresh.

    Returns:
        Per callable, in the order of ``fns``, its timing; ``attempts`` on each.
    """
    cfg = cfg or MeasureConfig()
    kept: list[Timing] | None = None
    attempts = 0
    while attempts <= cfg.retries:
        if stop is None:
            timings = measure_round(fns, rounds, cfg, min_sample_s)
        else:
            timings = partial(measure_round, stop=stop)(fns, rounds, cfg, min_sample_s)
        attempts += 1
        if kept is None or _widest(timings, cfg) < _widest(kept, cfg):
            kept = timings
        if _widest(timings, cfg) <= 1.0:
            break
    assert kept is not None
    return [replace(t, noisy=is_noisy(t, cfg), attempts=attempts) for t in kept]


def _widest(timings: Sequence[Timing], cfg: MeasureConfig) -> float:
    return max((noise_ratio(t, cfg) for t in timings), default=0.0)


def describe_noise(timing: Timing) -> str:
    """One line for a person about a noisy timing; every command says it in these words.

    ``noisy: CV 0.73, IQR 52.98 ms on a 34.60 ms median after 3 measurements; the machine is
    busy, figures are not reliable``

    Args:
        timing: a timing (normally one with ``noisy`` set).

    Returns:
        The line, without a trailing newline.
    """
    n = timing.attempts
    return (
        f"noisy: CV {timing.cv:.2f}, IQR {format_seconds(timing.iqr_s)} on a"
        f" {format_seconds(timing.median_s)} median after {n} measurement{'' if n == 1 else 's'};"
        " the machine is busy, figures are not reliable"
    )


def format_seconds(seconds: float) -> str:
    """``12.3 us``, ``4.56 ms``, ``1.23 s`` (``-`` when not a number)."""
    if math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
