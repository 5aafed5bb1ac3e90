"""The tuning loop: optuna ask/tell over a search space, with storage, resume and interruption.

One iteration asks a batch of trials (one per worker), turns each into a :class:`FusionConfig`,
computes its program hash in the driver (no compile), answers trials whose program was already
measured from that measurement, sends the rest to the evaluator as one batch, and tells every
result. Failed evaluations are ``TrialState.FAIL``; the accuracy bound is a constraint
(``error - bound``, feasible when <= 0).

The storage schema, which ``fusiontune.report`` reads back:

- parameters ``pass.<Pass>`` ("off" / "on") and ``split.<Pass>.<point>`` (int), categorical;
- values ``[median_s]``, or ``[median_s, error]`` for nsga2, all minimized;
- the constraint ``error - bound`` in the system attr ``constraints`` (as optuna's
  ``constraints_func`` stores it, for every sampler) and in the user attr ``constraint``;
- trial user attrs ``result`` (``EvalResult.to_json()``, failures too), ``config``
  (``FusionConfig.to_json()``), ``program_hash``, ``reused_from`` (the trial whose measurement
  this one reused), ``role`` (``defaults`` / ``all_off``), ``interrupted`` (why a trial in
  flight was failed);
- study user attrs ``space_path``, ``space_toml``, ``workload``, ``sizes``, ``metric``,
  ``bound``, ``sampler``, ``machine``, ``target`` (a command target's
  ``CommandTarget.to_json()``, absent for a built-in workload), and ``confirmation``
  (:mod:`fusiontune.tune.confirm`).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.ir.graph import Graph
from fusiontune.measure import machine_info
from fusiontune.tune._console import StopSignal, format_seconds, progress_bar
from fusiontune.tune._storage import (
    Driver,
    count_finished,
    display_url,
    fail_stale_trials,
    open_storage,
)
from fusiontune.tune.evaluate import program_hash
from fusiontune.tune.evaluator import Evaluator
from fusiontune.tune.records import FAILED, EvalRequest, EvalResult
from fusiontune.tune.samplers import SamplerChoice, make_sampler
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
        stopped_reason: ``budget``, ``timeout``, ``interrupted``, ``grid exhausted`` or
            ``stop_when``.
    """

    study_name: str
    storage_url: str
    n_finished: int
    n_new: int
    best_trial: int | None
    best_median_s: float | None
    stopped_reason: str


def default_storage_url(study_name: str, results_root: str | Path = "results") -> str:
    """``sqlite:///results/<study>/study.db`` (relative to the working directory)."""
    return f"sqlite:///{Path(results_root) / study_name / 'study.db'}"


def trial_constraint(trial: FrozenTrial) -> tuple[float]:
    """The accuracy constraint of a told trial, ``(error - bound,)``: optuna's constraints_func."""
    return (float(trial.user_attrs["constraint"]),)


def is_feasible(trial: FrozenTrial) -> bool:
    """A COMPLETE trial whose error is within the bound."""
    c = trial.user_attrs.get("constraint")
    return trial.state == TrialState.COMPLETE and c is not None and float(c) <= 0.0


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
    graph: Graph | None = None,
    stop_when: Callable[[FrozenTrial], bool] | None = None,
) -> TuneResult:
    """Search ``space`` until the study holds ``n_trials`` finished trials, or time runs out.

    Args:
        space: the search space.
        evaluator: measures batches of configurations (local, Ray, replay).
        storage_url: a SQLAlchemy URL; the study is created or continued there.
        study_name: the study.
        n_trials: the total of finished trials to reach, earlier runs included.
        timeout_s: wall-time budget of this call; no new batch starts after it.
        sampler: ``tpe``, ``random``, ``grid`` or ``nsga2``; the space's sampler when None.
        seed: the sampler seed; the space's seed when None.
        batch_size: trials per batch; the evaluator's ``workers`` (1 when it has none).
        progress: show a progress bar (only on a terminal).
        graph: the workload graph for program hashes; built from the space when None (a
            command target has none: a configuration's key stands for its program).
        stop_when: called with every trial told; when it returns True the loop stops after
            the batch in flight (``stopped_reason`` "stop_when"), e.g. once a target is reached.

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
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        load_if_exists=True,
        directions=["minimize"] * choice.objectives,
        sampler=choice.sampler,
    )
    _check_compatible(study, space, storage_url, sampler_name, choice.objectives)
    _record_study_attrs(study, space, sampler_name)
    if graph is None and space.target is None:
        graph = space_workload(space).graph
    batch = batch_size or int(getattr(evaluator, "workers", 0) or 1)
    sweep = _Sweep(study, space, evaluator, choice, graph, sampler_name == "grid", stop_when)
    return sweep.run(n_trials, timeout_s, max(1, batch), progress, display_url(storage_url))


# ---- the study: compatibility and attributes ---------------------------------------------------
def _check_compatible(
    study: optuna.Study, space: SearchSpace, url: str, sampler: str, objectives: int
) -> None:
    """Refuse to continue a study made from another workload, bound or parameter set."""
    where = f"study {study.study_name!r} in {display_url(url)}"
    if len(study.directions) != objectives:
        raise UserError(
            f"{where} has {len(study.directions)} objective(s); sampler {sampler} needs"
            f" {objectives}: use another --study name"
        )
    attrs = study.user_attrs
    current = {
        "workload": space.workload,
        "sizes": dict(space.sizes),
        "metric": space.metric,
        "bound": space.bound,
    }
    for key, value in current.items():
        if key in attrs and attrs[key] != value:
            raise UserError(
                f"{where} was tuned with {key} = {attrs[key]!r}, not {value!r}:"
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


def _record_study_attrs(study: optuna.Study, space: SearchSpace, sampler: str) -> None:
    """The study user attrs the report reads (set once, when the study is new)."""
    if "space_toml" in study.user_attrs:
        return
    try:
        text = Path(space.path).read_text(encoding="utf-8")
    except OSError:
        text = ""
    attrs: dict[str, Any] = {
        "space_path": str(space.path),
        "space_toml": text,
        "workload": space.workload,
        "sizes": dict(space.sizes),
        "metric": space.metric,
        "bound": space.bound,
        "sampler": sampler,
        "machine": machine_info(),
    }
    if space.target is not None:
        attrs["target"] = space.target.to_json()
    for key, value in attrs.items():
        study.set_user_attr(key, value)


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


class _Sweep:
    """The state of one ``run_tune`` call over a study."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        evaluator: Evaluator,
        choice: SamplerChoice,
        graph: Graph | None,
        is_grid: bool,
        stop_when: Callable[[FrozenTrial], bool] | None = None,
    ) -> None:
        self.study = study
        self.space = space
        self.evaluator = evaluator
        self.choice = choice
        self.graph = graph
        self.is_grid = is_grid
        self.stop_when = stop_when
        self.stop_requested = False
        self.dists = distributions(space)
        self.driver = Driver(study._storage)
        # program hash -> (trial number that measured it, its result); only successful ones.
        self.measured: dict[str, tuple[int, EvalResult]] = {}
        self.best: tuple[float, int] | None = None
        self.bar: Any = None

    # ---- the loop ---------------------------------------------------------------------------
    def run(
        self, n_trials: int, timeout_s: float | None, batch: int, progress: bool, url: str
    ) -> TuneResult:
        fail_stale_trials(self.study, on_fail=self._record_interrupted)
        self._enqueue_baselines()
        self._load_history()
        start_finished = count_finished(self.study)
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
                finished = count_finished(self.study)
                if finished >= n_trials:
                    reason = STOP_BUDGET
                    break
                if stop.requested:
                    reason = STOP_INTERRUPTED
                    break
                if self.stop_requested:
                    reason = STOP_WHEN
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    reason = STOP_TIMEOUT
                    break
                sampler: Any = self.choice.sampler
                if self.is_grid and sampler.is_exhausted(self.study):
                    reason = STOP_GRID
                    break
                self._run_batch(min(batch, n_trials - finished))
            self.bar = None
        n_finished = count_finished(self.study)
        best_s, best_n = self.best if self.best is not None else (None, None)
        return TuneResult(
            self.study.study_name,
            url,
            n_finished,
            n_finished - start_finished,
            best_n,
            best_s,
            reason,
        )

    def _run_batch(self, k: int) -> None:
        asked: list[_Asked] = []
        told: set[int] = set()
        try:
            for _ in range(k):
                asked.append(self._ask())
            self._measure_and_tell(asked, told)
        finally:
            # An exception or a second Ctrl-C: what was asked and not told becomes a failed trial.
            for item in asked:
                if item.number not in told:
                    self._fail_untold(item)

    def _ask(self) -> _Asked:
        trial = self.study.ask(self.dists)
        self.driver.claim(trial._trial_id)
        try:
            config = config_from_params(self.space, trial.params)
        except Exception as e:  # a sampler's point the space cannot resolve: a failed trial
            return _Asked(trial, None, "", f"parameters do not resolve: {e}")
        trial.set_user_attr("config", config.to_json())
        try:
            # A command target's program is the job's business: the same switches, the same job.
            phash = config.key() if self.graph is None else program_hash(self.graph, config)
        except Exception:  # the evaluator will report the same failure with its message
            phash = ""
        trial.set_user_attr("program_hash", phash)
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
        requests = [
            EvalRequest(item.number, item.config) for item in to_measure if item.config is not None
        ]
        results = self.evaluator.evaluate(requests) if requests else []
        if len(results) != len(requests):
            raise RuntimeError(
                f"evaluator answered {len(results)} results for {len(requests)} requests"
            )
        by_number = {item.number: r for item, r in zip(to_measure, results, strict=True)}
        for item in asked:
            reused_from: int | None = None
            if item.problem:
                result = EvalResult(item.number, "", "", FAILED, item.problem)
            elif item.number in by_number:
                result = by_number[item.number]
            elif item.phash in self.measured:
                reused_from, result = self.measured[item.phash]
            else:
                source = first_in_batch[item.phash]
                reused_from, result = source.number, by_number[source.number]
            self._tell(item, result, reused_from)
            told.add(item.number)

    # ---- telling ------------------------------------------------------------------------------
    def _tell(self, item: _Asked, result: EvalResult, reused_from: int | None) -> None:
        trial = item.trial
        changes: dict[str, Any] = {"trial": item.number}
        if item.config is not None:
            changes["config_key"] = item.config.key()
        if item.phash:
            changes["program_hash"] = item.phash
        if reused_from is not None:
            changes["extra"] = {**dict(result.extra), "reused_from": reused_from}
            trial.set_user_attr("reused_from", reused_from)
        result = dataclasses.replace(result, **changes)
        trial.set_user_attr("result", result.to_json())
        if result.ok:
            error = result.error(self.space.metric)
            error = error if math.isfinite(error) else HUGE_ERROR
            constraint = error - self.space.bound
            trial.set_user_attr("constraint", constraint)
            if not self.choice.takes_constraints:
                # What optuna stores for a sampler with constraints_func; the same for every trial.
                self.study._storage.set_trial_system_attr(
                    trial._trial_id, "constraints", [constraint]
                )
            values = [result.median_s] if self.choice.objectives == 1 else [result.median_s, error]
            frozen = self.study.tell(trial, values)
            if reused_from is None and item.phash:
                self.measured.setdefault(item.phash, (item.number, result))
            if constraint <= 0 and (self.best is None or result.median_s < self.best[0]):
                self.best = (result.median_s, item.number)
                self._show_best()
        else:
            frozen = self.study.tell(trial, state=TrialState.FAIL)
        self.driver.release(trial._trial_id)
        if self.stop_when is not None and self.stop_when(frozen):
            self.stop_requested = True
        if self.bar is not None:
            self.bar.update(1)

    def _fail_untold(self, item: _Asked) -> None:
        message = "interrupted: the sweep stopped before this trial was measured"
        try:
            item.trial.set_user_attr("interrupted", message)
            key = item.config.key() if item.config is not None else ""
            item.trial.set_user_attr(
                "result", EvalResult(item.number, key, item.phash, FAILED, message).to_json()
            )
            self.study.tell(item.trial, state=TrialState.FAIL)
        except Exception:  # the storage itself is gone: the next run fails it as stale
            pass
        self.driver.release(item.trial._trial_id)

    def _record_interrupted(self, trial: FrozenTrial) -> None:
        """The failure record of a trial a dead driver left RUNNING."""
        config = trial.user_attrs.get("config")
        key = FusionConfig.from_json(config).key() if isinstance(config, Mapping) else ""
        message = "interrupted: the driver stopped before this trial was recorded"
        result = EvalResult(
            trial.number, key, str(trial.user_attrs.get("program_hash", "")), FAILED, message
        )
        self.study._storage.set_trial_user_attr(trial._trial_id, "result", result.to_json())

    # ---- baselines and history ----------------------------------------------------------------
    def _enqueue_baselines(self) -> None:
        """Enqueue the registry defaults and all-off, unless the study already has them.

        A baseline is enqueued again only when every earlier attempt was interrupted, so that a
        sweep killed during its first batch still gets its reference points.
        """
        trials = self.study.get_trials(deepcopy=False)
        for role, params in baseline_params(self.space).items():  # defaults, then all_off
            attempts = [t for t in trials if t.user_attrs.get("role") == role]
            if all(t.state == TrialState.FAIL and "interrupted" in t.user_attrs for t in attempts):
                self.study.enqueue_trial(params, user_attrs={"role": role})

    def _load_history(self) -> None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            phash = t.user_attrs.get("program_hash")
            record = t.user_attrs.get("result")
            if not phash or not isinstance(record, Mapping) or record.get("status") == FAILED:
                continue
            result = EvalResult.from_json(record)
            self.measured.setdefault(
                phash, (int(t.user_attrs.get("reused_from", t.number)), result)
            )
            if is_feasible(t) and (self.best is None or result.median_s < self.best[0]):
                self.best = (result.median_s, t.number)

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
