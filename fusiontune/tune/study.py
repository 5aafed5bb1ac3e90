"""The tuning loop: optuna ask/tell over a search space, with storage, resume and interruption.

One iteration asks a batch of trials (one per worker), turns each into a :class:`FusionConfig`,
computes its program hash in the driver (no compile), answers trials whose program was already
measured from that measurement, sends the rest to the evaluator as one batch, and tells every
result. Failed evaluations are ``TrialState.FAIL``; the accuracy bound is a constraint
(``error - bound``, feasible when <= 0).

Every record goes through :mod:`fusiontune.tune.store`, whose docstring is the storage schema.

Speedups are against baselines measured in the same window: each run of the loop (a window: the
sweep, or its resumption) measures the defaults and all-off on every node before its first trial,
and again every ``baseline_every`` trials or ``baseline_minutes`` minutes, and records with every
trial which of those measurements it is compared with.

Racing (a command target with ``racing`` on and ``repeats`` > 1): every request carries the
incumbent's runtimes, ``race_against``: the fastest feasible measurement of this window (a trial,
or a baseline before any trial is feasible) with two runs or more, never one raced out itself, and
the node it ran on. The job stops repeating a configuration clearly slower than that
(:mod:`fusiontune.measure.racing`), or whose error breaks the bound; the trial is COMPLETE with
the median of the runs made (``EvalResult.runs``, ``raced_out``). With a wall-time budget
(``--timeout``) the runs saved go to new points; ``TuneResult.runs_saved`` counts them.

Several drivers may share one study (SQLite or a database server). Under the study's lock a driver
fails the trials of dead drivers, enqueues the baseline trials (once per study), and asks its
share of the budget; the budget counts the study's trials, finished and running, not this
driver's; a driver that finds the budget given out waits for the other drivers' trials to finish.
The budget is the number of finished trials in the study, so the same command run again
continues the study up to the requested total. SIGINT / SIGTERM stop the loop once the batch in
flight is told; a second one aborts, failing the trials in flight. A driver killed outright
leaves RUNNING trials, which the next run marks FAIL (``interrupted``) before it asks anything.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.measure import machine_info
from fusiontune.tune._console import StopSignal, format_seconds, progress_bar
from fusiontune.tune._storage import display_url, open_storage
from fusiontune.tune.evaluate import program_hash
from fusiontune.tune.evaluator import Evaluator
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.tune.samplers import SamplerChoice, make_sampler
from fusiontune.tune.store import (
    ALL_OFF,
    DEFAULTS,
    Baseline,
    StudyInfo,
    StudyStore,
    TrialRecord,
    baseline_for,
    constraint_of,
    interrupted,
)
from fusiontune.workloads import Workload
from fusiontune.workloads.onnx_model import space_workload
from fusiontune.workloads.space import (
    SearchSpace,
    baseline_params,
    config_from_params,
    distributions,
)

# Stands in for a non-finite error (a NaN output): storage and optuna-dashboard need finite JSON.
HUGE_ERROR = 1e300
STOP_BUDGET = "budget"
STOP_TIMEOUT = "timeout"
STOP_INTERRUPTED = "interrupted"
STOP_GRID = "grid exhausted"
STOP_WHEN = "stop_when"
STOP_RUNS = "runs"
# How often a driver waiting for other drivers' trials looks again.
_PEER_POLL_S = 0.5


@dataclass(frozen=True)
class TuneResult:
    """What one ``run_tune`` call left in the study.

    Attributes:
        study_name: the study.
        storage_url: where it is stored (password masked).
        n_finished: finished trials in the study (COMPLETE + FAIL + PRUNED), all runs together.
        n_new: trials this call finished.
        best_trial: number of the fastest feasible trial, None when there is none.
        best_median_s: its median runtime.
        stopped_reason: ``budget``, ``timeout``, ``interrupted``, ``grid exhausted``,
            ``stop_when`` or ``runs`` (the job-run budget).
        window: this call's window (the ``Baseline.window`` of the baselines it measured).
        runs: job runs a command target made for this call's trials (0 for other evaluators).
        runs_saved: job runs racing saved (``repeats`` minus the runs made, over the trials
            raced out).
        raced_out: trials of this call that were raced out.
    """

    study_name: str
    storage_url: str
    n_finished: int
    n_new: int
    best_trial: int | None
    best_median_s: float | None
    stopped_reason: str
    window: str = ""
    runs: int = 0
    runs_saved: int = 0
    raced_out: int = 0

    def racing_line(self) -> str:
        """``racing: 37 of 120 job runs saved (14 trials raced out)``; "" when nothing raced."""
        return racing_line(self.runs, self.runs_saved, self.raced_out)


def racing_line(runs: int, runs_saved: int, raced_out: int) -> str:
    """``racing: 37 of 120 job runs saved (14 trials raced out)``; "" when nothing raced."""
    if not raced_out:
        return ""
    return (
        f"racing: {runs_saved} of {runs + runs_saved} job runs saved"
        f" ({raced_out} trial{'s' if raced_out != 1 else ''} raced out)"
    )


def default_storage_url(study_name: str, results_root: str | Path = "results") -> str:
    """``sqlite:///results/<study>/study.db`` (relative to the working directory)."""
    return f"sqlite:///{Path(results_root) / study_name / 'study.db'}"


def trial_constraint(trial: FrozenTrial) -> tuple[float]:
    """The accuracy constraint of a told trial, ``(error - bound,)``: optuna's constraints_func."""
    return constraint_of(trial)


def is_feasible(trial: FrozenTrial) -> bool:
    """A COMPLETE trial whose error is within the bound."""
    return TrialRecord.from_trial(trial).feasible


def run_tune(
    space: SearchSpace,
    evaluator: Evaluator,
    storage_url: str,
    study_name: str,
    n_trials: int,
    timeout_s: float | None = None,
    sampler: str | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    workload: Workload | None = None,
    stop_when: Callable[[FrozenTrial], bool] | None = None,
    max_runs: int | None = None,
) -> TuneResult:
    """Search ``space`` until the study holds ``n_trials`` finished trials, or time runs out.

    Args:
        space: the search space (``baseline_every`` / ``baseline_minutes`` say how often the
            baselines are measured again).
        evaluator: measures batches of configurations (local, Ray, replay).
        storage_url: a SQLAlchemy URL; the study is created or continued there.
        study_name: the study.
        n_trials: the total of finished trials to reach, earlier runs and other drivers included.
        timeout_s: wall-time budget of this call; no new batch starts after it.
        sampler: ``tpe``, ``random``, ``grid`` or ``nsga2``; the space's sampler when None.
        seed: the sampler seed; the space's seed when None.
        batch_size: trials per batch; the evaluator's ``workers`` (1 when it has none).
        progress: show a progress bar on a terminal, progress lines elsewhere (``_console``).
        workload: the workload whose graph (and training step) give program hashes; built from
            the space when None (a command target has none: a configuration's key stands for its
            program).
        stop_when: called with every trial told; when it returns True the loop stops after
            the batch in flight (``stopped_reason`` "stop_when"), e.g. once a target is reached.
        max_runs: a budget of job runs for this call (a command target; racing's saved runs go
            to new trials): no batch starts once the runs made reach it, and a batch holds at
            most the trials its remaining runs pay for at ``repeats`` each (the enqueued
            baselines' runs count; the periodic re-measurements of the baselines do not).

    Returns:
        The study's state at the end of this call.

    Raises:
        UserError: the storage cannot be opened, the study was made from an incompatible space,
            or the grid is too large.
        KeyboardInterrupt: a second Ctrl-C; the trials in flight are marked FAIL first.
    """
    sampler_name = sampler or space.sampler
    seed = space.seed if seed is None else seed
    storage = open_storage(storage_url)
    choice = make_sampler(sampler_name, space, seed, n_trials, trial_constraint)
    with StudyStore.locked(storage, study_name):
        study = optuna.create_study(
            storage=storage,
            study_name=study_name,
            load_if_exists=True,
            directions=["minimize"] * choice.objectives,
            sampler=choice.sampler,
        )
        store = StudyStore(study)
        _check_compatible(store, space, storage_url, sampler_name, choice.objectives)
        if not store.has_info():
            store.write_info(_study_info(space, sampler_name))
        earlier = len(study.get_trials(deepcopy=False))
    if earlier:
        # A resumed study continues the seeded sequence instead of drawing its first points
        # again (the same seed would repeat every earlier window's random and start-up trials).
        study.sampler = make_sampler(sampler_name, space, (seed + earlier) % 2**32, n_trials, trial_constraint).sampler
    if workload is None and space.target is None:
        workload = space_workload(space)
    batch = batch_size or int(getattr(evaluator, "workers", 0) or 1)
    sweep = _Sweep(store, space, evaluator, choice, workload, sampler_name == "grid", stop_when)
    return sweep.run(
        n_trials, timeout_s, max(1, batch), progress, display_url(storage_url), max_runs
    )


# ---- the study: compatibility and attributes ---------------------------------------------------
def _check_compatible(
    store: StudyStore, space: SearchSpace, url: str, sampler: str, objectives: int
) -> None:
    """Refuse to continue a study made from another workload, bound or parameter set."""
    study = store.study
    where = f"study {study.study_name!r} in {display_url(url)}"
    if len(study.directions) != objectives:
        raise UserError(
            f"{where} has {len(study.directions)} objective(s); sampler {sampler} needs"
            f" {objectives}: use another --study name"
        )
    if store.has_info():
        info = store.info()
        recorded = {"workload": info.workload, "sizes": dict(info.sizes), "metric": info.metric, "bound": info.bound}
        current = {"workload": space.workload, "sizes": dict(space.sizes), "metric": space.metric, "bound": space.bound}
        for key, value in current.items():
            if recorded[key] != value:
                raise UserError(
                    f"{where} was tuned with {key} = {recorded[key]!r}, not {value!r}:"
                    " use another --study name"
                )
    dists = distributions(space)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if t.distributions and t.distributions != dists:
            raise UserError(
                f"{where} searched other parameters than {space.path}: use another --study name"
            )
        if t.distributions:
            break


def _study_info(space: SearchSpace, sampler: str) -> StudyInfo:
    try:
        text = Path(space.path).read_text(encoding="utf-8")
    except OSError:
        text = ""
    return StudyInfo(
        space_path=str(space.path),
        space_toml=text,
        workload=space.workload,
        sizes=dict(space.sizes),
        metric=space.metric,
        bound=space.bound,
        sampler=sampler,
        machine=machine_info(),
        target=space.target.to_json() if space.target is not None else None,
    )


# ---- one sweep -----------------------------------------------------------------------------
@dataclass
class _Asked:
    """A trial asked in this batch, with what the driver knows about it before measuring."""

    trial: optuna.Trial
    config: FusionConfig | None
    phash: str
    problem: str = ""  # why it cannot be evaluated at all (params that do not resolve)

    @property
    def number(self) -> int:
        return self.trial.number


@dataclass(frozen=True)
class _Measured:
    """A program measured in this study: the trial that measured it, and its baseline."""

    trial: int
    result: EvalResult
    baseline: str


class _Sweep:
    """The state of one ``run_tune`` call over a study."""

    def __init__(
        self,
        store: StudyStore,
        space: SearchSpace,
        evaluator: Evaluator,
        choice: SamplerChoice,
        workload: Workload | None,
        is_grid: bool,
        stop_when: Callable[[FrozenTrial], bool] | None = None,
    ) -> None:
        self.store = store
        self.study = store.study
        self.space = space
        self.evaluator = evaluator
        self.choice = choice
        self.workload = workload
        self.is_grid = is_grid
        self.stop_when = stop_when
        self.stop_requested = False
        self.dists = distributions(space)
        self.driver = store.new_driver()
        self.window = uuid.uuid4().hex[:8]
        # program hash -> its measurement; only successful ones.
        self.measured: dict[str, _Measured] = {}
        self.baselines: list[Baseline] = []
        self.told_since_baseline = 0
        self.baseline_at = 0.0
        self.best: tuple[float, int] | None = None
        target = space.target
        self.racing = target is not None and target.racing and target.repeats > 1
        # The fastest feasible measurement of this window that requests race against.
        self.incumbent: EvalResult | None = None
        self.runs = self.runs_saved = self.raced_out = 0
        self.bar: Any = None

    # ---- the loop ---------------------------------------------------------------------------
    def run(
        self,
        n_trials: int,
        timeout_s: float | None,
        batch: int,
        progress: bool,
        url: str,
        max_runs: int | None = None,
    ) -> TuneResult:
        with self.store.lock():
            self.store.fail_stale_trials()
            self._enqueue_baselines()
        self._load_history()
        start_finished = self.store.count_finished()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        reason = STOP_BUDGET
        with (
            StopSignal(self._echo) as stop,
            self.driver,
            progress_bar(progress, n_trials, start_finished, self.study.study_name) as bar,
        ):
            self.bar = bar
            self._show_best()
            while True:
                if stop.requested:
                    reason = STOP_INTERRUPTED
                    break
                if self.stop_requested:
                    reason = STOP_WHEN
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    reason = STOP_TIMEOUT
                    break
                if max_runs is not None and self.runs >= max_runs:
                    reason = STOP_RUNS
                    break
                sampler: Any = self.choice.sampler
                if self.is_grid and sampler.is_exhausted(self.study):
                    reason = STOP_GRID
                    break
                asked = self._ask_share(self._runs_paid_for(batch, max_runs), n_trials)
                if asked is None:  # the budget is given out; others may still be measuring
                    reason = STOP_BUDGET
                    if not self._wait_for_peers(stop, deadline):
                        reason = STOP_INTERRUPTED if stop.requested else STOP_TIMEOUT
                    break
                self._run_batch(asked)
            self.bar = None
        if self.raced_out:
            self._echo(racing_line(self.runs, self.runs_saved, self.raced_out))
        n_finished = self.store.count_finished()
        best_s, best_n = self.best if self.best is not None else (None, None)
        return TuneResult(
            self.study.study_name,
            url,
            n_finished,
            n_finished - start_finished,
            best_n,
            best_s,
            reason,
            self.window,
            self.runs,
            self.runs_saved,
            self.raced_out,
        )

    def _runs_paid_for(self, batch: int, max_runs: int | None) -> int:
        """The batch size the remaining job runs pay for (``repeats`` runs a trial)."""
        if max_runs is None or self.space.target is None:
            return batch
        repeats = max(1, self.space.target.repeats)
        return max(1, min(batch, -(-(max_runs - self.runs) // repeats)))

    def _ask_share(self, batch: int, n_trials: int) -> list[optuna.Trial] | None:
        """Ask and stamp this driver's next trials under the study lock; None when the budget is
        given out.

        Trials other drivers are running count against the budget; a dead driver's are failed
        first (they count as finished). Only asking and stamping happen under the lock: the
        program hashes are computed after it is released.
        """
        with self.store.lock():
            self.store.fail_stale_trials()
            k = min(batch, n_trials - self.store.count_taken())
            if k <= 0:
                return None
            trials = []
            for _ in range(k):
                trial = self.study.ask(self.dists)
                self.driver.claim(trial._trial_id)
                trials.append(trial)
            return trials

    def _wait_for_peers(self, stop: StopSignal, deadline: float | None) -> bool:
        """Wait until no other driver has a trial in flight, failing the ones of dead drivers.

        Returns False when a signal or the wall-time budget ended the wait first.
        """
        said = False
        while not stop.requested and (deadline is None or time.monotonic() < deadline):
            with self.store.lock():
                self.store.fail_stale_trials()
                running = self.store.running()
            if not running:
                return True
            if not said:
                self._echo(
                    f"waiting for {len(running)} trial(s) other drivers are measuring"
                    f" ({', '.join(str(t.number) for t in running)})"
                )
                said = True
            time.sleep(_PEER_POLL_S)
        return False

    def _run_batch(self, trials: list[optuna.Trial]) -> int:
        told: set[int] = set()
        asked: list[_Asked] = []
        try:
            if self._baseline_due():  # before this window's first trial, then at intervals
                self._measure_baselines()
            for trial in trials:
                asked.append(self._resolve(trial))
            self._measure_and_tell(asked, told)
        finally:
            # An exception or a second Ctrl-C: what was asked and not told becomes a failed trial.
            resolved = {item.number: item for item in asked}
            for trial in trials:
                if trial.number not in told:
                    self._fail_untold(resolved.get(trial.number) or _Asked(trial, None, ""))
        return len(told)

    def _resolve(self, trial: optuna.Trial) -> _Asked:
        """A trial's configuration and program hash (milliseconds: the pipeline, no compile)."""
        try:
            config = config_from_params(self.space, trial.params)
        except Exception as e:  # a sampler's point the space cannot resolve: a failed trial
            return _Asked(trial, None, "", f"parameters do not resolve: {e}")
        try:
            # A command target's program is the job's business: the same switches, the same job.
            w = self.workload
            phash = config.key() if w is None else program_hash(w.graph, config, train=w.train)
        except Exception:  # the evaluator will report the same failure with its message
            phash = ""
        self.store.record_asked(trial, config, phash)
        return _Asked(trial, config, phash)

    def _measure_and_tell(self, asked: Sequence[_Asked], told: set[int]) -> None:
        to_measure: list[_Asked] = []
        first_in_batch: dict[str, _Asked] = {}
        for item in asked:
            if item.problem or item.phash in self.measured:
                continue
            if not item.phash:  # the pipeline failed in the driver: the evaluator says why
                to_measure.append(item)
            elif item.phash not in first_in_batch:
                first_in_batch[item.phash] = item
                to_measure.append(item)
        race = self._race()
        requests = [
            EvalRequest(item.number, item.config, **race)
            for item in to_measure
            if item.config is not None
        ]
        results = self.evaluator.evaluate(requests) if requests else []
        if len(results) != len(requests):
            raise RuntimeError(
                f"evaluator answered {len(results)} results for {len(requests)} requests"
            )
        by_number = {item.number: r for item, r in zip(to_measure, results, strict=True)}
        for r in results:
            self._count_runs(r)
        fresh: dict[int, str] = {}
        for item in asked:
            reused: _Measured | None = None
            if item.problem:
                result = EvalResult(item.number, "", "", EvalStatus.BUILD_FAILED, item.problem)
            elif item.number in by_number:
                result = by_number[item.number]
            elif item.phash in self.measured:
                reused = self.measured[item.phash]
                result = reused.result
            else:
                source = first_in_batch[item.phash]
                result = by_number[source.number]
                reused = _Measured(source.number, result, fresh.get(source.number, ""))
            baseline = reused.baseline if reused is not None else self._baseline_id(result)
            fresh[item.number] = baseline
            self._tell(item, result, reused.trial if reused is not None else None, baseline)
            told.add(item.number)

    # ---- telling ------------------------------------------------------------------------------
    def _tell(self, item: _Asked, result: EvalResult, reused_from: int | None, baseline: str) -> None:
        trial = item.trial
        changes: dict[str, Any] = {"trial": item.number}
        if item.config is not None:
            changes["config_key"] = item.config.key()
        if item.phash:
            changes["program_hash"] = item.phash
        result = dataclasses.replace(result, **changes)
        constraint: float | None = None
        error = math.inf
        if result.ok:
            error = result.error(self.space.metric)
            error = error if math.isfinite(error) else HUGE_ERROR
            constraint = error - self.space.bound
        self.store.record_result(
            trial, result, constraint, reused_from, baseline, not self.choice.takes_constraints
        )
        try:
            if result.ok:
                values = [result.median_s] if self.choice.objectives == 1 else [result.median_s, error]
                frozen = self.study.tell(trial, values)
            else:
                frozen = self.study.tell(trial, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            self._echo(f"trial {item.number} was failed by another driver meanwhile; its result is dropped")
            self.driver.release(trial._trial_id)
            return
        self.driver.release(trial._trial_id)
        self.told_since_baseline += 1
        if result.ok:
            if reused_from is None and item.phash:
                self.measured.setdefault(item.phash, _Measured(item.number, result, baseline))
            if reused_from is None and constraint is not None and constraint <= 0:
                self._consider_incumbent(result)
            if constraint is not None and constraint <= 0 and (
                self.best is None or result.median_s < self.best[0]
            ):
                self.best = (result.median_s, item.number)
                self._show_best()
        if self.stop_when is not None and self.stop_when(frozen):
            self.stop_requested = True
        if self.bar is not None:
            self.bar.told(result.ok)

    def _fail_untold(self, item: _Asked) -> None:
        message = "interrupted: the sweep stopped before this trial was measured"
        try:
            key = item.config.key() if item.config is not None else ""
            result = EvalResult(item.number, key, item.phash, EvalStatus.NOT_RECORDED, message)
            self.store.record_interrupted(item.trial._trial_id, result, message)
            self.study.tell(item.trial, state=TrialState.FAIL)
        except Exception:  # the storage itself is gone: the next run fails it as stale
            pass
        self.driver.release(item.trial._trial_id)

    # ---- baselines and history ----------------------------------------------------------------
    def _enqueue_baselines(self) -> None:
        """Enqueue the registry defaults and all-off (and the ``only:`` trials) once per study.

        Called under the study lock. A role is enqueued again only when every earlier attempt
        was interrupted, so that a sweep killed during its first batch still gets its reference
        points.
        """
        roles = self.store.roles()
        for role, params in baseline_params(self.space).items():  # defaults, then all_off
            attempts = roles.get(role, [])
            if all(interrupted(t) for t in attempts):
                self.store.enqueue(params, role)

    def _baseline_due(self) -> bool:
        if not self.baselines:
            return True
        if self._nodes_without_baseline():  # a node that joined the cluster in this window
            return True
        return self._interval_due()

    def _interval_due(self) -> bool:
        every = int(getattr(self.space, "baseline_every", 0) or 0)
        minutes = float(getattr(self.space, "baseline_minutes", 0.0) or 0.0)
        if every > 0 and self.told_since_baseline >= every:
            return True
        return minutes > 0 and time.monotonic() - self.baseline_at >= minutes * 60

    def _nodes(self) -> list[str]:
        """The evaluator's measuring nodes (``[""]``: one machine, whichever it is)."""
        nodes_of = getattr(self.evaluator, "nodes", None)
        return list(nodes_of() if callable(nodes_of) else []) or [""]

    def _nodes_without_baseline(self) -> list[str]:
        measured = {b.node for b in self.baselines}
        return [n for n in self._nodes() if n and n not in measured]

    def _measure_baselines(self) -> None:
        """Measure the defaults and all-off, as this window's: on every node of the evaluator when
        the interval is due, else only on nodes that have none in this window yet."""
        params = baseline_params(self.space)
        defaults = config_from_params(self.space, params[DEFAULTS])
        all_off = config_from_params(self.space, params[ALL_OFF])
        interval_due = not self.baselines or self._interval_due()
        nodes = self._nodes() if interval_due else self._nodes_without_baseline()
        seq = len(self.baselines)
        requests = [
            EvalRequest(-1, config, node=node, label=f"baseline-{self.window}-{seq + i}-{role}")
            for i, node in enumerate(nodes)
            for role, config in ((DEFAULTS, defaults), (ALL_OFF, all_off))
        ]
        results = self.evaluator.evaluate(requests)
        finished = self.store.count_finished()
        for i, node in enumerate(nodes):
            d, a = results[2 * i], results[2 * i + 1]
            baseline = Baseline(
                f"{self.window}-{len(self.baselines)}",
                self.window,
                d.node or a.node or node,
                time.time(),
                finished,
                d,
                a,
            )
            self.store.add_baseline(baseline)
            self.baselines.append(baseline)
            for r in (d, a):
                if r.ok and r.error(self.space.metric) <= self.space.bound:
                    self._consider_incumbent(r)
            self._echo(_baseline_line(baseline))
        if interval_due:
            self.told_since_baseline = 0
            self.baseline_at = time.monotonic()

    def _baseline_id(self, result: EvalResult) -> str:
        found = baseline_for(self.baselines, self.window, result.node, math.inf)
        return found.id if found is not None else ""

    def _load_history(self) -> None:
        for t in self.store.trials((TrialState.COMPLETE,)):
            if not t.program_hash or not t.measured or t.result is None:
                continue
            source = t.reused_from if t.reused_from is not None else t.number
            self.measured.setdefault(t.program_hash, _Measured(source, t.result, t.baseline))
            if t.feasible and (self.best is None or t.result.median_s < self.best[0]):
                self.best = (t.result.median_s, t.number)

    # ---- racing -------------------------------------------------------------------------------
    def _race(self) -> dict[str, Any]:
        """The racing fields of this batch's requests (none when racing is off)."""
        if not self.racing:
            return {}
        race: dict[str, Any] = {"race_bound": self.space.bound}
        if self.incumbent is not None:
            race.update(race_against=self.incumbent.samples_s, race_node=self.incumbent.node)
        return race

    def _consider_incumbent(self, result: EvalResult) -> None:
        """Race against ``result`` from now on if it is the fastest feasible one of this window.

        Only this window's measurements (those of an earlier window may have drifted), with two
        runs or more (the test needs the incumbent's spread), and never a raced-out one (its
        few runs were slow by selection).
        """
        if not self.racing or result.raced_out or len(result.samples_s) < 2:
            return
        if self.incumbent is None or result.median_s < self.incumbent.median_s:
            self.incumbent = result

    def _count_runs(self, result: EvalResult) -> None:
        self.runs += result.runs
        if result.raced_out and self.space.target is not None:
            self.raced_out += 1
            self.runs_saved += max(0, self.space.target.repeats - result.runs)

    # ---- output -------------------------------------------------------------------------------
    def _show_best(self) -> None:
        if self.bar is not None and self.best is not None:
            self.bar.set_postfix_str(
                f"best feasible {format_seconds(self.best[0])} (trial {self.best[1]})"
            )

    def _echo(self, message: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)


def _baseline_line(b: Baseline) -> str:
    """``baselines on host-a: defaults 1.27 ms, all-off 2.05 ms`` (and a note when noisy or failed)."""

    def one(r: EvalResult) -> str:
        if not r.ok:
            return f"failed ({r.error_msg or r.status.value})"
        return format_seconds(r.median_s) + (" (noisy)" if r.noisy else "")

    return f"baselines on {b.node or 'this machine'}: defaults {one(b.defaults)}, all-off {one(b.all_off)}"
