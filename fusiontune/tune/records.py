"""Records of the tuning loop: what an evaluator is asked, and what it answers.

Errors that belong to one candidate (a kernel that fails to compile, a worker that dies, a
timeout, a wrong result) are values here (``status`` and ``error_msg``), never exceptions that stop
a sweep.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure.accuracy import METRICS, ErrorMetrics, metric_value
from fusiontune.passes.base import FusionReport


class EvalStatus(enum.StrEnum):
    """How the evaluation of one configuration ended; stored as its value (``"build failed"``).

    ``ok`` is the only status with a measurement. The others say where it went wrong: the pipeline
    or the kernel compile (``build failed``), running the program or the job (``run failed``), the
    trial's time limit (``timeout``), the worker process or its node (``worker died``), an output
    the reference disagrees with beyond any bound, NaN or a shape mismatch (``wrong result``), and
    a trial that no evaluator answered: a driver killed, a replay without the point
    (``not recorded``).
    """

    OK = "ok"
    BUILD_FAILED = "build failed"
    RUN_FAILED = "run failed"
    TIMEOUT = "timeout"
    WORKER_DIED = "worker died"
    WRONG_RESULT = "wrong result"
    NOT_RECORDED = "not recorded"

    @staticmethod
    def parse(value: object) -> EvalStatus:
        """The status stored as ``value``; the first version's ``"failed"`` reads as ``run failed``."""
        if value == "failed":
            return EvalStatus.RUN_FAILED
        return EvalStatus(str(value))


OK = EvalStatus.OK
RUN_FAILED = EvalStatus.RUN_FAILED


Deny = tuple[tuple[str, tuple[int, ...]], ...]


def normalize_deny(deny: Mapping[str, Iterable[int]] | Deny | None) -> Deny:
    """Denied applications as a sorted, hashable tuple ``((pass, (index, ...)), ...)``."""
    items = deny.items() if isinstance(deny, Mapping) else (deny or ())
    return tuple(sorted((str(p), tuple(sorted({int(i) for i in idx}))) for p, idx in items if idx))


def deny_map(deny: Deny) -> dict[str, frozenset[int]]:
    """Denied applications as the pipeline takes them: ``{pass: frozenset(index, ...)}``."""
    return {p: frozenset(idx) for p, idx in deny}


def request_key(config: FusionConfig, deny: Deny = ()) -> str:
    """The key of a configuration with some applications denied (``FusionConfig.key()`` if none)."""
    if not deny:
        return config.key()
    return config.key() + "|deny:" + ";".join(f"{p}=" + ",".join(map(str, idx)) for p, idx in deny)


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate one configuration (``trial`` is the optuna trial number, -1 outside a study).

    Attributes:
        trial: the optuna trial number, -1 outside a study.
        config: the configuration.
        deny: single applications to refuse, ``((pass, (index, ...)), ...)`` (bisection's second
            step switches off one fusion out of many); see :func:`normalize_deny`.
        timing: False to check accuracy only (bisection): the result has no times (NaN).
        applications: True to list every application the passes made in the result.
        node: measure on this node (its Ray node id or host name as ``EvalResult.node`` gives
            it); empty for any. The sweep pins its baseline measurements to each node so that
            every trial has a baseline from the node that measured it.
        label: names a request outside a study's trials (``trial`` -1), e.g. a baseline
            measurement ``baseline-<window>-<k>-defaults``: a command target's folder.
        race_against: the incumbent's runtimes (seconds): a command target stops repeating the
            job once its runs are clearly slower than these (:mod:`fusiontune.measure.racing`);
            empty: no race, every repeat runs.
        race_node: the node the incumbent was measured on; the race is run only on that node
            (another node's runtimes are not comparable). Empty: any node.
        race_bound: the accuracy bound; a command target stops repeating once a run's error is
            above it (the error is the maximum over the runs: it can only grow). ``inf``: never.
    """

    trial: int
    config: FusionConfig
    deny: Deny = ()
    timing: bool = True
    applications: bool = False
    node: str = ""
    label: str = ""
    race_against: tuple[float, ...] = ()
    race_node: str = ""
    race_bound: float = math.inf

    def key(self) -> str:
        return request_key(self.config, self.deny)

    def folder_name(self) -> str:
        """The trial's number, else its label, else "" (the caller numbers it)."""
        return str(self.trial) if self.trial >= 0 else self.label

    def deny_map(self) -> dict[str, frozenset[int]]:
        return deny_map(self.deny)


@dataclass(frozen=True)
class EvalResult:
    """What measuring one configuration gave.

    Attributes:
        trial: the trial number of the request (-1 for a baseline measurement).
        config_key: ``FusionConfig.key()`` of the configuration.
        program_hash: hash of the generated program (kernel sources and their order); two
            configurations with the same hash run the same code.
        status: how it ended (:class:`EvalStatus`); only ``ok`` has a measurement.
        error_msg: why it failed (with the log path where there is one); empty when ok.
        median_s, iqr_s, cv, min_s: timing of one run of the program, seconds.
        samples_s: every timed sample, seconds per call.
        ci_low_s, ci_high_s: the 95% confidence interval of the median (NaN when not computed).
        noisy: the spread stayed above the measurement's threshold after its retries
            (``MeasureConfig``): the median is not to be trusted.
        attempts: how many times it was measured (retries of a too-wide measurement included).
        runs: how many times a command target ran the job (0 for other evaluators).
        raced_out: the job's repeats stopped early: its runs were clearly slower than the
            incumbent's, or its error broke the bound (``extra["raced_out"]`` says which). The
            measurement stands: the median of the ``runs`` made.
        errors: the error metrics against the float64 reference; None for a failure or a
            command target.
        reported: what a command target's job reported (``error`` is its bounded metric).
        kernels: kernels in the program.
        compile_s: seconds spent obtaining the kernels (compile or disk-cache load).
        peak_bytes: the program's planned peak memory.
        node: the machine (host name, or Ray node id) it was measured on.
        fusion: what the passes did: per-pattern ``matched_times`` / ``effected_times``, and,
            when the request asked for them, every application.
        extra: evaluator-specific fields (log paths, measurement start and end).
    """

    trial: int
    config_key: str
    program_hash: str
    status: EvalStatus
    error_msg: str = ""
    median_s: float = math.inf
    iqr_s: float = math.inf
    cv: float = math.inf
    min_s: float = math.inf
    samples_s: tuple[float, ...] = ()
    ci_low_s: float = math.nan
    ci_high_s: float = math.nan
    noisy: bool = False
    attempts: int = 0
    runs: int = 0
    raced_out: bool = False
    errors: ErrorMetrics | None = None
    reported: Mapping[str, float] = field(default_factory=dict)
    kernels: int = 0
    compile_s: float = 0.0
    peak_bytes: int = 0
    node: str = ""
    fusion: FusionReport = field(default_factory=FusionReport.empty)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.status, EvalStatus):
            object.__setattr__(self, "status", EvalStatus.parse(self.status))

    @property
    def ok(self) -> bool:
        return self.status == EvalStatus.OK

    def error(self, metric: str) -> float:
        """The named error metric (one of ``METRICS``, or a job's reported one); ``inf`` if failed."""
        if not self.ok:
            return math.inf
        if self.errors is not None and metric in METRICS:
            return float(metric_value(self.errors, metric))
        return float(self.reported.get(metric, math.inf))

    def matched(self, pass_name: str) -> int:
        """How many times ``pass_name`` matched in the workload (0 when it never did)."""
        return self.fusion.matched(pass_name)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["samples_s"] = list(self.samples_s)
        d["errors"] = None if self.errors is None else asdict(self.errors)
        d["reported"] = dict(self.reported)
        d["fusion"] = self.fusion.to_json()
        d["extra"] = dict(self.extra)
        return {k: _finite_json(v) for k, v in d.items()}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EvalResult:
        """A result from :meth:`to_json`; the first version's records (flat dicts) read too."""
        d = dict(d)
        d["status"] = EvalStatus.parse(d.get("status", EvalStatus.NOT_RECORDED))
        for name in ("median_s", "iqr_s", "cv", "min_s"):
            d[name] = math.inf if d.get(name) is None else float(d[name])
        for name in ("ci_low_s", "ci_high_s"):
            d[name] = math.nan if d.get(name) is None else float(d[name])
        d["samples_s"] = tuple(float(x) for x in d.get("samples_s", ()))
        d["runs"] = int(d.get("runs") or 0)
        d["raced_out"] = bool(d.get("raced_out", False))
        errors = d.get("errors") or {}
        reported = dict(d.get("reported") or {})
        if errors and all(m in errors for m in METRICS):
            finite = errors.get("finite", all(math.isfinite(float(errors[m])) for m in METRICS))
            d["errors"] = ErrorMetrics(*(float(errors[m]) for m in METRICS), bool(finite))
        else:  # a command target's first-version record: {"error": x}
            reported.update({k: float(v) for k, v in errors.items()})
            d["errors"] = None
        d["reported"] = reported
        d["fusion"] = FusionReport.from_json(d.get("fusion"), d.pop("applications", ()))
        known = {f.name for f in fields(EvalResult)}
        return EvalResult(**{k: v for k, v in d.items() if k in known})

    @staticmethod
    def failure(
        trial: int,
        config: FusionConfig,
        message: str,
        node: str = "",
        program_hash: str = "",
        deny: Deny = (),
        status: EvalStatus = EvalStatus.RUN_FAILED,
    ) -> EvalResult:
        return EvalResult(trial, request_key(config, deny), program_hash, status, message, node=node)


def _finite_json(value: Any) -> Any:
    """``inf`` / ``NaN`` as None: JSON (and PostgreSQL's JSON) has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
