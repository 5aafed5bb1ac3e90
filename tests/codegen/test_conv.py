"""Conv kernels (codegen/conv.py): both algorithms agree with the reference; the epilogue is fused.

Every kernel here is checked against the float64 interpreter of the same graph (the numpy
reference in ir/ops.py defines Conv). Shapes are small: each case compiles one or two kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
import pytest

from fusiontune.codegen import NotFusable, kernel_source, microkernel
from fusiontune.codegen import conv as conv_module
from fusiontune.codegen.conv import PACKED_PARAMS, choose_conv_algo
from fusiontune.ir import Graph, GraphBuilder, Tensor, run_graph
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.runtime import build_program

RTOL, ATOL = 1e-4, 1e-5


def _const(g: GraphBuilder, shape: tuple[int, ...], seed: int, positive: bool = False) -> Tensor:
    rng = np.random.default_rng(seed)
    arr = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return g.const(arr.astype(np.float32))


def _graph(build: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]]) -> Graph:
    g = GraphBuilder("conv_test")
    out = build(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def _one_kernel(graph: Graph, schedule: dict[str, object] | None = None) -> FusedGraph:
    """The whole graph as one group (one kernel) with ``schedule``."""
    names = tuple(n.name for n in graph.nodes)
    return FusedGraph(graph, (Group("all", names, (), schedule or {}),))


def _check(graph: Graph, schedule: dict[str, object] | None = None, seed: int = 0) -> None:
    prog = build_program(_one_kernel(graph, schedule))
    assert prog.kernel_count == 1
    rng = np.random.default_rng(seed)
    inputs = {n: rng.standard_normal(graph.values[n].shape).astype(np.float32) for n in graph.inputs}
    got = prog.run(inputs)
    want = run_graph(graph, inputs, dtype="float64")
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


# (x shape, w shape, attrs, bias)
GRID = {
    "3x3_pad1": ((2, 5, 9, 8), (6, 5, 3, 3), {"pads": (1, 1, 1, 1)}, True),
    "3x3_s2_asym": ((1, 4, 10, 9), (8, 4, 3, 3), {"strides": (2, 2), "pads": (0, 1, 1, 0)}, False),
    "group3_dilated": ((2, 6, 9, 9), (9, 2, 3, 3), {"group": 3, "dilations": (2, 1), "pads": (2, 1, 2, 1)}, True),
    "depthwise_s2": ((1, 8, 11, 11), (8, 1, 3, 3), {"group": 8, "strides": (2, 2), "pads": (1, 1, 1, 1)}, True),
    "1x1": ((2, 16, 7, 7), (12, 16, 1, 1), {}, False),
    "5x5_wide_stride": ((1, 3, 12, 13), (4, 3, 5, 5), {"strides": (3, 2), "pads": (2, 2, 2, 2)}, True),
    "1d": ((2, 4, 20), (6, 4, 5), {"pads": (2, 1), "strides": (2,)}, True),
    # 40 channels: runs of channels of unequal length in the channels-last kernel
    "depthwise_dilated_asym": ((2, 40, 7, 9), (40, 1, 3, 5), {"group": 40, "strides": (3, 2), "dilations": (1, 2),
                                                               "pads": (1, 2, 0, 3)}, True),
    "depthwise_1d": ((2, 24, 15), (24, 1, 5), {"group": 24, "pads": (2, 2)}, False),
    # 25 taps of one phase: the plane kernel's statements of 9, 9 and 7 taps
    "depthwise_5x5": ((1, 16, 9, 9), (16, 1, 5, 5), {"group": 16, "pads": (2, 2, 2, 2)}, True),
}


@pytest.mark.parametrize("algo", ["im2col", "direct", "shifted", "packed", "plane", "chan", "axpy"])
@pytest.mark.parametrize("case", list(GRID))
def test_conv_algorithm_matches_reference(case: str, algo: str) -> None:
    xs, ws, attrs, bias = GRID[case]

    def build(g: GraphBuilder) -> Tensor:
        ins = [g.input("x", xs), _const(g, ws, 1)] + ([_const(g, (ws[0],), 2)] if bias else [])
        return g.op("Conv", *ins, **attrs)

    _check(_graph(build), {"conv_algo": algo})


@pytest.mark.parametrize(
    ("xs", "ws", "attrs"),
    [
        ((1, 4, 6, 37), (4, 1, 3, 3), {"group": 4, "strides": (2, 2), "pads": (1, 1, 1, 1)}),
        ((1, 3, 4, 40), (3, 1, 3, 3), {"group": 3, "pads": (1, 1, 1, 1)}),
        # the last input column lies past every window: it is not copied into the grid
        ((2, 2, 5, 35), (2, 1, 2, 2), {"group": 2, "strides": (2, 2)}),
    ],
)
def test_plane_kernel_copies_rows_of_a_vector_and_more(xs: tuple[int, ...], ws: tuple[int, ...],
                                                       attrs: dict[str, object]) -> None:
    """Rows of 16 or more grid columns a phase: the plane kernel's row copy loops over a count
    read at run time (a shorter row's is a literal; the grid above covers those)."""
    _check(_graph(lambda g: g.op("Conv", g.input("x", xs), _const(g, ws, 1), **attrs)), {"conv_algo": "plane"})


@pytest.mark.parametrize(("xs", "k", "strides"), [((2, 20, 5, 6), 3, (1, 1)), ((1, 37, 9, 9), 5, (2, 2))])
def test_chan_kernel_packs_weights_that_are_an_input(xs: tuple[int, ...], k: int, strides: tuple[int, int]) -> None:
    """Weights that are a graph input (a training step's) are packed into the micro-kernel's
    blocks on entry; constant ones are packed once when the program is built (the grid above).
    20 and 37 channels: a partial last block of 16 lanes."""
    c = xs[1]

    def build(g: GraphBuilder) -> Tensor:
        y = g.op("Conv", g.input("x", xs), g.input("w", (c, 1, k, k)), group=c, strides=strides,
                 pads=(k // 2,) * 4)
        return g.relu(y)

    graph = _graph(build)
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "chan"})
    assert not src.derived and "wpk = np.zeros" in src.source
    _check(graph, {"conv_algo": "chan"})


@pytest.mark.parametrize(
    ("xs", "ws", "attrs"),
    [
        # 11 output columns: a block of the row and a last one overlapping it (8 lanes of positions)
        ((1, 20, 20, 21), (20, 1, 5, 5), {"group": 20, "strides": (2, 2), "pads": (2, 2, 2, 2)}),
        ((2, 17, 12, 19), (17, 1, 3, 3), {"group": 17, "dilations": (2, 2), "pads": (2, 2, 2, 2)}),
        ((1, 33, 9, 16), (33, 1, 7, 7), {"group": 33, "strides": (1, 2), "pads": (3, 3, 3, 3)}),
    ],
)
def test_chan_kernel_blocks_output_rows(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, object]) -> None:
    """Output rows at least one block wide run the row-blocked micro-kernel (each input vector
    loaded once per kernel row for the taps that read it), at any stride and dilation; a narrower
    row takes the one-position-at-a-time kernel (the grid above: depthwise_s2, 6 columns)."""
    graph = _graph(lambda g: g.relu(g.op("Conv", g.input("x", xs), _const(g, ws, 1), **attrs)))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "chan"}).source
    assert "dwr(" in src and "dwk(" not in src
    _check(graph, {"conv_algo": "chan"})
    narrow = _graph(lambda g: g.op("Conv", g.input("x", (1, 8, 11, 11)), _const(g, (8, 1, 3, 3), 1), group=8,
                                   strides=(2, 2), pads=(1, 1, 1, 1)))
    src = kernel_source(narrow, [n.name for n in narrow.nodes], {"conv_algo": "chan"}).source
    assert ("dwk(" in src) == (6 < microkernel.depthwise_row_block())


def test_im2col_row_blocks_of_one_row_match_reference() -> None:
    """``conv_rows`` (ConvOutputSplitFusionPass) cuts the output into more, smaller blocks."""
    graph = _graph(lambda g: g.relu(g.op("Conv", g.input("x", (1, 3, 7, 6)), _const(g, (4, 3, 3, 3), 1), pads=(1, 1, 1, 1))))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "im2col", "conv_rows": 1})
    assert "for t in range(7)" in src.source or "prange(7)" in src.source
    _check(graph, {"conv_algo": "im2col", "conv_rows": 1})


def _bn(g: GraphBuilder, y: Tensor, m: int) -> Tensor:
    return g.op(
        "BatchNorm", y, _const(g, (m, 1, 1), 3, True), _const(g, (m, 1, 1), 4),
        _const(g, (m, 1, 1), 5), _const(g, (m, 1, 1), 6, True),
    )


def _epilogue_block(g: GraphBuilder) -> tuple[Tensor, ...]:
    """Conv -> unfolded BatchNorm -> residual Add -> Relu, plus Clip and HardSwish side outputs."""
    x = g.input("x", (2, 4, 6, 6))
    res = g.input("res", (2, 6, 6, 6))
    y = g.op("Conv", x, _const(g, (6, 4, 3, 3), 1), _const(g, (6,), 2), pads=(1, 1, 1, 1))
    r = g.relu(g.add(_bn(g, y, 6), res))
    return r, g.op("Clip", r, min=0.0, max=1.5), g.op("HardSwish", y)


@pytest.mark.parametrize("algo", ["im2col", "direct", "shifted", "packed", "plane", "chan", "axpy"])
def test_conv_epilogue_bn_residual_relu_clip_hardswish(algo: str) -> None:
    graph = _graph(_epilogue_block)
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": algo})
    assert src.kind == "conv"
    assert len([a for a in src.args if a.role == "out"]) == 3
    _check(graph, {"conv_algo": algo})


def test_conv_epilogue_reads_the_conv_input_and_a_per_channel_scale() -> None:
    """``conv(x) * s + x``: the epilogue reads the conv's own input over the output's domain."""

    def build(g: GraphBuilder) -> Tensor:
        x = g.input("x", (1, 4, 5, 5))
        y = g.op("Conv", x, _const(g, (4, 4, 3, 3), 1), pads=(1, 1, 1, 1))
        return g.add(g.mul(y, _const(g, (1, 4, 1, 1), 7)), x)

    _check(_graph(build))


@pytest.mark.parametrize(("xs", "ws", "group", "flat", "schedule"), [
    ((2, 8, 2, 2), (8, 1, 3, 3), 8, True, {"conv_algo": "direct"}),  # 2x2 outputs: one plane per unit
    # 5 channels a group in blocks of 4 and 1: 6 units, 3 a task, the first task ends mid-group
    ((1, 6, 3, 3), (15, 2, 3, 3), 3, True, {"conv_algo": "direct"}),
    ((1, 4, 9, 9), (4, 1, 3, 3), 4, False, {"conv_algo": "direct"}),  # rows in blocks: tail in the unit
    ((2, 6, 4, 4), (10, 6, 1, 1), 1, True, {"conv_algo": "packed", "conv_rows": 6}),  # whole planes: one loop
    ((2, 6, 9, 9), (10, 3, 3, 3), 2, True, {"conv_algo": "packed", "conv_rows": 2}),  # one a channel
    ((2, 6, 9, 9), (10, 6, 3, 3), 1, True, {"conv_algo": "packed", "conv_orient": "lanes", "conv_rows": 4}),
    # a register block forced (benchmarks/bench_blocks.py): 3 of the 10 channels a block, 4 blocks
    ((2, 6, 9, 9), (10, 6, 3, 3), 1, True, {"conv_algo": "packed", "conv_orient": "rows", "conv_block": "3x2"}),
    ((3, 8, 7, 7), (8, 1, 3, 3), 8, True, {"conv_algo": "plane"}),  # tasks of whole (image, group) planes
    ((1, 6, 8, 8), (12, 2, 3, 3), 3, True, {"conv_algo": "plane"}),  # 4 output channels a group
    ((1, 40, 4, 4), (40, 1, 3, 3), 40, True, {"conv_algo": "chan"}),  # two runs of 20 channels
    ((2, 16, 17, 17), (5, 16, 1, 1), 1, True, {"conv_algo": "axpy"}),  # blocks of 256 and 33 positions
])
def test_conv_runs_a_silu_tail_flat_over_the_output(xs: tuple[int, ...], ws: tuple[int, ...], group: int,
                                                   flat: bool, schedule: dict[str, object]) -> None:
    """A SiLU after the bias (and a per-channel scale) reads nothing but its own value: the
    direct and packed kernels run it as loops over each task's outputs (contiguous runs of the
    output), so every element gets it once, whatever the blocks."""

    def build(g: GraphBuilder) -> Tensor:
        pad = 1 if ws[2] > 1 else 0
        y = g.op("Conv", g.input("x", xs), _const(g, ws, 1), _const(g, (ws[0],), 2), group=group, pads=(pad,) * 4)
        y = g.mul(y, _const(g, (1, ws[0], 1, 1), 3))
        return g.mul(y, g.sigmoid(y))

    graph = _graph(build)
    src = kernel_source(graph, [n.name for n in graph.nodes], schedule)
    assert ("o_flat" in src.source) == flat
    _check(graph, schedule)


@pytest.mark.parametrize(("xs", "ws", "schedule"), [
    ((2, 16, 8, 8), (96, 16, 1, 1), {"conv_algo": "axpy"}),  # EfficientNet-B0's export: 2 tasks
    ((2, 16, 32, 32), (96, 16, 1, 1), {"conv_algo": "axpy"}),  # 8 tasks
    ((2, 16, 12, 12), (32, 16, 3, 3), {"conv_algo": "packed"}),
])
def test_a_silu_tail_in_a_parallel_conv_kernel_matches_reference(
        xs: tuple[int, ...], ws: tuple[int, ...], schedule: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tails in kernels that run in parallel (every dense conv here, whatever its size):
    the axpy kernel took its alias of the output outside the prange loop, and numba's parallel
    lowering then lost the loop's stores (zeros in place of the conv's values on EfficientNet-B0's
    16 -> 96 @8x8 expansion), which the serial cases above never showed."""
    monkeypatch.setattr(conv_module, "DENSE_PARALLEL_FACTOR", 1)

    def build(g: GraphBuilder) -> Tensor:
        pad = 1 if ws[2] > 1 else 0
        y = g.op("Conv", g.input("x", xs), _const(g, ws, 1), _const(g, (ws[0],), 2), pads=(pad,) * 4)
        return g.mul(y, g.sigmoid(y))

    graph = _graph(build)
    src = kernel_source(graph, [n.name for n in graph.nodes], schedule)
    assert "o_flat" in src.source
    if numba.config.NUMBA_NUM_THREADS > 1:
        assert "parallel=True" in src.source
    _check(graph, schedule)


def test_conv_epilogue_approx_math_stays_close() -> None:
    graph = _graph(lambda g: g.gelu(g.op("Conv", g.input("x", (1, 3, 6, 6)), _const(g, (4, 3, 3, 3), 1))))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"math": "approx"})
    assert "erf_approx(" in src.source
    _check(graph, {"math": "approx"})


def test_conv_kernel_refuses_3d_prologues_it_cannot_run_and_partial_broadcast() -> None:
    g3 = _graph(lambda g: g.op("Conv", g.input("x", (1, 2, 4, 4, 4)), _const(g, (2, 2, 1, 1, 1), 1)))
    with pytest.raises(NotFusable, match="3-D"):
        kernel_source(g3, [n.name for n in g3.nodes])

    def shared(g: GraphBuilder) -> tuple[Tensor, ...]:  # the prologue's result is read outside
        r = g.relu(g.input("x", (1, 2, 4, 4)))
        return g.op("Conv", r, _const(g, (2, 2, 1, 1), 1)), r

    def twice(g: GraphBuilder) -> Tensor:  # the prologue's input is read by the epilogue too
        x = g.input("x", (1, 2, 4, 4))
        return g.add(g.op("Conv", g.relu(x), _const(g, (2, 2, 1, 1), 1)), x)

    def reduced(g: GraphBuilder) -> Tensor:  # not elementwise
        return g.op("Conv", g.op("Softmax", g.input("x", (1, 2, 4, 4)), axis=1), _const(g, (2, 2, 1, 1), 1))

    for build, words in ((shared, "read by the Conv alone"), (twice, "not read by the Conv or its epilogue"),
                         (reduced, "cannot be a Conv prologue")):
        pro = _graph(build)
        with pytest.raises(NotFusable, match=words):
            kernel_source(pro, [n.name for n in pro.nodes])
    part = _graph(lambda g: g.add(g.op("Conv", g.input("x", (1, 2, 4, 4)), _const(g, (2, 2, 1, 1), 1)), g.input("r", (4, 1))))
    with pytest.raises(NotFusable, match="broadcast"):
        kernel_source(part, [n.name for n in part.nodes])


# (x shape, w shape, attrs): a prologue over each geometry the packed kernel's copy handles
PROLOGUE_GRID = {
    "1x1": ((2, 6, 5, 7), (8, 6, 1, 1), {}),
    "3x3_pad1": ((2, 5, 9, 8), (6, 5, 3, 3), {"pads": (1, 1, 1, 1)}),
    "3x3_s2_asym": ((1, 4, 10, 9), (8, 4, 3, 3), {"strides": (2, 2), "pads": (0, 1, 1, 0)}),
    # 8 channels per group: a 72-long reduction, not depthwise-like, so the rule picks packed
    "group3_dilated": ((2, 24, 9, 9), (9, 8, 3, 3), {"group": 3, "dilations": (2, 1), "pads": (2, 1, 2, 1)}),
}


@pytest.mark.parametrize("schedule", [{}, {"conv_orient": "lanes"}, {"conv_orient": "rows", "conv_rows": 2},
                                      {"conv_algo": "im2col"}], ids=["rule", "lanes", "rows2", "im2col_asked"])
@pytest.mark.parametrize("case", list(PROLOGUE_GRID))
def test_conv_prologue_matches_reference(case: str, schedule: dict[str, object]) -> None:
    """The ops that compute a Conv's input run in the packed kernel's input copy: an unfolded
    BatchNorm + Relu (DenseNet's pre-activation: relu(bn(0)) is not 0, so a padding that went
    through the prologue would be wrong) and a per-image, per-channel scale (a squeeze-and-excite
    block's), with an epilogue after the Conv. A schedule asking for another algorithm gets the
    packed one: only its copy applies a prologue."""
    xs, ws, attrs = PROLOGUE_GRID[case]

    def build(g: GraphBuilder) -> Tensor:
        x = g.input("x", xs)
        se = g.sigmoid(g.input("s", (xs[0], xs[1], 1, 1)))
        pre = g.mul(g.relu(_bn(g, x, xs[1])), se)
        return g.relu(g.op("Conv", pre, _const(g, ws, 1), _const(g, (ws[0],), 2), **attrs))

    graph = _graph(build)
    src = kernel_source(graph, [n.name for n in graph.nodes], schedule)
    assert src.kind == "conv" and "dispatcher" in src.source
    assert {a.value for a in src.args if a.role == "in"} >= {"x", "s"}
    _check(graph, schedule)


def test_conv_prologue_is_refused_where_the_rule_picks_another_algorithm() -> None:
    """A depthwise conv with a tiny output runs direct, which copies nothing: no prologue there
    (the fusion pass then leaves the producer a kernel of its own)."""
    graph = _graph(lambda g: g.op("Conv", g.relu(g.input("x", (1, 8, 4, 4))), _const(g, (8, 1, 3, 3), 1),
                                  group=8, pads=(1, 1, 1, 1)))
    with pytest.raises(NotFusable, match="packed"):
        kernel_source(graph, [n.name for n in graph.nodes])


def test_conv_algo_rule_packed_but_direct_plane_or_chan_for_depthwise() -> None:
    assert choose_conv_algo(1, 1, 3, 3, group=16, positions=784) == "plane"  # 28x28, one block of channels
    assert choose_conv_algo(1, 1, 3, 3, group=32, positions=784) == "chan"  # 28x28, two blocks
    assert choose_conv_algo(1, 1, 3, 3, group=96, positions=3136, strided=True) == "chan"  # s2, 56x56
    assert choose_conv_algo(1, 1, 3, 3, group=32, positions=12544) == "plane"  # 112x112
    assert choose_conv_algo(1, 1, 3, 3, group=16, positions=256) == "plane"  # 3x3 @16
    assert choose_conv_algo(1, 1, 5, 5, group=8, positions=256) == "plane"  # 5x5 @16, half a block of lanes
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=256) == "chan"  # 5x5 @16: a wide window
    assert choose_conv_algo(1, 1, 7, 7, group=96, positions=3136) == "chan"  # 7x7 @56
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=196) == "chan"  # 5x5 @14
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=49) == "chan"  # 5x5 @7
    assert choose_conv_algo(1, 1, 3, 3, group=32, positions=16) == "chan"  # depthwise, 4x4 output
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=36) == "chan"  # 6x6
    assert choose_conv_algo(1, 1, 7, 7, group=32, positions=4) == "direct"  # 7x7, 2x2 output
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=4, strided=True) == "chan"  # s2, 2x2 output
    assert choose_conv_algo(1, 1, 5, 5, group=32, positions=1, strided=True) == "direct"  # s2, 1x1 output
    assert choose_conv_algo(2, 2, 3, 3, group=32, positions=16) == "direct"  # two channels per group, 4x4
    assert choose_conv_algo(2, 2, 3, 3, group=32, positions=64) == "plane"  # two per group
    assert choose_conv_algo(64, 64, 3, 3) == "packed"
    assert choose_conv_algo(512, 512, 3, 3, positions=49) == "packed"
    assert choose_conv_algo(3, 64, 7, 7) == "packed"  # the stem
    assert choose_conv_algo(8, 8, 3, 3, group=32) == "packed"  # grouped, 72-long reduction


def test_conv_algo_rule_axpy_for_1x1_convs_with_a_short_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 512)  # no BLAS 1x1 convs (the next test)
    assert choose_conv_algo(8, 48, 1, 1, positions=1024) == "axpy"
    assert choose_conv_algo(16, 96, 1, 1, positions=64) == "axpy"
    assert choose_conv_algo(32, 8, 1, 1, positions=49) == "axpy"  # few output channels
    assert choose_conv_algo(32, 64, 1, 1, positions=49) == "packed"
    assert choose_conv_algo(24, 144, 1, 1, positions=256) == "packed"
    assert choose_conv_algo(8, 48, 1, 1, positions=1) == "packed"  # a squeeze-and-excite 1x1 plane
    assert choose_conv_algo(8, 48, 1, 1, positions=1024, strided=True) == "packed"
    assert choose_conv_algo(8, 48, 1, 1, positions=1024, padded=True) == "packed"
    assert choose_conv_algo(8, 48, 1, 1, positions=1024, prologue=True) == "packed"
    assert choose_conv_algo(8, 48, 3, 3, positions=1024) == "packed"
    assert choose_conv_algo(8, 48, 1, 1, group=2, positions=1024) != "axpy"


def test_conv_algo_rule_blas_for_large_1x1_convs_with_16_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On AVX2, 1x1 convs of 14x14 outputs or more run on BLAS, at any stride (reading the input
    in place at stride 1); smaller ones, padded ones and prologues stay packed, short reductions
    axpy. With AVX-512 they all stay packed."""
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 256)
    assert choose_conv_algo(64, 256, 1, 1, positions=3136) == "shifted"
    assert choose_conv_algo(24, 144, 1, 1, positions=784) == "shifted"
    assert choose_conv_algo(256, 512, 1, 1, positions=784, strided=True) == "im2col"
    assert choose_conv_algo(576, 96, 1, 1, positions=49) == "packed"
    assert choose_conv_algo(64, 256, 1, 1, positions=3136, padded=True) == "packed"
    assert choose_conv_algo(64, 256, 1, 1, positions=3136, prologue=True) == "packed"
    assert choose_conv_algo(16, 96, 1, 1, positions=3136) == "axpy"
    assert choose_conv_algo(64, 64, 3, 3, positions=3136) == "packed"
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 512)
    assert choose_conv_algo(64, 256, 1, 1, positions=3136) == "packed"


@pytest.mark.parametrize(("xs", "m", "dtype"), [
    ((2, 16, 17, 17), 5, "float32"),  # 289 positions: blocks of 256 and 33
    ((1, 3, 40, 40), 4, "float32"),  # K = 3: blocks of 1360 and 240
    ((2, 1, 4, 5), 7, "float32"),  # one input channel, 20 positions
    ((2, 8, 6, 6), 3, "float64"),
])
def test_axpy_conv_matches_reference(xs: tuple[int, ...], m: int, dtype: str) -> None:
    """The rule's pick for these 1x1 convs, with a bias and a residual Add read per element."""
    rng = np.random.default_rng(4)

    def build(g: GraphBuilder) -> Tensor:
        w = g.const(rng.standard_normal((m, xs[1], 1, 1)).astype(dtype))
        b = g.const(rng.standard_normal(m).astype(dtype))
        y = g.op("Conv", g.input("x", xs), w, b)
        return g.relu(g.add(y, g.input("r", (xs[0], m, *xs[2:]))))

    g = GraphBuilder("axpy", dtype=dtype)
    g.output(build(g))
    graph = g.build()
    src = kernel_source(graph, [n.name for n in graph.nodes])
    assert "xs = np.empty" in src.source  # the axpy kernel's input block
    prog = build_program(_one_kernel(graph))
    inputs = {n: rng.standard_normal(graph.values[n].shape).astype(dtype) for n in graph.inputs}
    got = prog.run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("orient", ["rows", "lanes"])
@pytest.mark.parametrize("case", ["3x3_pad1", "3x3_s2_asym", "group3_dilated", "5x5_wide_stride", "1d", "1x1"])
def test_packed_conv_both_orientations_match_reference(case: str, orient: str) -> None:
    """Each layout of the micro-kernel (lanes over grid positions or over output channels)."""
    xs, ws, attrs, bias = GRID[case]

    def build(g: GraphBuilder) -> Tensor:
        ins = [g.input("x", xs), _const(g, ws, 1)] + ([_const(g, (ws[0],), 2)] if bias else [])
        return g.relu(g.op("Conv", *ins, **attrs))

    _check(_graph(build), {"conv_algo": "packed", "conv_orient": orient, "conv_rows": 2})


def test_packed_conv_packs_constant_weights_once_and_input_weights_per_call() -> None:
    """Constant weights become a derived argument computed when the program is built; weights
    that are an input of the graph (a training step) are packed inside the kernel on each call."""
    const = _graph(lambda g: g.op("Conv", g.input("x", (1, 5, 9, 9)), _const(g, (20, 5, 3, 3), 1), pads=(1, 1, 1, 1)))
    src = kernel_source(const, [n.name for n in const.nodes], {"conv_algo": "packed"})
    assert len(src.derived) == 1 and src.derived[0].fn.endswith(":pack_weights")
    assert any(a.value == src.derived[0].value for a in src.args)
    _check(const, {"conv_algo": "packed"})

    def build(g: GraphBuilder) -> Tensor:
        return g.op("Conv", g.input("x", (1, 5, 9, 9)), g.input("w", (20, 5, 3, 3)), pads=(1, 1, 1, 1))

    graph = _graph(build)
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "packed"})
    assert src.derived == ()
    _check(graph, {"conv_algo": "packed"})


@pytest.mark.parametrize("orient", ["rows", "lanes"])
def test_packed_convs_of_one_stage_share_one_kernel(orient: str) -> None:
    """The packed kernel takes its channel counts and register block at run time: convs of one
    geometry (image size, kernel, padding, stride, rows per task) and epilogue that differ in those
    are one source (one compile); each still matches the reference, and each is its own instance
    (what a program's hash sees). Another geometry, or another ``conv_rows``, is another source."""
    cases = [(5, 6, 1), (7, 10, 1), (4, 20, 1), (3, 33, 1)]  # (C, M, group): all small enough to run serially

    def conv(c: int, m: int, group: int, hw: tuple[int, int] = (9, 8)) -> Graph:
        return _graph(lambda g: g.relu(g.op("Conv", g.input("x", (2, c, *hw)), _const(g, (m, c // group, 3, 3), 1),
                                            _const(g, (m,), 2), pads=(1, 1, 1, 1), group=group)))

    schedule = {"conv_algo": "packed", "conv_orient": orient}
    srcs = []
    for c, m, group in cases:
        graph = conv(c, m, group)
        srcs.append(kernel_source(graph, [n.name for n in graph.nodes], schedule))
        _check(graph, schedule)
    assert len({s.key for s in srcs}) == 1
    assert len({s.params for s in srcs}) == len({s.instance for s in srcs}) == len(cases)
    assert len({s.params[PACKED_PARAMS.index("which")] for s in srcs}) > 1  # different register blocks
    other = conv(5, 6, 1, (10, 8))
    assert kernel_source(other, [n.name for n in other.nodes], schedule).key != srcs[0].key
    graph = conv(5, 6, 1)
    rows = kernel_source(graph, [n.name for n in graph.nodes], {**schedule, "conv_rows": 1})
    assert rows.key != srcs[0].key and rows.instance != srcs[0].instance


def test_unknown_conv_algo_is_an_error() -> None:
    graph = _graph(lambda g: g.op("Conv", g.input("x", (1, 2, 4, 4)), _const(g, (2, 2, 1, 1), 1)))
    with pytest.raises(ValueError, match="conv_algo"):
        kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "winograd"})


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_conv_with_a_relu_or_clip_epilogue_indexes_unsigned(act: str) -> None:
    """Relu and Clip are selects (``np.maximum``, ``np.minimum``), not libm calls: their kernels
    index with unsigned integers (module docstring, "Index arithmetic"), which lets LLVM vectorize
    the input copy at stride 2: a 3x3 window's rows go to both column phases in one loop, a 1x1's
    are split into even and odd columns first."""
    graph = _graph(lambda g: g.op(act, g.op("Conv", g.input("x", (2, 3, 13, 12)), _const(g, (8, 3, 3, 3), 1),
                                            strides=(2, 2), pads=(1, 1, 1, 1))))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "packed"})
    assert "= xi0[numba.uint64(j * 2 + 0)]" in src.source and "= xi0[numba.uint64(j * 2 + 1)]" in src.source
    _check(graph, {"conv_algo": "packed"})
    graph = _graph(lambda g: g.op(act, g.op("Conv", g.input("x", (2, 3, 13, 12)), _const(g, (8, 3, 1, 1), 1),
                                            strides=(2, 2))))
    src = kernel_source(graph, [n.name for n in graph.nodes], {"conv_algo": "packed"})
    assert "de[0, numba.uint64(j)] = xi0[numba.uint64(2 * j)]" in src.source
    _check(graph, {"conv_algo": "packed"})



@pytest.mark.parametrize(("h", "w", "rows"), [(15, 15, 0), (7, 7, 3), (9, 31, 2), (5, 16, 0)])
def test_rows_layout_epilogue_over_a_gathered_run_matches_reference(h: int, w: int, rows: int) -> None:
    """The packed ``rows`` layout gathers a channel's output rows out of the grid (microkernel
    rows_copy) and runs the epilogue (bias, a residual read at each position, Relu) over them
    as one run, when the output width is not a whole number of vectors (15, 7, 31; 16 keeps the
    per-row loop); with blocks of rows, each block's run starts at its own first row."""
    def build(g: GraphBuilder) -> Tensor:
        y = g.op("Conv", g.input("x", (2, 5, h, w)), _const(g, (12, 5, 3, 3), 1), _const(g, (12,), 2),
                 pads=(1, 1, 1, 1))
        return g.op("Relu", g.op("Add", y, g.input("r", (2, 12, h, w))))

    graph = _graph(build)
    schedule: dict[str, object] = {"conv_algo": "packed", "conv_orient": "rows", **({"conv_rows": rows} if rows else {})}
    src = kernel_source(graph, [n.name for n in graph.nodes], schedule)
    assert ("rcp(" in src.source) == (w % microkernel.lanes("float32") != 0)
    _check(graph, schedule)


@pytest.mark.parametrize(
    ("xs", "ws", "attrs", "rows"),
    [
        # SqueezeNet's stem: no padding, the rows of one block split in two
        ((2, 3, 16, 16), (8, 3, 3, 3), {"strides": (2, 2)}, 3),
        # odd width, padding on every side, blocks of one row (the halo row is the next block's)
        ((2, 3, 15, 13), (8, 3, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}, 1),
        # 7x7 stem: three pad columns, rows above and below the input in every block
        ((1, 3, 21, 19), (8, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}, 2),
        # patchify (ConvNeXt 4x4 s4, ViT 8x8 s8): no grid column outside the input; a last column
        # past every window
        ((2, 3, 17, 17), (8, 3, 4, 4), {"strides": (4, 4)}, 0),
        ((1, 3, 16, 40), (16, 3, 8, 8), {"strides": (8, 8)}, 0),
        # a dilated strided window, asymmetric pads, more than 16 column groups (a run-time count)
        ((1, 2, 9, 70), (4, 2, 3, 3), {"strides": (2, 2), "dilations": (1, 3), "pads": (0, 2, 1, 3)}, 0),
    ],
)
def test_strided_packed_conv_copies_each_row_into_its_phase_planes_once(
        xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, object], rows: int) -> None:
    """A strided conv whose taps read every column phase copies each input row once into all of
    them (conv.py ``_phase_rows_fill``), with the pads, the rows outside the input and the slack
    past the block written as zeros rather than cleared beforehand: every element of the planes
    a tap reads must be written, which these shapes cover (pads of 0 to 3 columns, a last block
    shorter than the others)."""
    graph = _graph(lambda g: g.op("Relu", g.op("Conv", g.input("x", xs), _const(g, ws, 1), **attrs)))
    schedule: dict[str, object] = {"conv_algo": "packed", **({"conv_rows": rows} if rows else {})}
    src = kernel_source(graph, [n.name for n in graph.nodes], schedule)
    assert "de[0," not in src.source
    prog = build_program(_one_kernel(graph, schedule))
    rng = np.random.default_rng(0)
    for _ in range(3):  # runs after the first reuse the planes' memory: an element not written shows
        x = rng.standard_normal(xs).astype(np.float32)
        got = prog.run({"x": x})[graph.outputs[0]]
        np.testing.assert_allclose(got, run_graph(graph, {"x": x}, dtype="float64")[graph.outputs[0]],
                                   rtol=RTOL, atol=ATOL)


def test_a_serial_packed_conv_is_not_cut_into_blocks_for_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are cut into blocks to keep every thread busy only in a parallel kernel: a serial one
    cut for two threads copied its halo rows twice and called the micro-kernel twice as often."""
    import numba

    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    small = _graph(lambda g: g.relu(g.op("Conv", g.input("x", (2, 16, 3, 3)), _const(g, (16, 16, 3, 3), 1),
                                         pads=(1, 1, 1, 1))))
    src = kernel_source(small, [n.name for n in small.nodes], {"conv_algo": "packed"})
    assert "parallel=False" in src.source
    assert src.params[PACKED_PARAMS.index("nblk")] == 1
    big = _graph(lambda g: g.relu(g.op("Conv", g.input("x", (1, 64, 8, 8)), _const(g, (64, 64, 3, 3), 1),
                                       pads=(1, 1, 1, 1))))
    src = kernel_source(big, [n.name for n in big.nodes], {"conv_algo": "packed"})
    assert "parallel=True" in src.source
    assert src.params[PACKED_PARAMS.index("nblk")] >= 2
    _check(small, {"conv_algo": "packed"})


def test_packed_tasks_keep_their_planes_in_l2_and_are_not_cut_for_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """On one thread a parallel kernel is not cut into blocks for threads it does not have (every
    block streams the weights again), and a task's phase planes and output block stay within
    the L2 share: a 1 MiB L2 takes fewer rows per task than a 2 MiB one."""
    from fusiontune.codegen import target

    monkeypatch.setattr(conv_module, "DENSE_PARALLEL_FACTOR", 1)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    monkeypatch.setattr(target, "l2_bytes", lambda: 2 * 1024 * 1024)
    deep = _graph(lambda g: g.op("Conv", g.input("x", (1, 256, 7, 7)), _const(g, (256, 256, 3, 3), 1),
                                 pads=(1, 1, 1, 1)))
    src = kernel_source(deep, [n.name for n in deep.nodes], {"conv_algo": "packed"})
    assert src.params[PACKED_PARAMS.index("nblk")] == 1
    wide = _graph(lambda g: g.op("Conv", g.input("x", (1, 32, 64, 64)), _const(g, (32, 32, 3, 3), 1),
                                 pads=(1, 1, 1, 1)))

    def rows(l2: int) -> int:
        monkeypatch.setattr(target, "l2_bytes", lambda: l2)
        src = kernel_source(wide, [n.name for n in wide.nodes], {"conv_algo": "packed"})
        k = src.params[PACKED_PARAMS.index("rows")]
        planes = src.params[PACKED_PARAMS.index("cg")] * src.params[PACKED_PARAMS.index("cs")] * 4
        assert planes + 32 * k * src.params[PACKED_PARAMS.index("wp")] * 4 <= l2 * conv_module.PACKED_PLANES_SHARE
        return k

    assert 1 <= rows(1024 * 1024) < rows(2 * 1024 * 1024) < 64
    _check(wide, {"conv_algo": "packed"})


def test_weight_heavy_packed_convs_take_the_whole_l2_and_plane_heavy_ones_a_quarter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv whose weights outweigh its planes and output runs in one block where they fit the
    L2, not cut to fit a quarter of it (each block streams all its weights again); one whose
    planes outweigh its weights keeps the quarter. A 64 KiB L2 stands in for AMD's 512 KiB one
    (3x3 512->512 @7 there), so that the conv's reduction stays short enough to check against
    float64: 3x3 64->64 @8, 147 KB of weights against 46 KB of planes and output."""
    from fusiontune.codegen import target

    monkeypatch.setattr(conv_module, "DENSE_PARALLEL_FACTOR", 1)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    monkeypatch.setattr(target, "l2_bytes", lambda: 64 * 1024)
    heavy = _graph(lambda g: g.op("Conv", g.input("x", (1, 64, 8, 8)), _const(g, (64, 64, 3, 3), 1),
                                  pads=(1, 1, 1, 1)))
    src = kernel_source(heavy, [n.name for n in heavy.nodes], {"conv_algo": "packed"})
    assert src.params[PACKED_PARAMS.index("nblk")] == 1
    monkeypatch.setattr(conv_module, "PACKED_WEIGHT_HEAVY_BYTES", 0)  # the quarter: cut in blocks
    src = kernel_source(heavy, [n.name for n in heavy.nodes], {"conv_algo": "packed"})
    assert src.params[PACKED_PARAMS.index("nblk")] >= 2
    monkeypatch.setattr(conv_module, "PACKED_WEIGHT_HEAVY_BYTES", 512 * 1024)
    wide = _graph(lambda g: g.op("Conv", g.input("x", (1, 16, 32, 32)), _const(g, (16, 16, 3, 3), 1),
                                 pads=(1, 1, 1, 1)))
    src = kernel_source(wide, [n.name for n in wide.nodes], {"conv_algo": "packed"})
    k = src.params[PACKED_PARAMS.index("rows")]
    assert k < 32
    planes = src.params[PACKED_PARAMS.index("cg")] * src.params[PACKED_PARAMS.index("cs")] * 4
    assert planes + 16 * k * src.params[PACKED_PARAMS.index("wp")] * 4 <= 64 * 1024 * conv_module.PACKED_PLANES_SHARE
    # the one block against float64: outputs are sums of 576 products of unit normals (std 24),
    # so float32's rounding is about 1e-5 of an output whatever the blocks; atol is 4e-6 of the std
    prog = build_program(_one_kernel(heavy, {"conv_algo": "packed"}))
    x = np.random.default_rng(0).standard_normal((1, 64, 8, 8)).astype(np.float32)
    want = run_graph(heavy, {heavy.inputs[0]: x}, dtype="float64")[heavy.outputs[0]]
    np.testing.assert_allclose(prog.run({heavy.inputs[0]: x})[heavy.outputs[0]], want, rtol=RTOL, atol=1e-4)
