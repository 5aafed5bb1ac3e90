"""Confirmation of a command target: run the user's job again for the best configurations.

The same protocol as :func:`fusiontune.tune.confirm.confirm`, with the job instead of a program
in this process: the top k feasible configurations (one per distinct configuration) and the
defaults are run round-robin, each round once per candidate (``target.repeats`` runs each),
starting one further along each round, on this machine. The samples give each a median and its
confidence interval, and the winner is named the same way.

Racing (``target.racing``): after each round but the last, a candidate whose runs so far are
clearly slower than the best feasible candidate's (:func:`fusiontune.measure.racing.clearly_worse`,
``alpha`` split over the rounds that look) is not run again. Its row keeps the samples of the
rounds it ran (its confidence interval is theirs, wider for fewer), and the note names it. The
defaults are never raced out: the winner is decided against them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from fusiontune.tune.confirm import (
    ConfirmedRow,
    confirmation_record,
    decide,
    format_confirmation,
    median_ci,
    race_round,
    select_candidates,
)
from fusiontune.tune.store import Confirmation, StudyStore
from fusiontune.workloads.space import SearchSpace

COMMAND_ROUNDS = 3
"""Rounds of the confirmation of a command target: each runs the job once per candidate."""


def confirm_command(
    study: optuna.Study,
    space: SearchSpace,
    base_dir: str | Path,
    top_k: int | None = None,
    rounds: int = COMMAND_ROUNDS,
    echo: Callable[[str], None] = print,
    evaluator_factory: Callable[[Path], Any] | None = None,
) -> Confirmation:
    """Run the user's job again for the top ``top_k`` configurations and the defaults, interleaved.

    Round ``r`` runs every candidate once, starting one further along each round, through a
    :class:`~fusiontune.tune.command.CommandEvaluator` whose trial folders are
    ``base_dir/round<r>/<trial>/``. A candidate whose job fails in any round, or reports a
    metric it cannot have (a runtime not finite and > 0, an error not finite and >= 0), is left
    out (the note says why). The record is the one :func:`confirm` stores.

    Args:
        study: the tuned study.
        space: its space (a command target).
        base_dir: where the confirmation's trial folders go (``results/<study>/confirm``).
        top_k: how many of the best feasible configurations; the space's ``top_k`` when None.
        rounds: job runs per candidate.
        echo: where the table goes.
        evaluator_factory: the evaluator of one round's folder (tests); a CommandEvaluator
            when None.

    Returns:
        The ``confirmation`` record.
    """
    from fusiontune.tune._job_output import refuse_bad_metrics
    from fusiontune.tune.command import CommandEvaluator
    from fusiontune.tune.records import EvalRequest

    assert space.target is not None, "confirm_command needs a command target"
    target = space.target
    top_k = space.top_k if top_k is None else top_k
    candidates, defaults_trial = select_candidates(study, top_k, space)
    samples: dict[int, list[float]] = {c.trial: [] for c in candidates}
    errors: dict[int, float] = {c.trial: -math.inf for c in candidates}
    dropped: dict[int, str] = {}
    raced: dict[int, str] = {}
    for r in range(rounds):
        make = evaluator_factory or (lambda folder: CommandEvaluator(target, folder))
        evaluator = make(Path(base_dir) / f"round{r}")
        order = [candidates[(r + j) % len(candidates)] for j in range(len(candidates))]
        order = [c for c in order if c.trial not in dropped and c.trial not in raced]
        try:
            results = evaluator.evaluate([EvalRequest(c.trial, c.config) for c in order])
        finally:
            evaluator.close()
        for c, result in zip(order, results, strict=True):
            result = refuse_bad_metrics(result)  # the evaluator may be another's (a factory's)
            if not result.ok:
                dropped[c.trial] = f"trial {c.trial} ({result.error_msg})"
                continue
            samples[c.trial].extend(result.samples_s or (result.median_s,))
            errors[c.trial] = max(errors[c.trial], result.error(space.metric))
        if target.racing and r < rounds - 1:
            live = [c for c in candidates if c.trial not in dropped and c.trial not in raced]
            raced.update(
                race_round(
                    live, samples, errors, space.bound, defaults_trial, rounds, target.repeats
                )
            )
    rows = []
    for c in candidates:
        if c.trial in dropped or not samples[c.trial]:
            continue
        s = samples[c.trial]
        low, high = median_ci(s)
        error = errors[c.trial]
        ok = c.feasible and math.isfinite(error) and error <= space.bound
        rows.append(ConfirmedRow(c, tuple(s), float(np.median(s)), low, high, error, ok))
    winner, distinguishable, note = decide(rows, defaults_trial)
    if raced:
        note += f"; not run again, clearly slower than the best: {', '.join(raced.values())}"
    if dropped:
        note += f"; the job failed for {', '.join(dropped.values())}"
    store = StudyStore(study)
    record = confirmation_record(
        rows, defaults_trial, winner, distinguishable, note, store.count_finished()
    )
    store.write_confirmation(record)
    echo(format_confirmation(record))
    return record
