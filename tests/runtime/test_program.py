"""Program: the buffer plan reuses dead buffers without clobbering live ones; runs are repeatable;
kernel counts are the observable effect of fusion.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from fusiontune.codegen import group_sources
from fusiontune.codegen.cache import compile_kernels
from fusiontune.config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, random_inputs, run_graph
from fusiontune.ir.training import TrainSpec
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.passes.registry import PASSES
from fusiontune.runtime import Program, build_program, plan_buffers
from fusiontune.runtime.program import _entry_point, concat_in_place
from fusiontune.workloads import make_workload
from fusiontune.workloads.workload import training_workload

SMALL = {
    "transformer_block": dict(batch=1, seq=8, hidden=16, heads=2, ffn=32),
    "llama_block": dict(batch=1, seq=8, hidden=16, heads=2, ffn=24),
    "mlp": dict(batch=8, hidden=16),
}
CONFIGS = {"all_off": FusionConfig.all_off, "defaults": FusionConfig.defaults}


def chain(length: int = 8, shape: tuple[int, int] = (32, 48)) -> Graph:
    """x -> exp -> +y -> *0.5 -> tanh -> ... : every intermediate dies right after its reader."""
    g = GraphBuilder("chain")
    x, y = g.input("x", shape), g.input("y", shape)
    v = x
    steps = [lambda t: g.exp(g.mul(t, 0.1)), lambda t: g.add(t, y), lambda t: g.mul(t, 0.5), g.tanh]
    for i in range(length):
        v = steps[i % len(steps)](v)
    g.output(v)
    return g.build()


def diamond() -> Graph:
    """Branches with different lifetimes and sizes: a value read far downstream must survive."""
    g = GraphBuilder("diamond")
    x = g.input("x", (16, 32))
    a = g.exp(g.mul(x, 0.1))  # read again at the very end
    b = g.reduce_sum(a)  # (16, 1): a small buffer
    c = g.tanh(g.sub(a, b))
    d = g.concat([c, x], axis=0)  # (32, 32): a larger buffer
    e = g.slice(d, (0,), (16,), (0,))
    f = g.sigmoid(g.mul(e, 2.0))
    g.output(g.add(f, a), b)
    return g.build()


def program_for(name: str, config: str) -> tuple[Program, Graph, Mapping[str, np.ndarray]]:
    if name == "chain":
        graph = chain()
    elif name == "diamond":
        graph = diamond()
    else:
        w = make_workload(name, **SMALL.get(name, {}))
        graph = w.graph
    prog = build_program(run_pipeline(graph, CONFIGS[config]()).fused)
    return prog, graph, random_inputs(graph, seed=11)


def assert_outputs_match(
    graph: Graph, got: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]
) -> None:
    want = run_graph(graph, inputs, dtype="float64")
    assert set(got) == set(graph.outputs)
    for name in graph.outputs:
        scale = max(1.0, float(np.max(np.abs(want[name]))))
        np.testing.assert_allclose(
            got[name], want[name], rtol=1e-4, atol=1e-5 * scale, err_msg=name
        )


# ---- the buffer plan -------------------------------------------------------------------------------
def test_chain_all_off_reuses_dead_buffers() -> None:
    graph = chain()
    prog = build_program(run_pipeline(graph, FusionConfig.all_off()).fused)
    assert prog.kernel_count == len(graph.nodes) == 10
    assert prog.plan.peak_bytes < prog.plan.naive_bytes
    # Two slots suffice for a chain: the value being written and the one being read.
    assert len(prog.plan.slot_bytes) == 2


def test_plan_buffers_is_what_the_program_uses() -> None:
    fused = run_pipeline(diamond(), FusionConfig.all_off()).fused
    assert build_program(fused).plan == plan_buffers(fused)


def test_plan_never_places_inputs_outputs_or_constants_in_slots() -> None:
    fused = run_pipeline(diamond(), FusionConfig.all_off()).fused
    plan = plan_buffers(fused)
    pinned = set(fused.graph.inputs) | set(fused.graph.outputs) | set(fused.graph.constants)
    assert not pinned & set(plan.slot_of)


PROGRAMS = [
    (name, config)
    for name in ("chain", "diamond", "mlp", "transformer_block", "llama_block")
    for config in CONFIGS
]


def _calls_with_roles(
    prog: Program,
) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]]:
    """Per kernel, in call order: the views it reads and writes, by value name, and its group.

    A Reshape that is a view of its input (ReshapeRemovePass, ``plan.views``) runs no kernel, nor
    a Concat written in place by its parts' kernels (ConvConcatFusionPass)."""
    views = prog.plan.views
    sources = [
        (group, src)
        for group, src in group_sources(prog.fused)
        if not (len(group.nodes) == 1 and prog.graph.node(group.nodes[0]).outputs[0] in views)
        and not concat_in_place(group)
    ]
    assert len(sources) == len(prog._calls)
    calls = []
    for (group, src), (_, args) in zip(sources, prog._calls, strict=True):
        assert len(src.args) == len(args)
        ins = {spec.value: a for a, spec in zip(args, src.args, strict=True) if spec.role == "in"}
        outs = {spec.value: a for a, spec in zip(args, src.args, strict=True) if spec.role == "out"}
        calls.append((ins, outs, group.name))
    return calls


@pytest.mark.parametrize(("name", "config"), PROGRAMS)
def test_no_kernel_output_aliases_its_inputs(name: str, config: str) -> None:
    prog, _, _ = program_for(name, config)
    for ins, outs, group in _calls_with_roles(prog):
        views = list(outs.items())
        for i, (o, out) in enumerate(views):
            for v, arr in ins.items():
                assert not np.shares_memory(out, arr), (
                    f"{group}: output {o} shares memory with input {v}"
                )
            for other, arr in views[i + 1 :]:
                assert not np.shares_memory(out, arr), (
                    f"{group}: outputs {o} and {other} share memory"
                )


@pytest.mark.parametrize(("name", "config"), PROGRAMS)
def test_no_kernel_overwrites_a_value_still_needed(name: str, config: str) -> None:
    prog, graph, _ = program_for(name, config)
    calls = _calls_with_roles(prog)
    available = set(prog.graph.inputs) | set(prog.graph.constants)
    for k, (_, outs, group) in enumerate(calls):
        needed_later = {v for ins, _, _ in calls[k + 1 :] for v in ins} | set(prog.graph.outputs)
        for o, out in outs.items():
            for v in (available & needed_later) - {o}:
                assert not np.shares_memory(out, prog._arrays[v]), (
                    f"{group} writes {o} over live value {v}"
                )
        available |= set(outs)


@pytest.mark.parametrize(("name", "config"), PROGRAMS)
def test_program_matches_float64_interpreter(name: str, config: str) -> None:
    prog, graph, inputs = program_for(name, config)
    assert_outputs_match(graph, prog.run(inputs), inputs)


def test_split_with_an_unused_piece_runs() -> None:
    """A Split writes every piece, read or not: the unread one still needs a buffer."""
    g = GraphBuilder("split_unused")
    a, _, c = g.split(g.exp(g.input("x", (4, 9))), (2, 3, 4), axis=1)
    g.output(g.add(g.reduce_sum(a), g.reduce_sum(c)))
    graph = g.build()
    inputs = random_inputs(graph, seed=3)
    for config in CONFIGS.values():
        prog = build_program(run_pipeline(graph, config()).fused)
        assert_outputs_match(graph, prog.run(inputs), inputs)


# ---- running ---------------------------------------------------------------------------------------
def test_run_twice_with_different_inputs_gives_both_results() -> None:
    prog, graph, _ = program_for("diamond", "defaults")
    first_inputs, second_inputs = random_inputs(graph, seed=1), random_inputs(graph, seed=2)
    first = {k: v.copy() for k, v in prog.run(first_inputs).items()}
    second = {k: v.copy() for k, v in prog.run(second_inputs).items()}
    assert_outputs_match(graph, first, first_inputs)
    assert_outputs_match(graph, second, second_inputs)
    assert not np.allclose(first[graph.outputs[0]], second[graph.outputs[0]])
    again = prog.run(first_inputs)  # back to the first arrays: rebinds them
    assert_outputs_match(graph, again, first_inputs)


def test_run_copies_inputs_and_never_writes_them() -> None:
    prog, graph, inputs = program_for("chain", "all_off")
    kept = {k: v.copy() for k, v in inputs.items()}
    out = prog.run(inputs)
    for name, arr in inputs.items():
        np.testing.assert_array_equal(arr, kept[name])
        for o in out.values():
            assert not np.shares_memory(o, arr)


def test_run_accepts_inputs_of_another_float_width() -> None:
    prog, graph, inputs = program_for("chain", "defaults")
    wide = {k: v.astype(np.float64) for k, v in inputs.items()}
    assert_outputs_match(graph, prog.run(wide), inputs)


def test_run_returns_views_of_program_buffers() -> None:
    """Outputs are the program's own buffers (no copy per run): keep them with a copy."""
    prog, graph, _ = program_for("chain", "defaults")
    a = prog.run(random_inputs(graph, seed=1))[graph.outputs[0]]
    b = prog.run(random_inputs(graph, seed=2))[graph.outputs[0]]
    assert np.shares_memory(a, b)


# ---- kernel counts: the observable effect of fusion --------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "chain",
        "diamond",
        "mindspore_basic",
        "mindspore_composite",
        "mindspore_custom_op",
        "mlp",
        "transformer_block",
        "llama_block",
    ],
)
def test_all_off_is_one_kernel_per_node(name: str) -> None:
    graph = {"chain": chain, "diamond": diamond}.get(
        name, lambda: make_workload(name, **SMALL.get(name, {})).graph
    )()
    res = run_pipeline(graph, FusionConfig.all_off())
    assert res.fused.groups == FusedGraph.singletons(res.fused.graph).groups
    assert len(res.fused.graph.nodes) == len(
        graph.nodes
    )  # canonicalization finds nothing to do here
    prog = build_program(res.fused)
    assert prog.kernel_count == len(graph.nodes)


@pytest.mark.parametrize(
    ("name", "nodes", "kernels"),
    [("mindspore_basic", 2, 1), ("mindspore_composite", 3, 1), ("mindspore_custom_op", 4, 1)],
)
def test_defaults_fuse_the_seed_networks_into_one_kernel(
    name: str, nodes: int, kernels: int
) -> None:
    w = make_workload(name)
    assert len(w.graph.nodes) == nodes
    prog = build_program(run_pipeline(w.graph, FusionConfig.defaults()).fused)
    assert prog.kernel_count == kernels
    out = prog.run(w.inputs)
    for k in w.graph.outputs:
        np.testing.assert_allclose(out[k], w.reference[k], rtol=1e-5, atol=1e-6)


def test_basic_fusion_alone_leaves_pow_out_of_the_seed_composite() -> None:
    """Seed 001: Mul and Add fuse at the basic stage; Pow joins only at the composite stage."""
    w = make_workload("mindspore_composite")
    basic = FusionConfig.resolve(
        all_switch={"GraphFusion": False, "UBFusion": False},
        explicit={"TbeEltwiseFusionPass": True},
    )
    assert build_program(run_pipeline(w.graph, basic).fused).kernel_count == 2


def test_defaults_run_a_residual_around_a_linear_layer() -> None:
    g = GraphBuilder("residual_linear")
    x = g.input("x", (4, 8))
    w = g.const(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 0.3)
    g.output(g.add(g.matmul(x, w), x))
    graph = g.build()
    inputs = random_inputs(graph, seed=0)
    prog = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
    assert prog.kernel_count == 1
    assert_outputs_match(graph, prog.run(inputs), inputs)


# ---- split points: each one is a search dimension ----------------------------------------------------
# The value to try where the first nonzero choice is what the codegen rule picks anyway.
def _orient_against_the_rule() -> int:
    """The orient split value that the codegen rule does not pick for conv_pair's 3x3 conv (4 -> 8
    channels @8): rows with 16 lanes (AVX-512), lanes with 8 (AVX2), so forcing the other one
    changes the program on either machine."""
    from fusiontune.codegen._window import Window
    from fusiontune.codegen.conv import plan_packed
    from fusiontune.passes.ub.conv_output_split import ORIENTS

    rule = plan_packed(Window(1, 4, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), 8, "float32").orient
    return next(v for v, o in ORIENTS.items() if o != rule)


SPLIT_VALUE = {"ConvOutputSplitFusionPass.orient": _orient_against_the_rule()}
SPLIT_POINTS = [
    (f"{p.name}.{sp.name}", SPLIT_VALUE.get(f"{p.name}.{sp.name}", next((c for c in sp.choices if c > 0), max(1, sp.low))))
    for p in PASSES
    for sp in p.split_points
]


# Where each split point has something to cut (default: the transformer block).
SPLIT_WORKLOAD = {"TbeEltwiseSplitFusionPass.cut": "mindspore_custom_op"}
# Split points of a training step's backward: the step of this workload, at this value.
TRAIN_SPLITS = {
    "LayerNormGradFusionPass.recompute": ("transformer_block", 1),
    "RmsNormGradFusionPass.recompute": ("llama_block", 1),
    "GeluGradFusionPass.recompute": ("transformer_block", 1),
    "RecomputeSplitFusionPass.recompute": ("transformer_block", 2),  # 1 finds nothing cheap here
}


def conv_pair() -> Graph:
    """A dense 3x3 conv + Relu (im2col) then a depthwise conv (direct): ConvOutputSplitFusionPass's cuts."""
    rng = np.random.default_rng(0)
    g = GraphBuilder("conv_pair")
    x = g.input("x", (1, 4, 8, 8))
    h = g.relu(g.op("Conv", x, g.const(rng.standard_normal((8, 4, 3, 3)).astype(np.float32)), pads=(1, 1, 1, 1)))
    g.output(g.op("Conv", h, g.const(rng.standard_normal((8, 1, 3, 3)).astype(np.float32)), group=8))
    return g.build()


@pytest.mark.parametrize(("key", "value"), SPLIT_POINTS, ids=[k for k, _ in SPLIT_POINTS])
def test_every_split_point_changes_the_program(key: str, value: int) -> None:
    """DESIGN section 4: a split point that does not change the generated program is no dimension."""
    if key in TRAIN_SPLITS:
        name, value = TRAIN_SPLITS[key]
        w = training_workload(make_workload(name, **SMALL.get(name, {})), TrainSpec())
        plain = build_program(run_pipeline(w.graph, FusionConfig.defaults(), train=w.train).fused)
        config = FusionConfig.resolve(split_points={key: value})
        split = build_program(run_pipeline(w.graph, config, train=w.train).fused)
        assert [k.instance for k in split.kernels] != [k.instance for k in plain.kernels]
        floor = w.errors(run_graph(w.reference_graph, w.inputs, dtype=None))
        assert w.errors({k: np.array(v) for k, v in split.run(w.inputs).items()}).max_rel <= 10 * floor.max_rel
        return
    if key.startswith("ConvOutputSplitFusionPass."):
        graph = conv_pair()
        inputs = random_inputs(graph, seed=0)
    elif key == "FlashAttentionFusionPass.kv_block":
        # A key block cuts only a row longer than itself: seq 64 against kv_block 32.
        w = make_workload("transformer_block", **{**SMALL["transformer_block"], "seq": 64})
        graph, inputs = w.graph, w.inputs
    else:
        name = SPLIT_WORKLOAD.get(key, "transformer_block")
        w = make_workload(name, **SMALL.get(name, {}))
        graph, inputs = w.graph, w.inputs
    plain = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
    split = build_program(
        run_pipeline(graph, FusionConfig.resolve(split_points={key: value})).fused
    )
    assert [k.instance for k in split.kernels] != [k.instance for k in plain.kernels]
    assert_outputs_match(graph, split.run(inputs), inputs)


def test_kernels_are_called_through_their_entry_points_checked_once() -> None:
    """The program calls each kernel's compiled entry point, skipping the dispatcher's type
    resolution on every call, after checking once that its buffers are of the one signature's
    types; a dispatcher whose arguments are of other types stays a dispatcher (it would refuse
    them, where the entry point would read them as the wrong type)."""
    prog, graph, inputs = program_for("diamond", "defaults")
    fns = [fn for fn, _ in prog._calls]
    assert fns and not any(hasattr(fn, "signatures") for fn in fns)
    assert_outputs_match(graph, prog.run(inputs), inputs)

    kernel = compile_kernels([group_sources(FusedGraph.singletons(chain(1)))[0][1]])[0].fn
    (sig,) = kernel.signatures
    right = [np.zeros(1 if a.ndim == 0 else (2,) * a.ndim, dtype=a.dtype.name) for a in sig]
    assert _entry_point(kernel, right) is not kernel
    assert _entry_point(kernel, [r.astype(np.float64) for r in right]) is kernel
