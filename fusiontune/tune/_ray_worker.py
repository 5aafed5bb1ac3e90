"""The actor side of the Ray evaluator: the worker actor, the measurement task, fault injection.

:class:`TuneWorker` is a plain class that :func:`worker_actor` turns into a ``ray.remote``
actor, and :func:`measure_under_slot` is the body of the task that holds a node's measure slot
while an actor measures. ``ray`` is imported where used, so importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.ir.training import TrainSpec
from fusiontune.measure import MeasureConfig
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import build_program
from fusiontune.tune.evaluate import Candidate, build_candidate, measure_candidate
from fusiontune.tune.records import EvalRequest, EvalResult

if TYPE_CHECKING:
    from fusiontune.workloads import Workload
    from fusiontune.workloads.onnx_model import OnnxSource

MEASURE_SLOT = "fusiontune_measure_slot"
"""The custom Ray resource that admits one measurement per node (each node registers 1)."""

_HANG_S = 3600.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # ray is a core dependency, but keep the message to one line
        raise UserError(f"the Ray evaluator needs ray: pip install 'ray>=2.30' ({exc})") from None
    return ray


def one_line(exc: BaseException) -> str:
    """A Ray error's first line plus the line that says why (Ray messages span many lines)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    # Ray appends a paragraph of generic advice ("Some common causes include: ...") to the why.
    why = [ln.split(" Some common causes")[0] for ln in lines[1:] if "because" in ln]
    return " ".join(lines[:1] + why[:1])[:300]


# ---- fault injection (tests) ---------------------------------------------------------------------
_HOOK_FORMS = {
    "kill_on_trial": ("kill", "measure"),
    "sleep_on_trial": ("sleep", "measure"),
    "kill_in_build_on_trial": ("kill", "build"),
    "sleep_in_build_on_trial": ("sleep", "build"),
}


@dataclass(frozen=True)
class FaultHook:
    """Faults a worker injects into itself, for tests: ``kill`` is ``os._exit(1)``, ``sleep`` a hang.

    Written as comma-separated ``FORM=TRIAL`` items, FORM one of ``kill_on_trial`` and
    ``sleep_on_trial`` (during the measurement, after the build and the correctness check),
    ``kill_in_build_on_trial`` and ``sleep_in_build_on_trial`` (during the build).

    Attributes:
        faults: ``(action, phase, trial)`` triples.
    """

    faults: tuple[tuple[str, str, int], ...] = ()

    @staticmethod
    def parse(text: str | None) -> FaultHook:
        """Parse ``"kill_on_trial=3,sleep_on_trial=5"``; None or "" is no fault.

        Raises:
            ValueError: an unknown form or a trial that is not an integer.
        """
        faults = []
        for item in (text or "").split(","):
            if not item.strip():
                continue
            form, _, value = item.partition("=")
            if form.strip() not in _HOOK_FORMS or not value.strip().lstrip("-").isdigit():
                raise ValueError(
                    f"fault hook {item!r}: expected one of {', '.join(_HOOK_FORMS)} =TRIAL"
                )
            faults.append((*_HOOK_FORMS[form.strip()], int(value)))
        return FaultHook(tuple(faults))

    def fire(self, phase: str, trial: int) -> None:
        """Kill or hang this process if a fault is set for ``trial`` in ``phase``."""
        for action, at, target in self.faults:
            if at == phase and target == trial:
                if action == "kill":
                    os._exit(1)
                time.sleep(_HANG_S)


# ---- the actor -----------------------------------------------------------------------------------
class TuneWorker:
    """One actor of the pool: the workload loaded once, a warm kernel cache, built Programs.

    Plain class; :func:`worker_actor` makes it a ``ray.remote(num_cpus=1)`` actor. Programs are
    kept by a driver-chosen token between :meth:`build` and :meth:`measure`.
    """

    def __init__(
        self,
        workload_name: str | OnnxSource,
        sizes: Mapping[str, int],
        hook: FaultHook,
        train: TrainSpec | None = None,
    ) -> None:
        import ray

        from fusiontune.workloads.onnx_model import load_workload

        context = ray.get_runtime_context()
        self.node = context.get_node_id()
        self.host = socket.gethostname()
        self.cpus = max(1, int(context.get_assigned_resources().get("CPU", 1.0)))
        self.hook = hook
        self.error = ""
        self.workload: Workload | None = None
        self._built: dict[int, tuple[EvalRequest, Candidate]] = {}
        self._limit_threads()
        try:
            # a built-in workload's name, or an OnnxSource (an ONNX space)
            self.workload = load_workload(workload_name, sizes, train)
        except UserError as exc:  # reported by info(); the driver raises it as one line
            self.error = str(exc)
            return
        self._warm_up()

    def _warm_up(self) -> None:
        """Build the registry defaults once, so a request's time limit never pays for warming up.

        The first Program of a process initializes numba's JIT and loads the defaults' kernels
        (every sweep evaluates the defaults first, so nothing here is wasted).
        """
        assert self.workload is not None
        try:
            build_program(run_pipeline(self.workload.graph, FusionConfig.defaults(), train=self.workload.train).fused)
        except Exception:  # the defaults' own failure is reported when they are requested
            pass

    def _limit_threads(self) -> None:
        # numba's thread count is per calling thread; set it before every entry point so that
        # actors sharing a node use their CPU share, not one thread per core each.
        import numba

        from fusiontune.codegen.cache import set_compile_jobs
        from fusiontune.codegen.threading_layer import set_num_threads

        set_num_threads(min(self.cpus, numba.config.NUMBA_NUM_THREADS))
        set_compile_jobs(self.cpus)

    def info(self) -> dict[str, Any]:
        """Where this actor runs, and the workload error if the workload could not be built."""
        return {
            "node": self.node,
            "host": self.host,
            "pid": os.getpid(),
            "cpus": self.cpus,
            "error": self.error,
        }

    def build(self, token: int, request: EvalRequest) -> tuple[str, float, str]:
        """Fuse and compile ``request.config``; keep the candidate under ``token``.

        Returns:
            ``(program_hash, compile_s, error)``; ``error`` is empty on success.
        """
        self._limit_threads()
        self._built.pop(token, None)
        self.hook.fire("build", request.trial)
        try:
            assert self.workload is not None, self.error
            candidate = build_candidate(self.workload, request.config, request.deny)
        except Exception as exc:  # a candidate's failure is a value
            return "", 0.0, traceback.format_exception_only(type(exc), exc)[-1].strip()
        self._built[token] = (request, candidate)
        return candidate.program_hash, candidate.program.compile_s, ""

    def measure(self, token: int, measure: MeasureConfig) -> EvalResult:
        """Check the candidate built under ``token`` against the reference, then time it.

        The measurement holds this node's measure slot, so no other measurement runs on the
        node: it uses every core, as the deployed model would, not the actor's build share.
        The result's ``extra`` has ``measure_start`` and ``measure_end``, the wall-clock times
        (``time.time()``) of this check and timing, inside the slot's hold.
        """
        import numba

        from fusiontune.codegen.threading_layer import set_num_threads, threading_layer

        set_num_threads(numba.config.NUMBA_NUM_THREADS)
        request, candidate = self._built.pop(token)
        assert self.workload is not None
        self.hook.fire("measure", request.trial)
        start = time.time()
        result = measure_candidate(
            self.workload,
            candidate,
            measure,
            request.trial,
            self.node,
            {
                "host": self.host,
                "threads": numba.config.NUMBA_NUM_THREADS,  # type: ignore[attr-defined]
                "threading_layer": threading_layer(),
            },
            timing=request.timing,
            applications=request.applications,
        )
        extra = {**result.extra, "measure_start": start, "measure_end": time.time()}
        self._limit_threads()
        return dataclasses.replace(result, extra=extra)


@dataclass(frozen=True)
class MeasureOutcome:
    """What a measurement task reports: ``ok`` with the result, ``timeout``, or ``died``."""

    status: str
    result: EvalResult | None = None
    message: str = ""


def measure_under_slot(
    actor: Any, token: int, measure: MeasureConfig, limit_s: float
) -> MeasureOutcome:
    """Body of the measurement task: holds the node's measure slot while ``actor`` measures.

    The time limit starts here, once the slot is held, so waiting for the slot never counts
    against a request. On timeout the actor is killed (a hung kernel cannot be interrupted).
    """
    import ray

    ref = actor.measure.remote(token, measure)
    # Wait, then get: a ray.get under the limit would also count unpickling the result, and the
    # first unpickling in a fresh task worker imports fusiontune (seconds on a loaded machine).
    done, _ = ray.wait([ref], timeout=limit_s)
    if not done:
        ray.kill(actor, no_restart=True)
        return MeasureOutcome("timeout")
    try:
        return MeasureOutcome("ok", ray.get(ref))
    except ray.exceptions.RayError as exc:
        return MeasureOutcome("died", message=one_line(exc))


@cache
def worker_actor() -> Any:
    ray = import_ray()
    return ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(TuneWorker)


@cache
def measure_task() -> Any:
    ray = import_ray()
    return ray.remote(num_cpus=0, resources={MEASURE_SLOT: 1}, max_retries=0)(measure_under_slot)
