"""RecomputeSplitFusionPass: every value of its split point against the reference, and its effect."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.training import TrainSpec
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.passes.registry import BY_NAME
from fusiontune.passes.ub.recompute import PREFIX, saved_activations
from fusiontune.runtime.program import build_program
from fusiontune.workloads import make_workload
from fusiontune.workloads.workload import Workload, training_workload

PASS = "RecomputeSplitFusionPass"
POINT = f"{PASS}.recompute"
VALUES = tuple(range(BY_NAME[PASS].split_points[0].high + 1))


def config(level: int) -> FusionConfig:
    return FusionConfig.resolve(split_points={POINT: level})


def step_of(graph_name: str, batch: int, hidden: int, ffn: int) -> Workload:
    """Two GELU layers and a linear one, weights built in: the GELU outputs are saved activations."""
    rng = np.random.default_rng(0)
    g = GraphBuilder(graph_name)
    x = g.input("x", (batch, hidden))
    h = x
    for i, (n_in, n_out) in enumerate(((hidden, ffn), (ffn, ffn), (ffn, hidden))):
        w = g.const(
            (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
            name=f"l{i}/weight",
        )
        h = g.matmul(h, w)
        if i < 2:
            h = g.gelu_decomposed(h)
    g.output(h)
    graph = g.build()
    inputs = random_inputs(graph, seed=0)
    forward = Workload(graph_name, graph, inputs, run_graph(graph, inputs, "float64"), {})
    return training_workload(forward, TrainSpec(loss="mse", optimizer="sgd"))


@pytest.fixture(scope="module")
def block() -> Workload:
    base = make_workload("transformer_block", batch=1, seq=8, hidden=16, heads=2, ffn=32)
    return training_workload(base, TrainSpec())


@pytest.fixture(scope="module")
def stored(block: Workload) -> dict[str, np.ndarray]:
    prog = build_program(run_pipeline(block.graph, config(0), train=block.train).fused)
    return {
        k: np.array(v)
        for k, v in prog.run({k: np.array(v) for k, v in block.inputs.items()}).items()
    }


@pytest.mark.parametrize("level", VALUES)
def test_every_recompute_value_matches_the_reference(
    block: Workload, stored: dict[str, np.ndarray], level: int
) -> None:
    """Exact: the step's outputs equal the stored program's up to rounding, within float32 of float64."""
    res = run_pipeline(block.graph, config(level), train=block.train)
    prog = build_program(res.fused)
    out = prog.run({k: np.array(v) for k, v in block.inputs.items()})
    assert block.errors(out).max_rel < 1e-4
    for name, want in stored.items():
        np.testing.assert_allclose(
            out[name], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} at recompute={level}"
        )
    recomputed = [n for n in res.fused.graph.nodes if n.name.startswith(PREFIX)]
    if level == 0:
        assert not recomputed
    if level >= 2:  # the GELU output and the first LayerNorm's (at this size level 1 finds no gain)
        assert recomputed


def test_recompute_lowers_the_planned_peak_where_a_gelu_output_is_saved() -> None:
    """The GELU outputs die after the forward and come back just before their backward reader."""
    w = step_of("gelu_mlp", batch=64, hidden=32, ffn=256)
    progs, outs = {}, {}
    for level in (0, 1):
        progs[level] = build_program(run_pipeline(w.graph, config(level), train=w.train).fused)
        out = progs[level].run({k: np.array(v) for k, v in w.inputs.items()})
        outs[level] = {k: np.array(v) for k, v in out.items()}
    for name, want in outs[0].items():
        np.testing.assert_allclose(outs[1][name], want, rtol=1e-5, atol=1e-7, err_msg=name)
    saved = {lvl: sum(saved_activations(p.graph).values()) for lvl, p in progs.items()}
    assert saved[1] < saved[0]
    assert progs[1].peak_bytes < progs[0].peak_bytes


def test_each_recomputed_value_is_one_application_bisection_can_deny(block: Workload) -> None:
    res = run_pipeline(block.graph, config(2), train=block.train)
    apps = [a for a in res.report.applications if a.pass_name == PASS]
    assert len(apps) >= 2 and all(a.applied and a.pattern == "Recompute" and a.nodes for a in apps)
    denied = run_pipeline(
        block.graph, config(2), deny={PASS: frozenset({apps[0].index})}, train=block.train
    )
    kept = [a for a in denied.report.applications if a.pass_name == PASS]
    assert [a.applied for a in kept] == [False] + [True] * (len(apps) - 1)
    assert [a.nodes for a in kept] == [a.nodes for a in apps]
    count = lambda r: sum(n.name.startswith(PREFIX) for n in r.fused.graph.nodes)  # noqa: E731
    assert count(denied) < count(res)


def test_an_inference_graph_has_nothing_to_recompute() -> None:
    w = make_workload("transformer_block", batch=1, seq=8, hidden=16, heads=2, ffn=32)
    plain = run_pipeline(w.graph, config(0)).fused
    cut = run_pipeline(w.graph, config(3)).fused
    assert [n.name for n in cut.graph.nodes] == [n.name for n in plain.graph.nodes]
