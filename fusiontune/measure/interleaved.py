"""Interleaved timing: several callables measured round-robin, so that drift hits them alike.

Measured one after the other, two programs see different moments of the machine: a busy minute
during one of them makes it look slower. Measured in rounds, each round timing every callable
once (starting one further along each round, so none is always first after another), a busy
moment costs every callable a sample or two, and their medians stay comparable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fusiontune.measure.timing import MeasureConfig, Timing, time_callable

MIN_SAMPLE_S = 1e-3
"""A sample shorter than this is mostly clock and loop overhead: calls are batched up to it."""


def interleaved_timings(
    fns: Sequence[Callable[[], Any]],
    rounds: int,
    measure: MeasureConfig | None = None,
    min_sample_s: float = MIN_SAMPLE_S,
    *,
    rotate: bool = True,
    stop: Callable[[Sequence[Sequence[float]]], Iterable[int]] | None = None,
) -> list[Timing]:
    """Time every callable once per round, round-robin, starting one further along each round.

    Exactly these calls happen: each callable first gets ``max(1, measure.warmup)`` untimed
    calls and one timed calibration call, in list order; its number of calls per sample is
    ``measure.number`` raised so that a sample lasts about ``min_sample_s`` (or
    ``measure.min_repeat_ms``, the larger). Then ``rounds`` rounds: round ``r`` times callable
    ``(r + j) % n`` for ``j = 0 .. n-1``, one sample each (with ``measure.flush_cache``, the
    caches are evicted before every sample). One attempt: nothing is judged or repeated (see
    :func:`fusiontune.measure.time_interleaved`).

    With ``rotate=False`` every round times the callables in list order, so every call of the
    whole measurement (set-up included) comes in list order: what steps of one computation
    need, each reading what the one before it wrote (the kernels of a program,
    :func:`fusiontune.measure.profile.profile_program`).

    Args:
        fns: the callables (programs bound to their inputs).
        rounds: samples per callable (at least 1).
        measure: warmup, number, flush_cache and min_repeat_ms are honoured (default
            ``MeasureConfig()``).
        min_sample_s: the shortest sample wanted.
        rotate: start each round one further along (False: every round in list order).
        stop: called after every round but the last with each callable's samples so far; the
            callables whose indices it returns are not timed again (racing: their timings have
            the samples of the rounds they ran).

    A callable with a ``time_callable(cfg)`` method (one that runs in a process of its own) is
    timed by it, calibration included; its plain calls are the warm-up.

    Returns:
        Per callable, in the order of ``fns``, its timing over its ``rounds`` samples.
    """
    if rounds < 1:
        raise ValueError(f"interleaved timing needs rounds >= 1, got {rounds}")
    measure = measure or MeasureConfig()
    target = max(min_sample_s, measure.min_repeat_ms * 1e-3)
    numbers = []
    for fn in fns:
        for _ in range(max(1, measure.warmup)):
            fn()
        one = max(
            _timed(fn, MeasureConfig(warmup=0, number=1, repeat=1, min_repeat_ms=0)).samples_s[0],
            1e-7,
        )
        numbers.append(max(measure.number, math.ceil(target / one)))
    samples: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    stopped: set[int] = set()
    for r in range(rounds):
        for j in range(n):
            i = (r + j) % n if rotate else j
            if i in stopped:
                continue
            cfg = MeasureConfig(
                warmup=0, number=numbers[i], repeat=1, flush_cache=measure.flush_cache
            )
            samples[i].extend(_timed(fns[i], cfg).samples_s)
        if stop is not None and r < rounds - 1:
            stopped.update(stop(samples))
    return [Timing.from_samples(tuple(s), k) for s, k in zip(samples, numbers, strict=True)]


def _timed(fn: Callable[[], Any], cfg: MeasureConfig) -> Timing:
    """:func:`time_callable` on ``fn``, or, for a callable that runs in another process and times
    itself there (it has a ``time_callable(cfg)`` method: a peer of benchmarks/peers.py), its own
    timing, so that the pipe to it is not in the figure."""
    own = getattr(fn, "time_callable", None)
    return own(cfg) if own is not None else time_callable(fn, cfg)


def measure_interleaved(
    fns: Sequence[Callable[[], Any]],
    rounds: int,
    measure: MeasureConfig | None = None,
    min_sample_s: float = MIN_SAMPLE_S,
) -> list[tuple[float, ...]]:
    """The samples of :func:`interleaved_timings` (same calls, same order).

    Returns:
        Per callable, its samples (seconds per call), in round order.
    """
    return [t.samples_s for t in interleaved_timings(fns, rounds, measure, min_sample_s)]
