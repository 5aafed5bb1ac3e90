"""RayEvaluator: a pool of Ray actors that build a batch in parallel, then measure one at a time per node.

TVM meta_schedule's builder / runner split, on Ray. A batch goes through rounds of two phases:

1. Build: every actor takes requests from one queue and fuses and compiles them (kernels go to the
   shared disk cache; the Program stays in the actor). Builds run in parallel, one per actor.
2. Measure: each built Program is checked against the reference and timed in the actor that
   built it, and at most one measurement runs on a node at a time, so measurements never share
   cores with each other or with builds.

The one-per-node rule is Ray's own resource accounting: every node that measures registers one
unit of the custom resource :data:`MEASURE_SLOT`, and a measurement is a small task that requires
that unit, is pinned to the actor's node, and calls the actor while it holds the unit. Ray queues
the tasks, so the rule holds across every driver sharing the cluster. Local mode registers the
slot itself; on a cluster each node must be started with it::

    ray start --head --resources='{"fusiontune_measure_slot": 1}'
    ray start --address=HEAD:6379 --resources='{"fusiontune_measure_slot": 1}'

Actors are placed only on alive nodes that have the slot. An actor that dies, or a request that
runs past ``trial_timeout_s``, fails that one request with the reason (``worker died`` naming its
node, or ``timeout``); the actor is replaced, the requests whose Programs it held are built again,
and the batch goes on. A node that leaves the cluster takes its actors with it: their requests in
flight fail as ``worker died``, their replacements go to the remaining nodes, and a batch that no
node is left to run fails at once, request by request, instead of waiting for one.

A request pinned to a node (``EvalRequest.node``, a Ray node id as :meth:`RayEvaluator.nodes`
lists it and ``EvalResult.node`` records it) is built and measured by an actor on that node; if
the pool has no actor there (the node left, or never had one), it fails at once as ``worker died``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusiontune.errors import UserError
from fusiontune.ir.training import TrainSpec
from fusiontune.measure import MeasureConfig
from fusiontune.tune._ray_cluster import measuring_nodes, start_ray, stop_ray
from fusiontune.tune._ray_worker import (
    MEASURE_SLOT,
    FaultHook,
    MeasureOutcome,
    TuneWorker,
    import_ray,
    measure_task,
    one_line,
    worker_actor,
)
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus

if TYPE_CHECKING:
    from fusiontune.workloads.onnx_model import OnnxSource

__all__ = ["MEASURE_SLOT", "FaultHook", "RayEvaluator", "TuneWorker", "start_ray"]

_MAX_START_FAILURES = 3
_MIN_MEASURE_LIMIT_S = 1.0


# ---- the evaluator -------------------------------------------------------------------------------
@dataclass
class _Slot:
    """One place in the pool: its current actor, the node it is pinned to, its start state."""

    index: int
    actor: Any = None
    node: str = ""
    host: str = ""
    starting: Any = None  # ObjectRef of info() until the actor is up
    failures: int = 0
    last_error: str = ""


class RayEvaluator:
    """Evaluates batches on a pool of Ray actors (see the module docstring for the protocol).

    Args:
        workload_name: a built-in workload, or an ONNX model (``OnnxSource``); each actor builds it once.
        sizes: its size parameters.
        measure: the timing protocol.
        workers: actors in the pool (one CPU each).
        address: None starts Ray locally with ``workers`` CPUs; ``HOST:PORT`` joins a cluster.
            If Ray is already initialized in this process, it is used as is.
        trial_timeout_s: limit on one request's own build plus measurement time (waiting for a
            free actor or measure slot does not count); the measurement gets at least 1 s.
        fault_hook: fault injection for tests, see :class:`FaultHook`.
        train: measure the workload's training step (each actor builds it) instead of its inference.

    Raises:
        UserError: the cluster cannot be reached, no node has the measure slot, or the workload
            cannot be built.
    """

    def __init__(
        self,
        workload_name: str | OnnxSource,
        sizes: Mapping[str, int],
        measure: MeasureConfig,
        workers: int,
        address: str | None = None,
        trial_timeout_s: float = 300.0,
        fault_hook: str | None = None,
        train: TrainSpec | None = None,
    ) -> None:
        if workers < 1:
            raise UserError(
                f"--workers {workers}: the Ray evaluator needs at least 1 (0 evaluates in process)"
            )
        if trial_timeout_s <= 0:
            raise ValueError(f"trial_timeout_s must be positive, got {trial_timeout_s}")
        self.workload_name = workload_name
        self.workers = workers
        self.sizes = dict(sizes)
        self.train = train
        self.measure = measure
        self.trial_timeout_s = float(trial_timeout_s)
        self.hook = FaultHook.parse(fault_hook)
        self._start_timeout_s = max(120.0, self.trial_timeout_s)
        self.replaced = 0
        self._ray = import_ray()
        self._token = 0
        self._slots: list[_Slot] = []
        self._owns_ray = start_ray(address, workers)
        try:
            if not self._slot_nodes():
                raise UserError(
                    f"no node of the Ray cluster has the {MEASURE_SLOT} resource: start each node with "
                    f"`ray start ... --resources='{{\"{MEASURE_SLOT}\": 1}}'`"
                )
            self._slots = [_Slot(i) for i in range(workers)]
            for slot in self._slots:
                self._start(slot)
            self._await_start(timeout_s=self._start_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- the protocol --------------------------------------------------------------------
    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """One result per request, in request order; a candidate's failure is a failed result."""
        alive = self._slot_nodes()
        for slot in self._slots:
            if slot.actor is None:  # dropped after failed starts: try again (a node may be back)
                slot.failures = 0
                self._start(slot)
            elif slot.node not in alive:  # its node left since the last batch: so did the actor
                self._replace(slot)
        results: list[EvalResult | None] = [None] * len(requests)
        todo = list(range(len(requests)))
        while todo:
            built, build_s = self._build(requests, todo, results)
            todo = self._measure(requests, built, build_s, results)
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Kill the actors; shut Ray down if this evaluator started it (idempotent)."""
        ray = self._ray
        if ray.is_initialized():
            for slot in self._slots:
                if slot.actor is not None:
                    ray.kill(slot.actor, no_restart=True)
        self._slots = []
        if self._owns_ray:
            stop_ray()
        self._owns_ray = False

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def nodes(self) -> list[str]:
        """The nodes that measure: the Ray node id of every alive node with an actor of the pool.

        Each id is what ``EvalResult.node`` records for a measurement there, and what
        ``EvalRequest.node`` takes to pin a request to that node; in pool order, each once.
        """
        alive = self._slot_nodes()
        return list(
            dict.fromkeys(s.node for s in self._slots if s.actor is not None and s.node in alive)
        )

    # ---- the pool ------------------------------------------------------------------------
    def _slot_nodes(self) -> dict[str, float]:
        """Alive nodes with a measure slot -> their CPUs."""
        return measuring_nodes()

    def _start(self, slot: _Slot) -> None:
        """Start an actor for ``slot`` on the slot node with the fewest actors per CPU."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self._slot_nodes()
        if not nodes:
            slot.actor, slot.starting = None, None
            slot.last_error = f"no alive node of the Ray cluster has the {MEASURE_SLOT} resource"
            return
        load = Counter(s.node for s in self._slots if s.actor is not None and s is not slot)
        node = min(nodes, key=lambda n: (load[n] / max(nodes[n], 1.0), n))
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        slot.actor = (
            worker_actor()
            .options(scheduling_strategy=strategy)
            .remote(self.workload_name, self.sizes, self.hook, self.train)
        )
        slot.node, slot.host = node, ""
        slot.starting = slot.actor.info.remote()

    def _replace(self, slot: _Slot) -> None:
        if slot.actor is not None:
            self._ray.kill(slot.actor, no_restart=True)
        self.replaced += 1
        self._start(slot)

    def _started(self, slot: _Slot) -> None:
        """Collect ``slot``'s start: ready, or retried, or dropped after repeated failures."""
        ray = self._ray
        ref, slot.starting = slot.starting, None
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError as exc:
            slot.failures += 1
            slot.last_error = f"worker could not start: {one_line(exc)}"
            if slot.failures < _MAX_START_FAILURES:
                self._start(slot)
            else:
                slot.actor = None
            return
        if info["error"]:
            raise UserError(info["error"])
        slot.node, slot.host, slot.failures = info["node"], info["host"], 0

    def _await_start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(s.starting is not None for s in self._slots):
            pending = {s.starting: s for s in self._slots if s.starting is not None}
            done, _ = self._ray.wait(
                list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not done:
                raise UserError(
                    f"{len(pending)} Ray worker(s) did not start within {timeout_s:g} s "
                    f"(cluster CPUs: {self._ray.cluster_resources().get('CPU', 0):g})"
                )
            self._started(pending[done[0]])
        if not any(s.actor is not None for s in self._slots):
            raise UserError(f"no Ray worker could be started: {self._slots[0].last_error}")

    def _fail(
        self,
        request: EvalRequest,
        slot: _Slot,
        message: str,
        status: EvalStatus,
        program_hash: str = "",
    ) -> EvalResult:
        failed = EvalResult.failure(
            request.trial, request.config, message, slot.node, program_hash, request.deny, status
        )
        return dataclasses.replace(failed, extra={"host": slot.host})

    def _died(self, request: EvalRequest, slot: _Slot, why: str) -> EvalResult:
        """The failure of a request whose actor died: on its node, or with its node."""
        if slot.node in self._slot_nodes():
            message = f"worker died on node {slot.node}: {why}"
        else:
            message = f"worker died: node {slot.node} left the Ray cluster ({why})"
        return self._fail(request, slot, message, EvalStatus.WORKER_DIED)

    def _unplaced(self, request: EvalRequest, message: str) -> EvalResult:
        """The failure of a request no actor can take (``request.node`` names its node, if any)."""
        return EvalResult.failure(
            request.trial,
            request.config,
            message,
            request.node,
            deny=request.deny,
            status=EvalStatus.WORKER_DIED,
        )

    def _drop_unplaceable(
        self, requests: Sequence[EvalRequest], queue: list[int], results: list[EvalResult | None]
    ) -> None:
        """Fail the queued requests pinned to a node where the pool has no actor (not even starting)."""
        pool = {s.node for s in self._slots if s.actor is not None}
        lost = [i for i in queue if requests[i].node and requests[i].node not in pool]
        if not lost:
            return
        alive = self._slot_nodes()
        for i in lost:
            node = requests[i].node
            where = "the pool has no actor there" if node in alive else "it left the Ray cluster"
            results[i] = self._unplaced(requests[i], f"no Ray worker on node {node}: {where}")
        queue[:] = [i for i in queue if i not in lost]

    # ---- phase 1: build ------------------------------------------------------------------
    def _build(
        self, requests: Sequence[EvalRequest], todo: list[int], results: list[EvalResult | None]
    ) -> tuple[dict[int, list[tuple[int, int]]], dict[int, float]]:
        """Build ``todo`` on idle actors. Returns per slot its built (request, token), and build times."""
        ray = self._ray
        queue = list(todo)
        built: dict[int, list[tuple[int, int]]] = {}
        build_s: dict[int, float] = {}
        running: dict[Any, tuple[_Slot, int, int, float]] = {}
        while True:
            self._drop_unplaceable(requests, queue, results)
            busy = {id(v[0]) for v in running.values()}
            for slot in self._slots:
                if slot.actor is None or slot.starting is not None or id(slot) in busy:
                    continue
                # the first queued request this actor may take: any, or one pinned to its node
                k = next(
                    (k for k, i in enumerate(queue) if requests[i].node in ("", slot.node)), None
                )
                if k is None:
                    continue
                i = queue.pop(k)
                self._token += 1
                ref = slot.actor.build.remote(self._token, requests[i])
                running[ref] = (slot, i, self._token, time.monotonic())
            if not queue and not running:
                break
            starting = {s.starting: s for s in self._slots if s.starting is not None}
            if not running and not starting:
                reason = next((s.last_error for s in self._slots if s.last_error), "no live actor")
                for i in queue:
                    results[i] = self._unplaced(requests[i], f"no Ray worker available: {reason}")
                break
            if running:
                deadline = min(t0 + self.trial_timeout_s for *_, t0 in running.values())
                timeout = max(0.0, deadline - time.monotonic())
            else:  # only actors starting (replacements): bounded, a start may never be scheduled
                timeout = self._start_timeout_s
            done, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=timeout)
            if not done and not running:
                for i in queue:
                    results[i] = self._unplaced(
                        requests[i],
                        f"no Ray worker started within {self._start_timeout_s:g} s",
                    )
                break
            for ref in done:
                if ref in starting:
                    self._started(starting[ref])
                    continue
                slot, i, token, t0 = running.pop(ref)
                try:
                    phash, _compile_s, error = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    results[i] = self._died(requests[i], slot, one_line(exc))
                    queue.extend(j for j, _ in built.pop(slot.index, []))
                    self._replace(slot)
                    continue
                if error:
                    results[i] = self._fail(
                        requests[i], slot, error, EvalStatus.BUILD_FAILED, phash
                    )
                else:
                    built.setdefault(slot.index, []).append((i, token))
                    build_s[i] = time.monotonic() - t0
            now = time.monotonic()
            for ref, (slot, i, _token, t0) in list(running.items()):
                if now - t0 >= self.trial_timeout_s:
                    del running[ref]
                    results[i] = self._fail(
                        requests[i],
                        slot,
                        f"timed out after {self.trial_timeout_s:g} s (build)",
                        EvalStatus.TIMEOUT,
                    )
                    queue.extend(j for j, _ in built.pop(slot.index, []))
                    self._replace(slot)
        return built, build_s

    # ---- phase 2: measure ----------------------------------------------------------------
    def _measure(
        self,
        requests: Sequence[EvalRequest],
        built: dict[int, list[tuple[int, int]]],
        build_s: dict[int, float],
        results: list[EvalResult | None],
    ) -> list[int]:
        """Measure every built Program in its actor under the node's slot; returns requests to rebuild."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        queues = {index: deque(items) for index, items in built.items()}
        rebuild: list[int] = []
        running: dict[Any, tuple[_Slot, int]] = {}
        while any(queues.values()) or running:
            busy = {id(slot) for slot, _ in running.values()}
            for index, queue in queues.items():
                slot = self._slots[index]
                if queue and id(slot) not in busy:
                    i, token = queue.popleft()
                    limit = max(_MIN_MEASURE_LIMIT_S, self.trial_timeout_s - build_s[i])
                    strategy = NodeAffinitySchedulingStrategy(slot.node, soft=False)
                    ref = (
                        measure_task()
                        .options(scheduling_strategy=strategy)
                        .remote(slot.actor, token, self.measure, limit)
                    )
                    running[ref] = (slot, i)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                slot, i = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the task itself was lost (node failure)
                    outcome = MeasureOutcome("died", message=one_line(exc))
                if outcome.status == "ok":
                    results[i] = outcome.result
                    continue
                if outcome.status == "timeout":
                    results[i] = self._fail(
                        requests[i],
                        slot,
                        f"timed out after {self.trial_timeout_s:g} s (measurement)",
                        EvalStatus.TIMEOUT,
                    )
                else:
                    results[i] = self._died(requests[i], slot, outcome.message)
                rebuild.extend(j for j, _ in queues[slot.index])
                queues[slot.index].clear()
                self._replace(slot)
        return rebuild
