"""RayEvaluator on a real local Ray cluster: same verdicts as in process, node recorded, faults survived.

One Ray instance serves the module (``ray_cluster``, 2 CPUs); each test closes its 2-actor
evaluator before the next starts. The configurations are built in process first, which warms
the shared kernel disk cache, so the actors' builds are cache loads and short time limits hold.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from fusiontune.codegen.threading_layer import tbb_library
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.measure import MeasureConfig
from fusiontune.tune.evaluate import program_hash
from fusiontune.tune.evaluator import Evaluator, LocalEvaluator
from fusiontune.tune.ray_evaluator import FaultHook, RayEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.workloads import make_workload

QUICK = MeasureConfig(warmup=1, number=1, repeat=3)
# Samples of ~20 ms: long enough that two measurements run side by side would overlap in time.
TIMED = MeasureConfig(warmup=1, number=1, repeat=3, min_repeat_ms=20)
CUSTOM_OP = "mindspore_custom_op"
MLP_SIZES = {"batch": 32, "hidden": 64}


def _configs() -> list[FusionConfig]:
    """Four configurations of distinct programs on mindspore_custom_op (1 to 4 kernels)."""
    base = FusionConfig.defaults()
    return [
        base,
        FusionConfig.all_off(),
        base.with_switches(CompositeOpsFusionPass=False),
        base.with_splits(**{"TbeEltwiseSplitFusionPass.cut": 2}),
    ]


def _requests(first_trial: int) -> list[EvalRequest]:
    return [EvalRequest(first_trial + k, c) for k, c in enumerate(_configs())]


@pytest.fixture(scope="module")
def custom_op_local() -> list[EvalResult]:
    """The in-process verdicts (and a warm disk cache for every configuration of this module)."""
    return LocalEvaluator(make_workload(CUSTOM_OP), TIMED).evaluate(_requests(0))


@pytest.fixture(scope="module")
def custom_op_ray(ray_cluster: Any, custom_op_local: list[EvalResult]) -> list[EvalResult]:
    with RayEvaluator(CUSTOM_OP, {}, TIMED, workers=2) as evaluator:
        return evaluator.evaluate(_requests(0))


# ---- without Ray -------------------------------------------------------------------------------
def test_fault_hook_parses_forms_and_trials() -> None:
    hook = FaultHook.parse("kill_on_trial=3, sleep_in_build_on_trial=5")
    assert hook.faults == (("kill", "measure", 3), ("sleep", "build", 5))
    assert FaultHook.parse(None).faults == ()


def test_fault_hook_rejects_unknown_form() -> None:
    with pytest.raises(ValueError, match="explode_on_trial"):
        FaultHook.parse("explode_on_trial=1")


# ---- on a local cluster ------------------------------------------------------------------------
@pytest.mark.ray
def test_ray_evaluator_is_an_evaluator(ray_cluster: Any) -> None:
    assert issubclass(RayEvaluator, Evaluator)


@pytest.mark.ray
def test_ray_evaluator_matches_local_verdicts(
    custom_op_ray: list[EvalResult], custom_op_local: list[EvalResult]
) -> None:
    assert [r.trial for r in custom_op_ray] == [0, 1, 2, 3]
    assert [r.status for r in custom_op_ray] == [r.status for r in custom_op_local] == ["ok"] * 4
    assert [r.kernels for r in custom_op_ray] == [r.kernels for r in custom_op_local]
    for remote, local in zip(custom_op_ray, custom_op_local, strict=True):
        assert remote.config_key == local.config_key
        assert remote.error("max_abs") == pytest.approx(local.error("max_abs"), rel=1e-6, abs=1e-12)
        assert remote.median_s > 0 and len(remote.samples_s) == TIMED.repeat


@pytest.mark.ray
def test_ray_evaluator_program_hash_matches_driver(custom_op_ray: list[EvalResult]) -> None:
    graph = make_workload(CUSTOM_OP).graph
    assert [r.program_hash for r in custom_op_ray] == [program_hash(graph, c) for c in _configs()]


@pytest.mark.ray
def test_ray_evaluator_records_node(ray_cluster: Any, custom_op_ray: list[EvalResult]) -> None:
    node_ids = {n["NodeID"] for n in ray_cluster.nodes() if n["Alive"]}
    assert {r.node for r in custom_op_ray} <= node_ids
    assert {r.extra["host"] for r in custom_op_ray} == {socket.gethostname()}


@pytest.mark.ray
def test_ray_evaluator_never_overlaps_measurements_on_a_node(
    custom_op_ray: list[EvalResult],
) -> None:
    # Both actors share the one node (and its one measure slot), so their windows must not overlap.
    windows = sorted((r.extra["measure_start"], r.extra["measure_end"]) for r in custom_op_ray)
    assert len({r.node for r in custom_op_ray}) == 1
    assert all(
        start >= prev_end for (_, prev_end), (start, _) in zip(windows, windows[1:], strict=False)
    )


@pytest.mark.ray
def test_ray_evaluator_mlp_matches_local(ray_cluster: Any) -> None:
    configs = [FusionConfig.defaults(), FusionConfig.all_off()]
    requests = [EvalRequest(k, c) for k, c in enumerate(configs)]
    local = LocalEvaluator(make_workload("mlp", **MLP_SIZES), QUICK).evaluate(requests)
    with RayEvaluator("mlp", MLP_SIZES, QUICK, workers=2) as evaluator:
        remote = evaluator.evaluate(requests)
    assert [r.status for r in remote] == [r.status for r in local] == ["ok", "ok"]
    assert [r.program_hash for r in remote] == [r.program_hash for r in local]
    for ours, theirs in zip(remote, local, strict=True):
        assert ours.error("rel_l2") == pytest.approx(theirs.error("rel_l2"), rel=1e-3, abs=1e-9)
    # The workers set their thread count before loading anything; that used to start numba's
    # threads on OpenMP, whose kernels wait a time slice for a thread another process holds.
    layers = {r.extra["threading_layer"] for r in remote}
    assert layers == {"tbb"} if tbb_library() is not None else len(layers) == 1


@pytest.mark.ray
def test_ray_evaluator_survives_worker_killed_mid_measurement(
    ray_cluster: Any, custom_op_local: list[EvalResult]
) -> None:
    with RayEvaluator(CUSTOM_OP, {}, QUICK, workers=2, fault_hook="kill_on_trial=12") as evaluator:
        results = evaluator.evaluate(_requests(10))
        after = evaluator.evaluate(_requests(20)[:2])
        replaced = evaluator.replaced
    assert [r.trial for r in results] == [10, 11, 12, 13]
    assert [r.status for r in results] == ["ok", "ok", EvalStatus.WORKER_DIED, "ok"]
    assert results[2].error_msg.startswith(f"worker died on node {results[2].node}:")
    assert replaced == 1
    assert [r.status for r in after] == ["ok", "ok"]


@pytest.mark.ray
def test_ray_evaluator_times_out_a_hung_measurement(
    ray_cluster: Any, custom_op_local: list[EvalResult]
) -> None:
    with RayEvaluator(
        CUSTOM_OP, {}, QUICK, workers=2, trial_timeout_s=5, fault_hook="sleep_on_trial=31"
    ) as evaluator:
        results = evaluator.evaluate(_requests(30))
        after = evaluator.evaluate(_requests(40)[:2])
    assert [r.status for r in results] == ["ok", EvalStatus.TIMEOUT, "ok", "ok"]
    assert results[1].error_msg == "timed out after 5 s (measurement)"
    assert [r.status for r in after] == ["ok", "ok"]


@pytest.mark.ray
def test_ray_evaluator_times_out_a_hung_build(
    ray_cluster: Any, custom_op_local: list[EvalResult]
) -> None:
    with RayEvaluator(
        CUSTOM_OP, {}, QUICK, workers=2, trial_timeout_s=5, fault_hook="sleep_in_build_on_trial=50"
    ) as evaluator:
        results = evaluator.evaluate(_requests(50))
    assert [r.status for r in results] == [EvalStatus.TIMEOUT, "ok", "ok", "ok"]
    assert results[0].error_msg == "timed out after 5 s (build)"


@pytest.mark.ray
def test_ray_evaluator_unknown_workload_is_user_error(ray_cluster: Any) -> None:
    with pytest.raises(UserError, match="unknown workload 'no_such_net'"):
        RayEvaluator("no_such_net", {}, QUICK, workers=1)


@pytest.mark.ray
def test_ray_evaluator_unreachable_address_is_user_error() -> None:
    with pytest.raises(UserError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        RayEvaluator(CUSTOM_OP, {}, QUICK, workers=1, address="127.0.0.1:1")


@pytest.mark.ray
def test_bisection_through_ray_names_the_same_culprits_as_in_process(ray_cluster: Any) -> None:
    from fusiontune.bisect import bisect, default_bad

    sizes = {"batch": 1, "seq": 16, "hidden": 32, "heads": 2, "ffn": 64}
    bad, good = default_bad(), FusionConfig.all_off()
    local = bisect(
        LocalEvaluator(make_workload("transformer_block", **sizes), QUICK),
        bad,
        good,
        5e-4,
        log=print,
    )
    with RayEvaluator("transformer_block", sizes, QUICK, workers=1) as evaluator:
        remote = bisect(evaluator, bad, good, 5e-4, log=print)
    assert [c.to_json() for c in remote.culprits] == [c.to_json() for c in local.culprits]
    assert any(c.applications for c in remote.culprits)  # denied applications reached the actors
    assert [e.error for e in remote.evaluations] == pytest.approx(
        [e.error for e in local.evaluations]
    )
