"""Records of the tuning loop: what an evaluator is asked, and what it answers.

Errors that belong to one candidate (a kernel that fails to compile, a worker that dies, a
timeout, a wrong result) are values here (``status`` and ``error_msg``), never exceptions that stop
a sweep.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fusiontune.config.fusion_config import FusionConfig


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
FAILED = EvalStatus.RUN_FAILED


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
    """

    trial: int
    config: FusionConfig
    deny: Deny = ()
    timing: bool = True
    applications: bool = False
    node: str = ""

    def key(self) -> str:
        return request_key(self.config, self.deny)

    def deny_map(self) -> dict[str, frozenset[int]]:
        return deny_map(self.deny)


@dataclass(frozen=True)
class EvalResult:
    """What measuring one configuration gave.

    Attributes:
        trial: the trial number of the request.
        config_key: ``FusionConfig.key()`` of the configuration.
        program_hash: hash of the generated program (kernel sources and their order); two
            configurations with the same hash run the same code.
        status: ``ok`` or ``failed``.
        error_msg: why it failed (with the log path where there is one); empty when ok.
        median_s, iqr_s, cv, min_s: timing of one run of the program, seconds.
        samples_s: every timed sample, seconds per call.
        errors: the error metrics against the float64 reference (max_abs, max_rel, rel_l2, cosine).
        kernels: kernels in the program.
        compile_s: seconds spent obtaining the kernels (compile or disk-cache load).
        peak_bytes: the program's planned peak memory.
        node: the machine (host name, or Ray node id) it was measured on.
        fusion: per pass, ``(matched_times, effected_times)``.
        applications: when the request asked, every application of every pass that ran:
            ``(pass, index, pattern, original node names, applied)``.
        extra: evaluator-specific fields (reuse of another trial's measurement, log paths).
    """

    trial: int
    config_key: str
    program_hash: str
    status: str
    error_msg: str = ""
    median_s: float = math.inf
    iqr_s: float = math.inf
    cv: float = math.inf
    min_s: float = math.inf
    samples_s: tuple[float, ...] = ()
    errors: Mapping[str, float] = field(default_factory=dict)
    kernels: int = 0
    compile_s: float = 0.0
    peak_bytes: int = 0
    node: str = ""
    fusion: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    applications: tuple[tuple[str, int, str, tuple[str, ...], bool], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def error(self, metric: str) -> float:
        """The named error metric; ``inf`` for a failed result."""
        return float(self.errors.get(metric, math.inf)) if self.ok else math.inf

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples_s"] = list(self.samples_s)
        d["errors"] = dict(self.errors)
        d["fusion"] = {k: list(v) for k, v in self.fusion.items()}
        d["applications"] = [[p, i, pat, list(nodes), ok] for p, i, pat, nodes, ok in self.applications]
        d["extra"] = dict(self.extra)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EvalResult:
        d = dict(d)
        d["samples_s"] = tuple(d.get("samples_s", ()))
        d["fusion"] = {k: (int(v[0]), int(v[1])) for k, v in dict(d.get("fusion", {})).items()}
        d["applications"] = tuple(
            (str(p), int(i), str(pat), tuple(nodes), bool(ok)) for p, i, pat, nodes, ok in d.get("applications", ())
        )
        return EvalResult(**d)

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
