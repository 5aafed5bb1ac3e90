"""The fused backward ops (ir/_ops_grad.py): references against finite differences of the forward
ops they differentiate, against the primitive backward (their expansions), and the statistics a
forward normalization saves for them (``save_stats=1``). All float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from fusiontune.ir import Graph, GraphBuilder, run_graph
from fusiontune.ir.expand import expand
from fusiontune.ir.graph import Node
from fusiontune.ir.ops import layer_norm_stats, rms_norm_rstd, run_reference

H = 1e-6


def _ref(op: str, arrays: Sequence[np.ndarray], n_out: int = 1, **attrs: object) -> tuple[np.ndarray, ...]:
    node = Node("n", op, tuple(f"i{k}" for k in range(len(arrays))), tuple(f"o{k}" for k in range(n_out)), attrs)
    return run_reference(node, arrays)


def _vjp_numeric(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, cot: np.ndarray) -> np.ndarray:
    """Central differences of ``sum(cot * f(x))`` with respect to ``x``."""
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += H
        down[i] -= H
        out[i] = (np.sum(cot * f(up)) - np.sum(cot * f(down))) / (2 * H)
    return out


RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 6))
DY = RNG.standard_normal((3, 6))
GAMMA = RNG.uniform(0.5, 1.5, 6)
BETA = RNG.standard_normal(6)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_grad_is_the_vjp_of_softmax(axis: int) -> None:
    (y,) = _ref("Softmax", [X], axis=axis)
    (dx,) = _ref("SoftmaxGrad", [y, DY], axis=axis)
    want = _vjp_numeric(lambda v: _ref("Softmax", [v], axis=axis)[0], X, DY)
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("variance", ["two_pass", "one_pass"])
@pytest.mark.parametrize("saved", [False, True])
def test_layer_norm_grad_is_the_vjp_of_layer_norm(variance: str, saved: bool) -> None:
    stats = list(layer_norm_stats(X, 1e-5, variance)) if saved else []
    dx, dgamma_rows = _ref("LayerNormGrad", [X, GAMMA, DY, *stats], 2, variance=variance)

    def forward(x: np.ndarray, gamma: np.ndarray = GAMMA) -> np.ndarray:
        return _ref("LayerNorm", [x, gamma, BETA], variance=variance)[0]

    np.testing.assert_allclose(dx, _vjp_numeric(forward, X, DY), rtol=1e-5, atol=1e-7)
    want_gamma = _vjp_numeric(lambda g: forward(X, g), GAMMA, DY)
    np.testing.assert_allclose(dgamma_rows.sum(axis=0), want_gamma, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("saved", [False, True])
def test_rms_norm_grad_is_the_vjp_of_rms_norm(saved: bool) -> None:
    stats = [rms_norm_rstd(X, 1e-6)] if saved else []
    dx, dgamma_rows = _ref("RmsNormGrad", [X, GAMMA, DY, *stats], 2)

    def forward(x: np.ndarray, gamma: np.ndarray = GAMMA) -> np.ndarray:
        return _ref("RMSNorm", [x, gamma])[0]

    np.testing.assert_allclose(dx, _vjp_numeric(forward, X, DY), rtol=1e-5, atol=1e-7)
    want_gamma = _vjp_numeric(lambda g: forward(X, g), GAMMA, DY)
    np.testing.assert_allclose(dgamma_rows.sum(axis=0), want_gamma, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("saved", [False, True])
def test_gelu_grad_is_the_vjp_of_gelu(approximate: str, saved: bool) -> None:
    x = X * 2.5  # into both tails
    cdf = list(_ref("GeluCdf", [x], approximate=approximate)) if saved else []
    (dx,) = _ref("GeluGrad", [x, DY, *cdf], approximate=approximate)
    want = _vjp_numeric(lambda v: _ref("Gelu", [v], approximate=approximate)[0], x, DY)
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_x_times_its_cdf(approximate: str) -> None:
    (y,) = _ref("Gelu", [X], approximate=approximate)
    (c,) = _ref("GeluCdf", [X], approximate=approximate)
    np.testing.assert_allclose(X * c, y, rtol=1e-14, atol=1e-15)


def test_relu_grad_reads_the_output_and_is_the_vjp_of_relu() -> None:
    x = np.where(np.abs(X) < 0.05, 0.1, X)  # off the kink
    (y,) = _ref("Relu", [x])
    (dx,) = _ref("ReluGrad", [y, DY])
    np.testing.assert_allclose(dx, _vjp_numeric(lambda v: _ref("Relu", [v])[0], x, DY), atol=1e-8)
    # 0 at the kink (Relu's subgradient), NaN input: no gradient (y > 0 is false for NaN)
    (edge,) = _ref("ReluGrad", [np.array([0.0, np.nan, 2.0]), np.array([1.0, 1.0, 1.0])])
    np.testing.assert_array_equal(edge, [0.0, 0.0, 1.0])


def test_attention_grad_is_the_vjp_of_attention() -> None:
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    mask = np.where(rng.random((3, 5)) < 0.3, -1e9, 0.0)
    dy = rng.standard_normal((2, 3, 3))
    grads = _ref("AttentionGrad", [q, k, v, dy, mask], 3, scale=0.6)
    for i, x in enumerate((q, k, v)):

        def forward(arg: np.ndarray, i: int = i) -> np.ndarray:
            args = [q, k, v]
            args[i] = arg
            return _ref("Attention", [*args, mask], scale=0.6)[0]

        np.testing.assert_allclose(grads[i], _vjp_numeric(forward, x, dy), rtol=1e-5, atol=1e-7)


# ---- the expansions are the primitive backward -----------------------------------------------------
def _one_op(op: str, shapes: Sequence[tuple[int, ...]], n_out: int, **attrs: object) -> Graph:
    b = GraphBuilder(op, "float64")
    out = b.op(op, *(b.input(f"i{k}", s) for k, s in enumerate(shapes)), n_outputs=n_out, **attrs)
    b.output(*(out if n_out > 1 else (out,)))
    return b.build()


EXPANSION_CASES = [
    ("SoftmaxGrad", [(4, 7), (4, 7)], 1, {"axis": 0}),
    ("LayerNormGrad", [(4, 7), (7,), (4, 7)], 2, {}),
    ("LayerNormGrad", [(4, 7), (7,), (4, 7)], 2, {"variance": "one_pass"}),
    ("LayerNormGrad", [(4, 7), (7,), (4, 7), (4, 1), (4, 1)], 2, {}),
    ("RmsNormGrad", [(4, 7), (7,), (4, 7)], 2, {}),
    ("RmsNormGrad", [(4, 7), (7,), (4, 7), (4, 1)], 2, {}),
    ("GeluGrad", [(4, 7), (4, 7)], 1, {}),
    ("GeluGrad", [(4, 7), (4, 7)], 1, {"approximate": "tanh"}),
    ("GeluGrad", [(4, 7), (4, 7), (4, 7)], 1, {}),
    ("GeluGrad", [(4, 7), (4, 7), (4, 7)], 1, {"approximate": "tanh"}),
    ("GeluCdf", [(4, 7)], 1, {"approximate": "tanh"}),
    ("ReluGrad", [(4, 7), (4, 7)], 1, {}),
    ("AttentionGrad", [(2, 4, 3), (2, 5, 3), (2, 5, 6), (2, 4, 6)], 3, {"scale": 0.5}),
    ("AttentionGrad", [(2, 4, 3), (2, 5, 3), (2, 5, 6), (2, 4, 6), (4, 5)], 3, {"scale": 0.5}),
    ("LayerNorm", [(4, 7), (7,), (7,)], 3, {"save_stats": 1}),
    ("AddLayerNorm", [(4, 7), (4, 7), (7,), (7,)], 4, {"save_stats": 1}),
    ("RMSNorm", [(4, 7), (7,)], 2, {"save_stats": 1}),
    ("AddRmsNorm", [(4, 7), (4, 7), (7,)], 3, {"save_stats": 1}),
]


@pytest.mark.parametrize(
    "op, shapes, n_out, attrs", EXPANSION_CASES, ids=[f"{c[0]}-{len(c[1])}-{c[3]}" for c in EXPANSION_CASES]
)
def test_expansion_equals_the_reference(op: str, shapes: list[tuple[int, ...]], n_out: int, attrs: dict[str, object]) -> None:
    graph = _one_op(op, shapes, n_out, **attrs)
    e = expand(graph.nodes[0], graph.values)
    assert all(n.op != op for n in e.nodes)
    primitive = Graph(
        "expanded", {**graph.values, **e.values}, e.nodes, graph.inputs, graph.outputs,
        {**graph.constants, **e.constants},
    )
    rng = np.random.default_rng(3)
    feed = {name: rng.standard_normal(graph.values[name].shape) for name in graph.inputs}
    for name in graph.inputs:  # a saved rstd (the last (4, 1) input of a grad op) is positive
        if graph.values[name].shape == (4, 1):
            feed[name] = np.abs(feed[name]) + 0.5
    want, got = run_graph(graph, feed), run_graph(primitive, feed)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-13, err_msg=name)


def test_saved_statistics_are_the_forward_ones() -> None:
    y, s, mean, rstd = _ref("AddLayerNorm", [X, DY, GAMMA, BETA], 4, save_stats=1)
    want_mean, want_rstd = layer_norm_stats(X + DY, 1e-5)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-14)
    np.testing.assert_allclose(rstd, want_rstd, rtol=1e-14)
    assert mean.shape == rstd.shape == (3, 1)
    (plain,) = _ref("AddLayerNorm", [X, DY, GAMMA, BETA], 2)[:1]
    np.testing.assert_array_equal(plain, y)


def test_grad_op_shape_rules_refuse_misfits() -> None:
    b = GraphBuilder("bad", "float64")
    x, g = b.input("x", (4, 7)), b.input("g", (7,))
    with pytest.raises(ValueError, match="saved statistic"):
        b.op("LayerNormGrad", x, g, x, b.input("m", (4, 7)), b.input("r", (4, 7)), n_outputs=2)
    with pytest.raises(ValueError, match="shape of"):
        b.op("SoftmaxGrad", x, b.input("dy", (4, 6)))
