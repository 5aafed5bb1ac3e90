"""Confirmation: measure the best configurations again, interleaved, in one process.

A sweep's measurements come from different workers at different times; the ranking at its top
is within their noise. The confirmation stage takes the top k feasible configurations (one per
distinct program) and the registry defaults, builds each program once in this process, and times
them round-robin (each round times every candidate once, starting one further along each round),
so that drift and interference hit all of them alike (:func:`fusiontune.measure.time_interleaved`:
too wide a spread is measured again, then flagged). Each gets the median of its samples and a
95% confidence interval of that median (distribution-free: :func:`fusiontune.measure.median_ci`).
A winner is named only when its interval lies entirely below the defaults' interval; otherwise
the defaults are recommended.

Racing: after each round but the last, a candidate whose samples so far are clearly slower than
the best feasible candidate's (:func:`race_round`: the sequential test of
:mod:`fusiontune.measure.racing`, its level split over the rounds that look) is not timed again;
its row keeps the samples of the rounds it ran, and the note names it. The defaults are never
raced out. The rounds it saves shorten the confirmation.

For a command target (the user's own job), :mod:`fusiontune.tune.command_confirm` does the same
by running the job again.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure import (
    CONFIDENCE,
    MIN_SAMPLE_S,
    MeasureConfig,
    Timing,
    describe_noise,
    interleaved_timings,
    measure_interleaved,
    median_ci,
    metric_value,
    time_interleaved,
)
from fusiontune.measure.racing import RACE, clearly_worse
from fusiontune.tune.store import (
    DEFAULTS,
    Confirmation,
    ConfirmationRow,
    StudyStore,
    TrialRecord,
    speedups,
)
from fusiontune.workloads import Workload
from fusiontune.workloads.space import SearchSpace, config_from_params

# Re-exported: the confirmation's statistics live in fusiontune.measure.
__all__ = [
    "CONFIDENCE",
    "MIN_SAMPLE_S",
    "Candidate",
    "ConfirmedRow",
    "confirm",
    "confirmation_record",
    "decide",
    "format_confirmation",
    "measure_interleaved",
    "median_ci",
    "model_order",
    "select_candidates",
]


@dataclass(frozen=True)
class Candidate:
    """A configuration the confirmation measures: a trial of the sweep."""

    trial: int
    config: FusionConfig
    program_hash: str
    sweep_median_s: float
    feasible: bool
    role: str = ""


@dataclass(frozen=True)
class ConfirmedRow:
    """One candidate's confirmation figures.

    ``noisy`` is set when its samples stayed too wide after the retries
    (:func:`fusiontune.measure.time_interleaved`); ``noise`` then says so in one line
    (:func:`fusiontune.measure.describe_noise`).
    """

    candidate: Candidate
    samples_s: tuple[float, ...]
    median_s: float
    ci_low_s: float
    ci_high_s: float
    error: float
    feasible: bool
    noisy: bool = False
    noise: str = ""


def select_candidates(
    study: optuna.Study, top_k: int, space: SearchSpace | None = None
) -> tuple[list[Candidate], int | None]:
    """The shortlist: ``top_k`` feasible trials with distinct programs, and the defaults trial.

    Two orders are taken in turn, one trial from each: the sweep's one ranking (by speedup
    against its own baseline, so a trial measured on a busy night does not lose to one measured
    on a quiet one, then by median), and, when ``space`` is given, the runtime model's posterior
    mean (:meth:`~fusiontune.tune.fusion_sampler.FusionSampler.predicted`). A single run of a
    slow job is noisy: its fastest measurement is often a lucky run of a configuration slower
    than one measured a little high, which the model, pooling every trial, ranks first.

    Args:
        study: a tuned study (the schema of :mod:`fusiontune.tune.store`).
        top_k: how many of the best feasible configurations.
        space: resolves a trial's params when it lacks the ``config`` user attr, and gives the
            model its dimensions.

    Returns:
        The candidates, best first, the defaults trial last when it is not among them; and the
        defaults trial number (None when the defaults trial did not complete).
    """
    store = StudyStore(study)
    records = store.trials((TrialState.COMPLETE,))
    speed = speedups(records, store.baselines())
    defaults = next((t for t in records if t.role == DEFAULTS and t.measured), None)
    feasible = [t for t in records if t.feasible]
    ranked = sorted(
        feasible, key=lambda t: (-_or_minus_inf(speed[t.number][0]), t.median_s, t.number)
    )
    predicted = model_order(study, space, feasible) if space is not None else []
    chosen: list[Candidate] = []
    seen: set[str] = set()
    for t in _alternate(ranked, predicted):
        phash = t.program_hash or f"trial-{t.number}"
        if phash in seen:
            continue
        seen.add(phash)
        if defaults is not None and phash == defaults.program_hash:
            t = defaults  # the same program as the defaults: measure it as the defaults
        chosen.append(_candidate(t, space))
        if len(chosen) >= top_k:
            break
    if defaults is not None and all(c.trial != defaults.number for c in chosen):
        chosen.append(_candidate(defaults, space))
    return chosen, (defaults.number if defaults is not None else None)


def model_order(
    study: optuna.Study, space: SearchSpace, feasible: Sequence[TrialRecord]
) -> list[TrialRecord]:
    """``feasible``, by the runtime model's posterior mean (those it has no value for left out);
    empty when the space has dimensions the model cannot code."""
    from fusiontune.tune.fusion_sampler import FusionSampler

    try:
        sampler = FusionSampler.for_space(space, seed=0)
    except ValueError:  # a dimension that is not categorical
        return []
    mean = sampler.predicted(study.get_trials(deepcopy=False))
    return sorted(
        (t for t in feasible if t.number in mean), key=lambda t: (mean[t.number], t.number)
    )


def _alternate(a: Sequence[TrialRecord], b: Sequence[TrialRecord]) -> list[TrialRecord]:
    """a[0], b[0], a[1], b[1], ...; the longer one's rest at the end."""
    out: list[TrialRecord] = []
    for i in range(max(len(a), len(b))):
        out += [x[i] for x in (a, b) if i < len(x)]
    return out


def _or_minus_inf(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def _candidate(t: TrialRecord, space: SearchSpace | None) -> Candidate:
    if t.config is not None:
        config = t.config
    elif space is not None:  # a study written without the config attr: resolve the params
        config = config_from_params(space, t.params)
    else:
        raise ValueError(f"trial {t.number} has no config user attr; pass the search space")
    return Candidate(t.number, config, t.program_hash, t.median_s, t.feasible, t.role)


def decide(
    rows: Sequence[ConfirmedRow], defaults_trial: int | None
) -> tuple[int | None, bool, str]:
    """Name the winner: the fastest feasible candidate whose CI lies below the defaults' CI.

    When the defaults cannot be recommended (they failed, or break the accuracy bound here), the
    fastest feasible candidate wins outright: it is distinguishable from the defaults by working.
    A winner is named exactly when ``distinguishable`` is true.

    Args:
        rows: the confirmed candidates.
        defaults_trial: the defaults' trial number, None when the defaults did not complete.

    Returns:
        (winner trial or None, distinguishable, a one-sentence note for the report).
    """
    feasible = sorted((r for r in rows if r.feasible), key=lambda r: r.median_s)
    base = next((r for r in rows if r.candidate.trial == defaults_trial), None)
    if base is None or not base.feasible:
        why = (
            "the defaults did not complete"
            if base is None
            else "the defaults break the accuracy bound"
        )
        if not feasible:
            return None, False, f"{why} and no configuration within the bound could be confirmed"
        w = feasible[0]
        return (
            w.candidate.trial,
            True,
            f"{why}; trial {w.candidate.trial} is the fastest configuration within it",
        )
    better = [r for r in feasible if r is not base and r.ci_high_s < base.ci_low_s]
    if better:
        w = better[0]
        speedup = base.median_s / w.median_s
        return (
            w.candidate.trial,
            True,
            (
                f"trial {w.candidate.trial} is {speedup:.2f}x faster than the defaults"
                f" (its {CONFIDENCE:.0%} confidence interval lies below theirs)"
            ),
        )
    return (
        None,
        False,
        (
            "no configuration is distinguishable from the defaults (the confidence intervals of the"
            " medians overlap): the defaults are recommended"
        ),
    )


def race_round(
    live: Sequence[Candidate],
    samples: Mapping[int, Sequence[float]],
    errors: Mapping[int, float],
    bound: float,
    defaults_trial: int | None,
    rounds: int,
    repeats: int = 1,
) -> dict[int, str]:
    """The candidates raced out after a round: clearly slower than the best feasible one.

    The race looks once per round that ends with 2 samples or more, but the last (``looks``), so
    the chance to race out a candidate as fast as the best stays at most ``RACE.alpha``. The
    defaults are never raced out: the winner is decided against them.

    Args:
        live: the candidates still timed.
        samples, errors: per trial, its samples so far and its error.
        bound: the accuracy bound (only a candidate within it can be the best).
        defaults_trial: the defaults' trial number.
        rounds: rounds of the whole confirmation; repeats: samples per candidate and round.

    Returns:
        Trial number -> why it was raced out (``trial 7 (...)``).
    """
    looks = sum(1 for q in range(rounds - 1) if (q + 1) * repeats >= RACE.min_runs)
    feasible = [
        c for c in live if c.feasible and errors[c.trial] <= bound and len(samples[c.trial]) >= 2
    ]
    if not feasible:
        return {}
    best = min(feasible, key=lambda c: (float(np.median(samples[c.trial])), c.trial))
    out: dict[int, str] = {}
    for c in live:
        if c is best or c.trial == defaults_trial:
            continue
        decision = clearly_worse(
            samples[c.trial], samples[best.trial], rounds * repeats, looks=looks
        )
        if decision.stop:
            out[c.trial] = f"trial {c.trial} ({decision.describe(f'trial {best.trial}')})"
    return out


def confirm(
    study: optuna.Study,
    workload: Workload,
    space: SearchSpace,
    top_k: int | None = None,
    rounds: int | None = None,
    echo: Callable[[str], None] = print,
) -> Confirmation:
    """Measure the top ``top_k`` configurations and the defaults again, interleaved, here.

    Each program is built once in this process (kernels come from the disk cache the workers
    filled, :func:`fusiontune.tune.evaluate.build_candidate`), checked against the reference
    again (:func:`fusiontune.tune.evaluate.check_and_time`), and timed round-robin with the
    noise check (:func:`fusiontune.measure.time_interleaved`). The result is stored as the study
    user attr ``confirmation`` and a table is printed.

    Args:
        study: the tuned study.
        workload: the workload, loaded in this process.
        space: the search space (bound, metric, measurement settings).
        top_k: how many of the best feasible configurations; the space's ``top_k`` when None.
        rounds: samples per candidate; ``max(15, 2 * repeat)`` when None.
        echo: where the table goes.

    Returns:
        The ``confirmation`` record: rows (trial, config_key, median_s, ci_low_s, ci_high_s,
        samples, error, feasible, noisy, noise), defaults_trial, winner_trial, distinguishable,
        note.
    """
    # Read at call time (not imported at module level): building imports numba, and the
    # report reads this module's table without building anything.
    from fusiontune.tune import evaluate

    top_k = space.top_k if top_k is None else top_k
    rounds = max(15, 2 * space.measure.repeat) if rounds is None else rounds
    candidates, defaults_trial = select_candidates(study, top_k, space)
    built: list[tuple[Candidate, Callable[[], None], float]] = []
    dropped: list[str] = []
    for c in candidates:
        try:
            program = evaluate.build_candidate(workload, c.config).program
            checked = evaluate.check_and_time(workload, program, space.measure, timing=False)
            error = metric_value(checked.errors, space.metric)
            program.bind(workload.inputs)
        except Exception as e:  # a program that built on a worker but not here: left out, said why
            dropped.append(f"trial {c.trial} ({type(e).__name__}: {e})")
            continue
        built.append((c, program.execute, error))
    raced: dict[int, str] = {}  # the current attempt's
    # Each attempt of the noise check races afresh; the attempt kept (the first quiet one, or
    # the least noisy) need not be the last, so each attempt's races are remembered with its
    # samples and the kept one's are reported.
    attempts: list[tuple[list[tuple[float, ...]], dict[int, str]]] = []

    def race(samples: Sequence[Sequence[float]]) -> list[int]:
        live = [i for i in range(len(built)) if built[i][0].trial not in raced]
        out = race_round(
            [built[i][0] for i in live],
            {built[i][0].trial: samples[i] for i in live},
            {c.trial: error for c, _, error in built},
            space.bound,
            defaults_trial,
            rounds,
        )
        raced.update(out)
        return [i for i in live if built[i][0].trial in out]

    def attempt(
        fns: Sequence[Callable[[], Any]],
        n: int,
        cfg: MeasureConfig,
        min_sample_s: float,
        stop: Callable[[Sequence[Sequence[float]]], Iterable[int]] | None = None,
    ) -> list[Timing]:
        raced.clear()
        out = interleaved_timings(fns, n, cfg, min_sample_s, stop=stop)
        attempts.append(([tuple(t.samples_s) for t in out], dict(raced)))
        return out

    timings = (
        time_interleaved(
            [fn for _, fn, _ in built], rounds, space.measure, measure_round=attempt, stop=race
        )
        if built
        else []
    )
    kept = [tuple(t.samples_s) for t in timings]
    raced = next((r for samples, r in attempts if samples == kept), {})
    rows = []
    for (c, _, error), t in zip(built, timings, strict=True):
        ok = c.feasible and math.isfinite(error) and error <= space.bound
        noise = describe_noise(t) if t.noisy else ""
        rows.append(
            ConfirmedRow(
                c, t.samples_s, t.median_s, t.ci_low_s, t.ci_high_s, error, ok, t.noisy, noise
            )
        )
    winner, distinguishable, note = decide(rows, defaults_trial)
    if raced:
        note += f"; not timed again, clearly slower than the best: {', '.join(raced.values())}"
    if dropped:
        note += f"; could not be rebuilt here: {', '.join(dropped)}"
    store = StudyStore(study)
    record = confirmation_record(
        rows, defaults_trial, winner, distinguishable, note, store.count_finished()
    )
    store.write_confirmation(record)
    echo(format_confirmation(record))
    return record


def confirmation_record(
    rows: Sequence[ConfirmedRow],
    defaults_trial: int | None,
    winner: int | None,
    distinguishable: bool,
    note: str,
    finished: int = -1,
) -> Confirmation:
    """The study's :class:`~fusiontune.tune.store.Confirmation`, measured here, now."""
    return Confirmation(
        tuple(
            ConfirmationRow(
                r.candidate.trial,
                r.candidate.config.key(),
                r.candidate.role,
                r.median_s,
                r.ci_low_s,
                r.ci_high_s,
                len(r.samples_s),
                r.error if math.isfinite(r.error) else None,
                r.feasible,
                r.noisy,
                r.noise,
            )
            for r in sorted(rows, key=lambda r: (r.median_s, r.candidate.trial))
        ),
        defaults_trial,
        winner,
        distinguishable,
        note,
        node=socket.gethostname(),
        time=time.time(),
        finished=finished,
    )


def format_confirmation(record: Confirmation) -> str:
    """The confirmation table for the terminal, the winner marked, the note below."""
    from fusiontune.tune._console import format_seconds

    base = record.row(record.defaults_trial) if record.defaults_trial is not None else None
    where = f" on {record.node}" if record.node else ""
    lines = [
        f"confirmation: {len(record.rows)} configurations, interleaved{where},"
        f" {CONFIDENCE:.0%} CI of the median"
    ]
    cells = (
        f"{'trial':>5}",
        f"{'':15}",
        f"{'median':>10}",
        f"{'95% CI':>23}",
        "vs defaults",
        "samples",
    )
    lines.append("  " + "  ".join(cells))
    for r in record.rows:
        tag = "defaults" if r.trial == record.defaults_trial else ""
        if r.trial == record.winner_trial:
            tag = "winner"
        if not r.feasible:
            tag = (tag + " !bound").strip()
        if r.noisy:
            tag = (tag + " noisy").strip()
        ci = f"[{format_seconds(r.ci_low_s)}, {format_seconds(r.ci_high_s)}]"
        speed = f"{base.median_s / r.median_s:.2f}x" if base else "-"
        cells = (
            f"{r.trial:>5}",
            f"{tag:15}",
            f"{format_seconds(r.median_s):>10}",
            f"{ci:>23}",
            f"{speed:>11}",
            f"{r.samples:>7}",
        )
        lines.append("  " + "  ".join(cells))
    for r in record.rows:
        if r.noisy:
            lines.append(f"  trial {r.trial}: {r.noise}")
    lines.append(f"  {record.note}")
    return "\n".join(lines)
