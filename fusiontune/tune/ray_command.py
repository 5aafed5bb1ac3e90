"""RayCommandEvaluator: the user's job, run by Ray tasks on the workers' nodes.

Each request becomes one Ray task that runs :func:`fusiontune.tune.command.run_command_trial`
where Ray places it: the job, its time limit and its process-group kill all happen on that node,
and only the result travels back. A task holds one unit of the node's measure slot
(:data:`~fusiontune.tune._ray_worker.MEASURE_SLOT`), so a node runs as many jobs at once as it
registered units: one by default (a local cluster registers one), as many as it has devices if
it was started with ``ray start --resources='{"fusiontune_measure_slot": 8}'``.

A request pinned to a node (``EvalRequest.node``, a Ray node id as :meth:`RayCommandEvaluator.nodes`
lists it) runs there; a task whose node is gone, or that is lost with its node, is a ``worker
died`` failure, and one that never answers a ``timeout``.

Trial folders use the driver's absolute paths (``results/<study>/trials/<n>/``): on a cluster,
each node writes them on its own disk unless the folder is shared. The job's command, working
directory and files must exist at the same paths on every node.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from fusiontune.errors import UserError
from fusiontune.tune._job_output import refuse_bad_metrics
from fusiontune.tune._job_process import TERM_GRACE_S
from fusiontune.tune._ray_cluster import measuring_nodes, start_ray, stop_ray
from fusiontune.tune._ray_worker import MEASURE_SLOT, import_ray, one_line
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.workloads.target import CommandTarget

_MARGIN_S = 120.0  # beyond the job's own limits, before the driver gives up on a task


def run_on_node(
    target: CommandTarget, request: EvalRequest, trial_dir: str, term_grace_s: float
) -> EvalResult:
    """Body of the Ray task: run the trial here, name the node it ran on."""
    import ray

    from fusiontune.tune.command import run_command_trial

    node = ray.get_runtime_context().get_node_id()
    return run_command_trial(target, request, trial_dir, node=node, term_grace_s=term_grace_s)


@cache
def _trial_task() -> Any:
    ray = import_ray()
    return ray.remote(num_cpus=1, resources={MEASURE_SLOT: 1}, max_retries=0)(run_on_node)


class RayCommandEvaluator:
    """Runs each request's job as a Ray task on a worker node.

    Args:
        target: the job.
        base_dir: trial folders go to ``base_dir/<trial>/`` (made absolute here).
        workers: the batch size the tuning loop sends at once; also the CPUs of a local cluster.
        address: None starts Ray locally; ``HOST:PORT`` joins a cluster.
        term_grace_s: seconds between SIGTERM and SIGKILL on a timeout.

    Raises:
        UserError: the cluster cannot be reached, or no node has the measure slot.
    """

    def __init__(
        self,
        target: CommandTarget,
        base_dir: str | os.PathLike[str],
        workers: int,
        address: str | None = None,
        term_grace_s: float = TERM_GRACE_S,
    ) -> None:
        if workers < 1:
            raise UserError(f"--workers {workers}: Ray needs at least 1 (0 runs the job here)")
        self.target = target
        self.base_dir = Path(base_dir).resolve()
        self.workers = workers
        self.term_grace_s = term_grace_s
        self._ray = import_ray()
        self._owns_ray = start_ray(address, workers)
        if not self.nodes():
            self.close()
            raise UserError(
                f"no node of the Ray cluster has the {MEASURE_SLOT} resource: start each node with "
                f"`ray start ... --resources='{{\"{MEASURE_SLOT}\": 1}}'`"
            )

    def nodes(self) -> list[str]:
        """The nodes that run jobs: the Ray node id of every alive node with the measure slot.

        Each id is what ``EvalResult.node`` records for a job run there, and what
        ``EvalRequest.node`` takes to pin a request to that node.
        """
        return sorted(measuring_nodes())

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """One result per request, in order; a task that is lost or overruns is a failed result."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        task = _trial_task()
        nodes = set(self.nodes()) if any(r.node for r in requests) else set()
        refs: list[Any] = []
        for r in requests:
            if r.node and r.node not in nodes:
                refs.append(None)
                continue
            pinned = task
            if r.node:
                # soft=False: a node that leaves fails the task instead of moving it elsewhere
                strategy = NodeAffinitySchedulingStrategy(r.node, soft=False)
                pinned = task.options(scheduling_strategy=strategy)
            trial_dir = str(self.base_dir / (r.folder_name() or f"run-{r.trial}"))
            refs.append(pinned.remote(self.target, r, trial_dir, self.term_grace_s))
        per_task = (self.target.timeout_s + self.term_grace_s + 5.0) * self.target.repeats
        limit = per_task * max(1, len(requests)) + _MARGIN_S
        submitted = [ref for ref in refs if ref is not None]
        ready, _ = ray.wait(submitted, num_returns=len(submitted), timeout=limit)
        done = set(ready)
        out = []
        for ref, request in zip(refs, requests, strict=True):
            if ref is None:
                message = (
                    f"no node {request.node} with the {MEASURE_SLOT} resource in the Ray cluster"
                )
                failed = EvalResult.failure(
                    request.trial,
                    request.config,
                    message,
                    request.node,
                    status=EvalStatus.WORKER_DIED,
                )
                out.append(failed)
                continue
            if ref not in done:
                ray.cancel(ref, force=True)
                message = f"the Ray task did not answer within {limit:g} s"
                out.append(
                    EvalResult.failure(
                        request.trial,
                        request.config,
                        message,
                        request.node,
                        status=EvalStatus.TIMEOUT,
                    )
                )
                continue
            try:
                # Checked again here: the node may run another fusiontune, with a laxer reader.
                out.append(refuse_bad_metrics(ray.get(ref)))
            except ray.exceptions.RayError as exc:
                where = f" on node {request.node}" if request.node else ""
                failed = EvalResult.failure(
                    request.trial,
                    request.config,
                    f"worker died{where}: {one_line(exc)}",
                    request.node,
                    status=EvalStatus.WORKER_DIED,
                )
                trial_dir = str(self.base_dir / (request.folder_name() or f"run-{request.trial}"))
                out.append(dataclasses.replace(failed, extra={"trial_dir": trial_dir}))
        return out

    def close(self) -> None:
        """Shut Ray down if this evaluator started it (idempotent)."""
        if self._owns_ray:
            stop_ray()
        self._owns_ray = False

    def __enter__(self) -> RayCommandEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
