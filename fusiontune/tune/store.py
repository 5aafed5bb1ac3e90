"""The study store: the one module that reads and writes fusiontune's records in optuna's storage.

Everything else (the tuning loop, the confirmation, replay, bisection's probes, the reports, the
tests) reads and writes typed records through :class:`StudyStore`; nothing else touches optuna's
user attrs. The storage is optuna's own RDB storage, so ``optuna-dashboard <url>`` opens a study
as is and shows every attr below.

The schema
----------
Trial parameters: ``pass.<Pass>`` ("off" / "on") and ``split.<Pass>.<point>`` (int), categorical.
Trial values: ``[median_s]``, or ``[median_s, error]`` for NSGA-II; all minimized.

Trial system attrs: ``constraints`` (``[error - bound]``, where optuna's ``constraints_func``
keeps it, for every sampler), ``fusiontune:driver`` and ``fusiontune:heartbeat`` (who runs the
trial, and when it last said it is alive: :mod:`fusiontune.tune._storage`).

Trial user attrs (:class:`TrialRecord`):

- ``config``: ``FusionConfig.to_json()``, the resolved configuration;
- ``program_hash``: the hash of the program it compiles to (the key of measurement reuse);
- ``role``: ``defaults`` / ``all_off`` (the enqueued baselines), ``only:<Pass>``; absent for
  sampled trials;
- ``result``: ``EvalResult.to_json()`` (failures too);
- ``constraint``: ``error - bound`` (feasible when <= 0);
- ``reused_from``: the trial whose measurement this one took (same program);
- ``baseline``: the id of the :class:`Baseline` measurement its speedups are computed against:
  the one taken in the same window on the same node as the measurement;
- ``interrupted``: why a trial in flight was failed (its driver stopped or died).

Study user attrs:

- :class:`StudyInfo`, one attr per field (``space_path``, ``space_toml``, ``workload``,
  ``sizes``, ``metric``, ``bound``, ``sampler``, ``machine``, ``target``);
- ``baseline:<id>``: one :class:`Baseline` measurement of the defaults and all-off (every driver
  writes its own keys, so concurrent drivers never overwrite each other);
- ``confirmation``: the :class:`Confirmation` of the study's best configurations;
- ``recommendation``: the :class:`Recommendation`, the configuration every table ranks first and
  the report writes as ``fusion_switch.cfg`` (what a dashboard user sees as the winner, beside
  optuna's own "best trial", which is only the fastest sweep measurement).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.tune._storage import Driver, driver_alive, study_lock
from fusiontune.tune.records import EvalResult, EvalStatus

# Trial user attrs.
CONFIG = "config"
PROGRAM_HASH = "program_hash"
ROLE = "role"
RESULT = "result"
CONSTRAINT = "constraint"
REUSED_FROM = "reused_from"
BASELINE = "baseline"
INTERRUPTED = "interrupted"
CONSTRAINTS = "constraints"  # trial system attr, where optuna's constraints_func results go
# Study user attrs.
CONFIRMATION = "confirmation"
RECOMMENDATION = "recommendation"
BASELINE_PREFIX = "baseline:"

DEFAULTS = "defaults"
ALL_OFF = "all_off"
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


# ---- records -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudyInfo:
    """What a study was made from, set once when it is created.

    Attributes:
        space_path: the search space file.
        space_toml: its text, so a report shows it when the file has changed or gone.
        workload: the built-in workload or ONNX model.
        sizes: the workload's sizes.
        metric: the bounded error metric.
        bound: the accuracy bound.
        sampler: the sampler's name.
        machine: the driver's machine (``measure.machine_info()``).
        target: a command target's ``CommandTarget.to_json()``, None for a built-in workload.
    """

    space_path: str = ""
    space_toml: str = ""
    workload: str = ""
    sizes: Mapping[str, int] = field(default_factory=dict)
    metric: str = "max_rel"
    bound: float = math.nan
    sampler: str = ""
    machine: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.target is None:
            del d["target"]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StudyInfo:
        target = d.get("target")
        bound = d.get("bound")
        return StudyInfo(
            space_path=str(d.get("space_path", "")),
            space_toml=str(d.get("space_toml", "")),
            workload=str(d.get("workload", "")),
            sizes=dict(d.get("sizes") or {}),
            metric=str(d.get("metric", "max_rel")),
            bound=math.nan if bound is None else float(bound),
            sampler=str(d.get("sampler", "")),
            machine=dict(d.get("machine") or {}),
            target=dict(target) if isinstance(target, Mapping) else None,
        )


@dataclass(frozen=True)
class TrialRecord:
    """One trial as fusiontune wrote it (the trial user attrs of the module docstring).

    Attributes:
        number: optuna's trial number.
        state: optuna's state name (``COMPLETE``, ``FAIL``, ``RUNNING``, ``WAITING``, ``PRUNED``).
        params: the searched parameters.
        role: ``defaults``, ``all_off``, ``only:<Pass>``, or empty for a sampled trial.
        config: the resolved configuration (None when the parameters did not resolve).
        program_hash: the program it compiles to.
        result: its evaluation (None when none was recorded).
        constraint: ``error - bound`` (None when not measured).
        reused_from: the trial whose measurement it took.
        baseline: the id of the :class:`Baseline` its speedups are against.
        interrupted: why it was failed while in flight, empty otherwise.
        values: optuna's objective values.
        datetime_start, datetime_complete: optuna's times.
    """

    number: int
    state: str
    params: Mapping[str, Any] = field(default_factory=dict)
    role: str = ""
    config: FusionConfig | None = None
    program_hash: str = ""
    result: EvalResult | None = None
    constraint: float | None = None
    reused_from: int | None = None
    baseline: str = ""
    interrupted: str = ""
    values: tuple[float, ...] = ()
    datetime_start: datetime | None = None
    datetime_complete: datetime | None = None

    @property
    def status(self) -> EvalStatus:
        return self.result.status if self.result is not None else EvalStatus.NOT_RECORDED

    @property
    def measured(self) -> bool:
        """COMPLETE with a successful measurement."""
        return self.state == "COMPLETE" and self.result is not None and self.result.ok

    @property
    def feasible(self) -> bool:
        """Measured, and its error within the bound."""
        return self.measured and self.constraint is not None and self.constraint <= 0

    @property
    def median_s(self) -> float:
        return self.result.median_s if self.measured and self.result is not None else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "params": dict(self.params),
            ROLE: self.role,
            CONFIG: None if self.config is None else self.config.to_json(),
            PROGRAM_HASH: self.program_hash,
            RESULT: None if self.result is None else self.result.to_json(),
            CONSTRAINT: self.constraint,
            REUSED_FROM: self.reused_from,
            BASELINE: self.baseline,
            INTERRUPTED: self.interrupted,
            "values": list(self.values),
            "datetime_start": _iso(self.datetime_start),
            "datetime_complete": _iso(self.datetime_complete),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TrialRecord:
        return TrialRecord(
            number=int(d["number"]),
            state=str(d.get("state", "COMPLETE")),
            params=dict(d.get("params") or {}),
            role=str(d.get(ROLE) or ""),
            config=FusionConfig.from_json(d[CONFIG]) if d.get(CONFIG) else None,
            program_hash=str(d.get(PROGRAM_HASH) or ""),
            result=EvalResult.from_json(d[RESULT]) if d.get(RESULT) else None,
            constraint=None if d.get(CONSTRAINT) is None else float(d[CONSTRAINT]),
            reused_from=None if d.get(REUSED_FROM) is None else int(d[REUSED_FROM]),
            baseline=str(d.get(BASELINE) or ""),
            interrupted=str(d.get(INTERRUPTED) or ""),
            values=tuple(float(v) for v in d.get("values") or ()),
            datetime_start=_from_iso(d.get("datetime_start")),
            datetime_complete=_from_iso(d.get("datetime_complete")),
        )

    @staticmethod
    def from_trial(t: FrozenTrial) -> TrialRecord:
        """The record of an optuna trial (the module docstring's user attrs)."""
        ua = t.user_attrs
        config = ua.get(CONFIG)
        result = ua.get(RESULT)
        constraint = ua.get(CONSTRAINT)
        if constraint is None and t.system_attrs.get(CONSTRAINTS):
            constraint = max(float(c) for c in t.system_attrs[CONSTRAINTS])
        reused = ua.get(REUSED_FROM)
        return TrialRecord(
            number=t.number,
            state=t.state.name,
            params=dict(t.params),
            role=str(ua.get(ROLE) or ""),
            config=FusionConfig.from_json(config, source=f"trial {t.number} config")
            if isinstance(config, Mapping)
            else None,
            program_hash=str(ua.get(PROGRAM_HASH) or (result or {}).get(PROGRAM_HASH, "") or ""),
            result=EvalResult.from_json(result) if isinstance(result, Mapping) else None,
            constraint=None if constraint is None else float(constraint),
            reused_from=None if reused is None else int(reused),
            baseline=str(ua.get(BASELINE) or ""),
            interrupted=str(ua.get(INTERRUPTED) or ""),
            values=tuple(t.values or ()),
            datetime_start=t.datetime_start,
            datetime_complete=t.datetime_complete,
        )


@dataclass(frozen=True)
class Baseline:
    """One measurement of the defaults and all-off: what speedups in one window are against.

    A window is one driver's run over the study (a session: the sweep, or its resumption); the
    driver measures the baselines on every node when it starts, and again every
    ``baseline_every`` trials or ``baseline_minutes`` minutes, so drift is tracked.

    Attributes:
        id: ``<window>-<seq>``, unique in the study.
        window: the driver run that measured it.
        node: the node it was measured on.
        time: when (seconds since the epoch).
        finished: the study's finished trials when it was measured.
        defaults: the measurement of the registry defaults.
        all_off: the measurement of every switchable pass off.
    """

    id: str
    window: str
    node: str
    time: float
    finished: int
    defaults: EvalResult
    all_off: EvalResult

    @property
    def defaults_s(self) -> float:
        return self.defaults.median_s if self.defaults.ok else math.nan

    @property
    def all_off_s(self) -> float:
        return self.all_off.median_s if self.all_off.ok else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "window": self.window,
            "node": self.node,
            "time": self.time,
            "finished": self.finished,
            DEFAULTS: self.defaults.to_json(),
            ALL_OFF: self.all_off.to_json(),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Baseline:
        return Baseline(
            str(d["id"]),
            str(d.get("window", "")),
            str(d.get("node", "")),
            float(d.get("time", 0.0)),
            int(d.get("finished", 0)),
            EvalResult.from_json(d[DEFAULTS]),
            EvalResult.from_json(d[ALL_OFF]),
        )


@dataclass(frozen=True)
class ConfirmationRow:
    """One configuration measured again by the confirmation stage.

    Attributes:
        trial: the sweep's trial.
        config_key: its configuration.
        role: the trial's role (``defaults`` ...).
        median_s: the median of its confirmation samples.
        ci_low_s, ci_high_s: the 95% confidence interval of that median.
        samples: how many samples.
        error: the bounded error measured again (None when not finite).
        feasible: within the bound here too.
        noisy: the spread stayed too wide after the retries (the measurement's threshold).
        noise: that, in one line.
    """

    trial: int
    config_key: str
    role: str
    median_s: float
    ci_low_s: float
    ci_high_s: float
    samples: int
    error: float | None
    feasible: bool
    noisy: bool = False
    noise: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ConfirmationRow:
        return ConfirmationRow(
            int(d["trial"]),
            str(d.get("config_key", "")),
            str(d.get("role") or ""),
            float(d["median_s"]),
            float(d.get("ci_low_s", math.nan)),
            float(d.get("ci_high_s", math.nan)),
            int(d.get("samples", 0)),
            None if d.get("error") is None else float(d["error"]),
            bool(d.get("feasible", True)),
            bool(d.get("noisy", False)),
            str(d.get("noise") or ""),
        )


@dataclass(frozen=True)
class Confirmation:
    """The confirmation stage: the best configurations and the defaults, measured again together.

    Attributes:
        rows: the configurations, fastest confirmed median first.
        defaults_trial: the defaults' trial (None when the defaults did not complete).
        winner_trial: the trial recommended over the defaults, None when none is distinguishable.
        distinguishable: a winner was named.
        note: one sentence saying why.
        node: where it was measured (all on one node, in one process).
        time: when (seconds since the epoch).
        finished: the study's finished trials when it was taken: a confirmation of fewer trials
            than the study has now is out of date.
    """

    rows: tuple[ConfirmationRow, ...]
    defaults_trial: int | None
    winner_trial: int | None
    distinguishable: bool
    note: str
    node: str = ""
    time: float = 0.0
    finished: int = -1

    def row(self, trial: int) -> ConfirmationRow | None:
        return next((r for r in self.rows if r.trial == trial), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [r.to_json() for r in self.rows]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Confirmation:
        rows = tuple(ConfirmationRow.from_json(r) for r in d.get("rows") or ())
        defaults, winner = d.get("defaults_trial"), d.get("winner_trial")
        return Confirmation(
            tuple(sorted(rows, key=lambda r: (r.median_s, r.trial))),
            None if defaults is None else int(defaults),
            None if winner is None else int(winner),
            bool(d.get("distinguishable", False)),
            str(d.get("note", "")),
            str(d.get("node", "")),
            float(d.get("time", 0.0)),
            int(d.get("finished", -1)),
        )


@dataclass(frozen=True)
class Recommendation:
    """The configuration the study recommends, as the report wrote it.

    Attributes:
        trial: the trial (None when nothing is feasible, or the defaults have no trial).
        config_key: its configuration.
        source: ``confirmation`` (the winner, or the defaults when nothing is distinguishable)
            or ``sweep`` (no confirmation yet: the first of the ranking).
        reason: one sentence.
    """

    trial: int | None
    config_key: str
    source: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Recommendation:
        trial = d.get("trial")
        return Recommendation(
            None if trial is None else int(trial),
            str(d.get("config_key", "")),
            str(d.get("source", "")),
            str(d.get("reason", "")),
        )


# ---- the store ---------------------------------------------------------------------------------
class StudyStore:
    """Typed reads and writes of one optuna study.

    Args:
        study: the optuna study (created or loaded by the caller).
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self._storage = study._storage
        self._study_id = study._study_id

    @property
    def name(self) -> str:
        return self.study.study_name

    # ---- the study -----------------------------------------------------------------------------
    def info(self) -> StudyInfo:
        return StudyInfo.from_json(self.study.user_attrs)

    def has_info(self) -> bool:
        return "space_toml" in self.study.user_attrs

    def write_info(self, info: StudyInfo) -> None:
        for key, value in info.to_json().items():
            self._storage.set_study_user_attr(self._study_id, key, value)

    def baselines(self) -> list[Baseline]:
        """Every baseline measurement of the study, oldest first."""
        found = [
            Baseline.from_json(v)
            for k, v in self.study.user_attrs.items()
            if k.startswith(BASELINE_PREFIX) and isinstance(v, Mapping)
        ]
        return sorted(found, key=lambda b: (b.time, b.id))

    def add_baseline(self, baseline: Baseline) -> None:
        self._storage.set_study_user_attr(
            self._study_id, BASELINE_PREFIX + baseline.id, baseline.to_json()
        )

    def confirmation(self) -> Confirmation | None:
        data = self.study.user_attrs.get(CONFIRMATION)
        return Confirmation.from_json(data) if isinstance(data, Mapping) else None

    def write_confirmation(self, confirmation: Confirmation) -> None:
        self._storage.set_study_user_attr(self._study_id, CONFIRMATION, confirmation.to_json())

    def recommendation(self) -> Recommendation | None:
        data = self.study.user_attrs.get(RECOMMENDATION)
        return Recommendation.from_json(data) if isinstance(data, Mapping) else None

    def write_recommendation(self, recommendation: Recommendation) -> None:
        """Record the recommendation where optuna-dashboard shows it (a study user attr)."""
        if self.recommendation() != recommendation:
            self._storage.set_study_user_attr(
                self._study_id, RECOMMENDATION, recommendation.to_json()
            )

    # ---- trials --------------------------------------------------------------------------------
    def trials(self, states: Sequence[TrialState] | None = None) -> list[TrialRecord]:
        """The trials as records, by number."""
        found = self.study.get_trials(deepcopy=False, states=tuple(states) if states else None)
        return [TrialRecord.from_trial(t) for t in sorted(found, key=lambda t: t.number)]

    def trial(self, number: int) -> TrialRecord:
        return TrialRecord.from_trial(self.study.trials[number])

    def count_finished(self) -> int:
        """Trials that count against the budget: COMPLETE, FAIL and PRUNED."""
        return len(self.study.get_trials(deepcopy=False, states=FINISHED))

    def count_taken(self) -> int:
        """Finished trials plus those running: the part of the budget already given out."""
        states = (*FINISHED, TrialState.RUNNING)
        return len(self.study.get_trials(deepcopy=False, states=states))

    def running(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    def roles(self) -> dict[str, list[FrozenTrial]]:
        """Trials by role (enqueued or asked), every state."""
        out: dict[str, list[FrozenTrial]] = {}
        for t in self.study.get_trials(deepcopy=False):
            role = t.user_attrs.get(ROLE)
            if role:
                out.setdefault(str(role), []).append(t)
        return out

    def enqueue(self, params: Mapping[str, Any], role: str) -> None:
        self.study.enqueue_trial(dict(params), user_attrs={ROLE: role})

    def record_asked(self, trial: optuna.Trial, config: FusionConfig | None, phash: str) -> None:
        """What the driver knows of a trial before it is measured."""
        if config is not None:
            trial.set_user_attr(CONFIG, config.to_json())
            trial.set_user_attr(PROGRAM_HASH, phash)

    def record_result(
        self,
        trial: optuna.Trial,
        result: EvalResult,
        constraint: float | None,
        reused_from: int | None,
        baseline: str,
        write_constraints: bool,
    ) -> None:
        """Store a trial's evaluation before it is told (``tell`` then sets its state)."""
        trial.set_user_attr(RESULT, result.to_json())
        if reused_from is not None:
            trial.set_user_attr(REUSED_FROM, reused_from)
        if baseline:
            trial.set_user_attr(BASELINE, baseline)
        if constraint is not None:
            trial.set_user_attr(CONSTRAINT, constraint)
            if write_constraints:
                # What optuna stores for a sampler with constraints_func; the same for every trial.
                self._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS, [constraint])

    def record_interrupted(self, trial_id: int, result: EvalResult, why: str) -> None:
        self._storage.set_trial_user_attr(trial_id, INTERRUPTED, why)
        self._storage.set_trial_user_attr(trial_id, RESULT, result.to_json())

    def fail_stale_trials(self) -> list[int]:
        """Mark FAIL every RUNNING trial whose driver is dead; return their numbers.

        Call it holding :meth:`lock`: a driver asks and stamps its trials under the same lock,
        so an unstamped RUNNING trial seen here belongs to a driver that died in between.
        Each gets ``interrupted`` and a ``not recorded`` result.
        """
        failed: list[int] = []
        why = "interrupted: the driver stopped before this trial was recorded"
        for t in self.running():
            if driver_alive(t.system_attrs):
                continue
            config = t.user_attrs.get(CONFIG)
            key = FusionConfig.from_json(config).key() if isinstance(config, Mapping) else ""
            phash = str(t.user_attrs.get(PROGRAM_HASH, ""))
            result = EvalResult(t.number, key, phash, EvalStatus.NOT_RECORDED, why)
            try:
                self.record_interrupted(t._trial_id, result, why)
                self._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # its driver told it meanwhile
            failed.append(t.number)
        return failed

    @staticmethod
    @contextmanager
    def locked(storage: optuna.storages.BaseStorage, study_name: str) -> Iterator[None]:
        """The lock of study ``study_name`` before the study is opened (to create it)."""
        with study_lock(storage, study_name):
            yield

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The study's lock, across processes and machines (see ``_storage.study_lock``)."""
        with study_lock(self._storage, self.name):
            yield

    def new_driver(self) -> Driver:
        return Driver(self._storage)


def constraint_of(trial: FrozenTrial) -> tuple[float]:
    """A told trial's accuracy constraint ``(error - bound,)``: optuna's ``constraints_func``."""
    return (float(trial.user_attrs[CONSTRAINT]),)


def interrupted(trial: FrozenTrial) -> bool:
    """A trial failed because its driver stopped or died before recording it."""
    return trial.state == TrialState.FAIL and INTERRUPTED in trial.user_attrs


def speedups(records: Sequence[TrialRecord], baselines: Sequence[Baseline]) -> dict[int, tuple[float, float]]:
    """Each measured trial's speedup against the defaults and against all-off.

    Against the trial's own baseline (same window, same node); NaN when it has none. A study of
    the first version (no baseline records at all) falls back to its first measured defaults
    and all-off trials.
    """
    by_id = {b.id: b for b in baselines}
    legacy: tuple[float, float] | None = None
    if not by_id:
        first = {
            role: next((t.median_s for t in records if t.role == role and t.measured), math.nan)
            for role in (DEFAULTS, ALL_OFF)
        }
        legacy = (first[DEFAULTS], first[ALL_OFF])
    out: dict[int, tuple[float, float]] = {}
    for t in records:
        base = by_id.get(t.baseline)
        if base is not None:
            d, a = base.defaults_s, base.all_off_s
        elif legacy is not None:
            d, a = legacy
        else:
            d = a = math.nan
        median = t.median_s
        out[t.number] = (d / median, a / median) if t.measured and median > 0 else (math.nan, math.nan)
    return out


def baseline_for(baselines: Sequence[Baseline], window: str, node: str, before: float) -> Baseline | None:
    """The baseline a measurement is compared with: the latest of ``window`` on ``node`` taken
    before ``before``, else the latest of ``window`` on any node, else None."""
    mine = [b for b in baselines if b.window == window and b.time <= before]
    same_node = [b for b in mine if b.node == node]
    pool = same_node or mine
    return max(pool, key=lambda b: b.time) if pool else None


def now() -> float:
    return time.time()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def _from_iso(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None
