"""RayEvaluator on several machines, simulated: a ``ray.cluster_utils.Cluster`` of real Ray nodes.

One cluster serves the module: a head node that measures nothing (no CPU, no measure slot) and two
measuring nodes of one CPU and one measure slot each, so each node holds one actor of a 2-worker
pool. Tests that remove a node add their own first; the last test removes every measuring node,
so it runs last. As in ``test_ray_evaluator``, the configurations are built in process first,
which warms the shared kernel disk cache the nodes' actors load from.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure import MeasureConfig
from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.ray_command import RayCommandEvaluator
from fusiontune.tune.ray_evaluator import MEASURE_SLOT, RayEvaluator, start_ray
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.tune.store import StudyStore
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import load_space

pytestmark = pytest.mark.ray

CUSTOM_OP = "mindspore_custom_op"
# Samples of ~20 ms: two measurements side by side on one node would overlap in time.
TIMED = MeasureConfig(warmup=1, number=1, repeat=3, min_repeat_ms=20)
# Measurements of >= 0.4 s: a node removed as a batch starts is removed before they end.
SLOW = MeasureConfig(warmup=0, number=1, repeat=2, min_repeat_ms=200)
NO_SUCH_NODE = "0123abcd" * 7  # a node id (56 hex digits) that no node of the cluster has
SPACES = Path(__file__).resolve().parents[2] / "search_spaces"

SPACE = """\
[workload]
name = "mindspore_custom_op"

[passes]
search = ["TbeEltwiseFusionPass", "CompositeOpsFusionPass", "TbeMultiOutputFusionPass", "TbeEltwiseSplitFusionPass"]

[split_points]
"TbeEltwiseSplitFusionPass.cut" = [0, 1, 2, 3]

[accuracy]
metric = "max_rel"
bound = 1e-6

[search]
sampler = "random"
seed = 0
"""


def _configs() -> list[FusionConfig]:
    """Four configurations of distinct programs on mindspore_custom_op (1 to 4 kernels)."""
    base = FusionConfig.defaults()
    return [
        base,
        FusionConfig.all_off(),
        base.with_switches(CompositeOpsFusionPass=False),
        base.with_splits(**{"TbeEltwiseSplitFusionPass.cut": 2}),
    ]


def _requests(first_trial: int, node: Sequence[str] = ("",)) -> list[EvalRequest]:
    """One request per configuration; request k pinned to ``node[k % len(node)]``."""
    return [
        EvalRequest(first_trial + k, c, node=node[k % len(node)]) for k, c in enumerate(_configs())
    ]


# ---- the cluster -----------------------------------------------------------------------------
@dataclass
class Machines:
    """The module's cluster and its measuring nodes (``ray._private.node.Node``)."""

    cluster: Any
    measuring: list[Any]

    def add_measuring_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, resources={MEASURE_SLOT: 1})
        self.cluster.wait_for_nodes()
        return node

    def ids(self) -> set[str]:
        return {n.node_id for n in self.measuring}


@pytest.fixture(scope="module")
def machines() -> Iterator[Machines]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process")
    LocalEvaluator(make_workload(CUSTOM_OP), TIMED).evaluate(_requests(0))  # warm the disk cache
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        cluster_nodes = Machines(cluster, [])
        cluster_nodes.measuring = [cluster_nodes.add_measuring_node() for _ in range(2)]
        assert start_ray(cluster.address)
        yield cluster_nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


# ---- two nodes, one measurement at a time on each --------------------------------------------
@dataclass
class TwoNodes:
    """What a 2-worker pool over the two measuring nodes answered."""

    nodes: list[str]
    free: list[EvalResult]  # 12 requests, unpinned
    pinned: list[EvalResult]  # 4 requests, pinned to nodes[0], nodes[1], nodes[0], nodes[1]
    stray: EvalResult  # a request pinned to a node that is not in the cluster
    stray_s: float


@pytest.fixture(scope="module")
def two_nodes(machines: Machines) -> TwoNodes:
    with RayEvaluator(CUSTOM_OP, {}, TIMED, workers=2) as evaluator:
        nodes = evaluator.nodes()
        free = evaluator.evaluate(_requests(0) + _requests(4) + _requests(8))
        pinned = evaluator.evaluate(_requests(20, node=nodes))
        t0 = time.monotonic()
        [stray] = evaluator.evaluate([EvalRequest(30, FusionConfig.defaults(), node=NO_SUCH_NODE)])
        stray_s = time.monotonic() - t0
    return TwoNodes(nodes, free, pinned, stray, stray_s)


def test_nodes_lists_each_measuring_node_once(machines: Machines, two_nodes: TwoNodes) -> None:
    assert sorted(two_nodes.nodes) == sorted(machines.ids())


def test_results_name_the_node_that_measured_them(machines: Machines, two_nodes: TwoNodes) -> None:
    assert [r.status for r in two_nodes.free] == [EvalStatus.OK] * 12
    # one identifier per node, the one nodes() lists: both nodes measured, nothing else did
    assert {r.node for r in two_nodes.free} == machines.ids()


def test_measurements_on_one_node_never_overlap(two_nodes: TwoNodes) -> None:
    for node in two_nodes.nodes:
        windows = sorted(
            (r.extra["measure_start"], r.extra["measure_end"])
            for r in two_nodes.free + two_nodes.pinned
            if r.node == node
        )
        assert len(windows) >= 2
        for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
            assert start >= end, f"two measurements on node {node} overlap"


def test_pinned_requests_are_measured_on_their_node(two_nodes: TwoNodes) -> None:
    nodes = two_nodes.nodes
    assert [r.status for r in two_nodes.pinned] == [EvalStatus.OK] * 4
    assert [r.node for r in two_nodes.pinned] == [nodes[0], nodes[1], nodes[0], nodes[1]]


def test_a_request_pinned_to_an_unknown_node_fails_at_once(two_nodes: TwoNodes) -> None:
    stray = two_nodes.stray
    assert stray.status == EvalStatus.WORKER_DIED
    assert stray.node == NO_SUCH_NODE and NO_SUCH_NODE in stray.error_msg
    assert two_nodes.stray_s < 5.0


# ---- a node removed in the middle of a batch -------------------------------------------------
@dataclass
class Removal:
    """A 3-worker pool over three nodes, one of which is removed while it builds a request."""

    victim: str
    before: list[str]  # evaluator.nodes() before the removal
    during: list[EvalResult]  # the batch in flight at the removal; request 0 on the victim
    after_nodes: list[str]
    after: list[EvalResult]  # the next batch: 4 unpinned requests, then one pinned to the victim
    after_s: float


def _remove_later(machines: Machines, node: Any, delay_s: float) -> threading.Thread:
    def remove() -> None:
        time.sleep(delay_s)
        machines.cluster.remove_node(node)

    thread = threading.Thread(target=remove, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def removal(machines: Machines, two_nodes: TwoNodes) -> Removal:
    victim = machines.add_measuring_node()
    # Trial 40 hangs in its build, on the victim it is pinned to, until the victim is removed.
    with RayEvaluator(
        CUSTOM_OP, {}, TIMED, workers=3, trial_timeout_s=60, fault_hook="sleep_in_build_on_trial=40"
    ) as evaluator:
        before = evaluator.nodes()
        remover = _remove_later(machines, victim, delay_s=1.0)
        during = evaluator.evaluate(_requests(40, node=[victim.node_id, "", "", ""]))
        remover.join()
        after_nodes = evaluator.nodes()
        t0 = time.monotonic()
        after = evaluator.evaluate(
            _requests(50) + [EvalRequest(54, FusionConfig.defaults(), node=victim.node_id)]
        )
        after_s = time.monotonic() - t0
    return Removal(victim.node_id, before, during, after_nodes, after, after_s)


def test_a_removed_node_fails_its_request_in_flight_as_worker_died(removal: Removal) -> None:
    lost = removal.during[0]
    assert removal.victim in removal.before
    assert lost.status == EvalStatus.WORKER_DIED
    assert lost.node == removal.victim and removal.victim in lost.error_msg


def test_a_removed_node_leaves_the_rest_of_its_batch_to_the_others(
    machines: Machines, removal: Removal
) -> None:
    assert [r.status for r in removal.during[1:]] == [EvalStatus.OK] * 3
    assert {r.node for r in removal.during[1:]} <= machines.ids()


def test_after_a_node_is_removed_batches_run_on_the_remaining_nodes(
    machines: Machines, removal: Removal
) -> None:
    assert sorted(removal.after_nodes) == sorted(machines.ids())
    assert [r.status for r in removal.after[:4]] == [EvalStatus.OK] * 4
    assert {r.node for r in removal.after[:4]} <= machines.ids()


def test_a_request_pinned_to_a_removed_node_fails_at_once(removal: Removal) -> None:
    pinned = removal.after[4]
    assert pinned.status == EvalStatus.WORKER_DIED
    assert pinned.node == removal.victim and removal.victim in pinned.error_msg
    assert removal.after_s < 10.0


# ---- a sweep that loses a node -----------------------------------------------------------------
class RemovesANode:
    """The Ray evaluator, with a node removed as the sweep's first batch of trials starts.

    The batch's first unpinned trial is pinned to the node (the node had taken it), so the node
    is removed while it holds that trial: building or measuring it (a measurement lasts 0.4 s).
    Requests the sweep pins itself (its baselines, one per node) go through as they are.
    """

    def __init__(self, inner: RayEvaluator, machines: Machines, node: Any) -> None:
        self.inner = inner
        self.machines = machines
        self.node = node
        self.calls: list[list[EvalRequest]] = []
        self.lost_trial: int | None = None
        self.removed_at = -1  # the call in which the node was removed

    @property
    def workers(self) -> int:
        return self.inner.workers

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        requests = list(requests)
        remover = None
        k = next((k for k, r in enumerate(requests) if not r.node and r.trial >= 0), None)
        if self.lost_trial is None and k is not None:
            requests[k] = dataclasses.replace(requests[k], node=self.node.node_id)
            self.lost_trial = requests[k].trial
            self.removed_at = len(self.calls)
            remover = _remove_later(self.machines, self.node, delay_s=0.0)
        self.calls.append(requests)
        try:
            return self.inner.evaluate(requests)
        finally:
            if remover is not None:
                remover.join()

    def close(self) -> None:
        self.inner.close()


def _told(url: str) -> dict[int, tuple[optuna.trial.TrialState, EvalResult]]:
    """Trial number -> its state and the result the sweep recorded."""
    study = optuna.load_study(study_name="s", storage=url)
    told = {}
    for t, record in zip(study.get_trials(deepcopy=False), StudyStore(study).trials(), strict=True):
        assert record.result is not None
        told[t.number] = (t.state, record.result)
    return told


def test_a_sweep_that_loses_a_node_fails_its_trials_and_finishes_on_the_rest(
    machines: Machines, removal: Removal, tmp_path: Path
) -> None:
    victim = machines.add_measuring_node()
    path = tmp_path / "space.toml"
    path.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with RayEvaluator(CUSTOM_OP, {}, SLOW, workers=3) as ray_evaluator:
        evaluator = RemovesANode(ray_evaluator, machines, victim)
        result = run_tune(load_space(path), evaluator, url, "s", 9, batch_size=3, progress=False)
    told = _told(url)
    assert result.n_finished == 9 and result.stopped_reason == "budget"
    assert evaluator.lost_trial is not None
    state, lost = told[evaluator.lost_trial]
    assert state == optuna.trial.TrialState.FAIL and lost.status == EvalStatus.WORKER_DIED
    assert victim.node_id in lost.error_msg
    # the node's trial is the only failure, and every later batch ran on the remaining nodes
    failed = [n for n, (s, _) in told.items() if s != optuna.trial.TrialState.COMPLETE]
    assert failed == [evaluator.lost_trial]
    later = [r.trial for batch in evaluator.calls[evaluator.removed_at + 1 :] for r in batch]
    assert later and {told[n][1].node for n in later} <= machines.ids()


# ---- the user's job, pinned ------------------------------------------------------------------
def test_command_trials_pinned_to_a_node_run_there(
    machines: Machines, removal: Removal, tmp_path: Path
) -> None:
    text = (SPACES / "cann_atc_template.toml").read_text()
    path = tmp_path / "job.toml"
    path.write_text(re.sub(r'^workdir = "\."', f'workdir = "{SPACES}"', text, flags=re.M))
    space = load_space(path)
    config = FusionConfig.defaults(space.passes)
    with RayCommandEvaluator(space.target, tmp_path / "trials", workers=2) as evaluator:
        nodes = evaluator.nodes()
        requests = [EvalRequest(k, config, node=n) for k, n in enumerate(nodes + [NO_SUCH_NODE])]
        results = evaluator.evaluate(requests)
    assert sorted(nodes) == sorted(machines.ids())
    assert [r.status for r in results] == [EvalStatus.OK] * 2 + [EvalStatus.WORKER_DIED]
    assert [r.node for r in results] == nodes + [NO_SUCH_NODE]
    assert NO_SUCH_NODE in results[2].error_msg


# ---- every measuring node gone (runs last: it leaves the cluster without one) -----------------
def test_a_batch_with_every_measuring_node_gone_fails_at_once(
    machines: Machines, removal: Removal
) -> None:
    with RayEvaluator(CUSTOM_OP, {}, TIMED, workers=2) as evaluator:
        for node in machines.measuring:
            machines.cluster.remove_node(node)
        t0 = time.monotonic()
        results = evaluator.evaluate(_requests(60))
        elapsed = time.monotonic() - t0
        assert evaluator.nodes() == []
    assert [r.status for r in results] == [EvalStatus.WORKER_DIED] * 4
    assert all(
        r.error_msg
        == f"no Ray worker available: no alive node of the Ray cluster has the {MEASURE_SLOT} resource"
        for r in results
    ), [r.error_msg for r in results]
    assert elapsed < 10.0
