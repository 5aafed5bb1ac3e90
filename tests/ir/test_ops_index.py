"""The index, layout and contraction ops of real exports (ir/_ops_index.py, ir/_onnx_ops_index.py)
against onnxruntime: one-node ONNX models built with onnx.helper, imported, then run by the
interpreter (the definition) and, for the ops with kernels of their own, as one compiled program.

Every case covers an opset form of the op (attributes that became inputs, defaults when absent),
negative indices, and the attribute values exporters write (torch.onnx's dynamo exporter and
TorchScript at opset 17: ``tril``/``triu`` as Trilu, ``cumsum``, ``F.pad`` modes, ``einsum`` of
attention scores, ``nn.ConvTranspose2d`` / ``1d`` with ``output_padding``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402

from fusiontune.ir import Graph, run_graph  # noqa: E402
from fusiontune.ir.onnx_import import OnnxImportError, import_onnx  # noqa: E402
from fusiontune.passes.fused_graph import FusedGraph  # noqa: E402
from fusiontune.runtime import build_program  # noqa: E402

RNG = np.random.default_rng(7)


def _elem(arr: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def save_node(
    tmp_path: Path, op: str, inputs: Mapping[str, np.ndarray], inits: Mapping[str, np.ndarray] | None = None,
    opset: int = 17, out_elem: int | None = None, order: Sequence[str] | None = None, **attrs: Any,
) -> Path:
    """A model of one ``op`` node reading ``order`` (default: inputs then initializers, "" for an
    omitted optional input), writing ``y``."""
    inits = dict(inits or {})
    names = list(order) if order is not None else [*inputs, *inits]
    node = helper.make_node(op, names, ["y"], name=op.lower(), **attrs)
    first = next(iter(inputs.values()))
    graph = helper.make_graph(
        [node], "m",
        [helper.make_tensor_value_info(k, _elem(v), v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", out_elem if out_elem is not None else _elem(first), None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return _save(tmp_path / f"{op}_{opset}.onnx", graph, opset)


def _save(path: Path, graph: Any, opset: int) -> Path:
    """Save with the output's shape filled in by onnx's shape inference (onnx.checker wants one)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    inferred = onnx.shape_inference.infer_shapes(model)
    out = inferred.graph.output[0]
    if not out.type.tensor_type.HasField("shape"):
        out.type.tensor_type.shape.SetInParent()  # unknown rank: an empty shape field
    onnx.save(inferred, str(path))
    return path


def onnxruntime_y(path: Path, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))[0]


def agree(path: Path, feeds: Mapping[str, np.ndarray], kernels: bool = False, rtol: float = 1e-5, atol: float = 1e-6) -> Graph:
    """Import ``path``; the interpreter (and, with ``kernels``, the compiled program) must match
    onnxruntime. Returns the imported graph."""
    want = onnxruntime_y(path, feeds)
    graph = import_onnx(path)
    got = run_graph(graph, feeds, dtype=None)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    if kernels:
        out = build_program(FusedGraph.singletons(graph)).run(feeds)["y"]
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)
    return graph


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ops_of(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


# ---- GatherND, GatherElements, ScatterND ---------------------------------------------------------
@pytest.mark.parametrize("opset", [11, 13])
def test_gather_nd_with_live_negative_indices_matches_onnxruntime(tmp_path: Path, opset: int) -> None:
    feeds = {"x": normal(4, 3, 5), "i": np.array([[[0, -1], [3, 2]], [[-4, 0], [1, -3]]], np.int64)}
    graph = agree(save_node(tmp_path, "GatherND", feeds, opset=opset), feeds, kernels=True)
    assert ops_of(graph) == ["GatherND"]


def test_gather_nd_batch_dims_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": normal(2, 4, 3, 5), "i": np.array([[[1, 2], [-1, 0]], [[0, -3], [3, 1]]], np.int64)}
    agree(save_node(tmp_path, "GatherND", feeds, batch_dims=1), feeds, kernels=True)


@pytest.mark.parametrize("axis", [0, -1])
def test_gather_elements_matches_onnxruntime(tmp_path: Path, axis: int) -> None:
    x = normal(3, 5)
    n = x.shape[axis]
    feeds = {"x": x, "i": RNG.integers(-n, n, (2, 4) if axis == -1 else (4, 5)).astype(np.int64)}
    agree(save_node(tmp_path, "GatherElements", feeds, axis=axis), feeds, kernels=True)


@pytest.mark.parametrize(
    ("opset", "reduction", "indices"),
    [
        (11, None, [[1], [-1], [0]]),
        (16, "add", [[1, 0], [1, 0], [-1, 2]]),
        (16, "mul", [[2], [2], [0]]),
        (18, "max", [[0, 1], [0, 1], [2, -2]]),
        (18, "min", [[1, 1], [-3, 0], [1, 1]]),
    ],
)
def test_scatter_nd_matches_onnxruntime(tmp_path: Path, opset: int, reduction: str | None, indices: list) -> None:
    idx = np.array(indices, np.int64)
    x = normal(3, 4)
    upd = normal(*idx.shape[:-1], *x.shape[idx.shape[-1] :])
    feeds = {"x": x, "u": upd}
    attrs = {"reduction": reduction} if reduction else {}
    path = save_node(tmp_path, "ScatterND", feeds, {"i": idx}, opset=opset, order=["x", "i", "u"], **attrs)
    agree(path, feeds, kernels=True)


def test_scatter_nd_with_live_indices_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": normal(5, 2, 3), "i": np.array([[4], [-5], [2]], np.int64), "u": normal(3, 2, 3)}
    agree(save_node(tmp_path, "ScatterND", feeds), feeds, kernels=True)


# ---- CumSum, Trilu, Tile -------------------------------------------------------------------------
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [np.array(1, np.int64), np.array([-1], np.int32)])
def test_cumsum_matches_onnxruntime(tmp_path: Path, axis: np.ndarray, exclusive: int, reverse: int) -> None:
    feeds = {"x": normal(3, 6)}
    path = save_node(tmp_path, "CumSum", feeds, {"axis": axis}, exclusive=exclusive, reverse=reverse)
    graph = agree(path, feeds, kernels=True)
    assert graph.nodes[0].attrs["axis"] == 1


def test_cumsum_of_int64_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": RNG.integers(-5, 5, (4, 3)).astype(np.int64)}
    agree(save_node(tmp_path, "CumSum", feeds, {"axis": np.array(0, np.int64)}), feeds)


def test_cumsum_with_a_live_axis_fails_naming_it(tmp_path: Path) -> None:
    feeds = {"x": normal(3, 6), "axis": np.array(1, np.int64)}
    with pytest.raises(OnnxImportError, match="CumSum's axis must be a constant"):
        import_onnx(save_node(tmp_path, "CumSum", feeds))


@pytest.mark.parametrize(("upper", "k"), [(1, None), (0, None), (1, 1), (0, -2), (1, -1)])
def test_trilu_matches_onnxruntime(tmp_path: Path, upper: int, k: int | None) -> None:
    feeds = {"x": normal(2, 4, 5)}
    inits = {"k": np.array(k, np.int64)} if k is not None else {}
    agree(save_node(tmp_path, "Trilu", feeds, inits, upper=upper), feeds, kernels=True)


@pytest.mark.parametrize("opset", [6, 13])
def test_tile_matches_onnxruntime(tmp_path: Path, opset: int) -> None:
    feeds = {"x": normal(2, 3, 4)}
    path = save_node(tmp_path, "Tile", feeds, {"r": np.array([2, 1, 3], np.int64)}, opset=opset)
    agree(path, feeds, kernels=True)


def test_tile_of_ones_is_no_node(tmp_path: Path) -> None:
    feeds = {"x": normal(2, 3)}
    path = save_node(tmp_path, "Tile", {**feeds}, {"r": np.array([1, 1], np.int64)})
    path_graph = import_onnx(path)
    assert "Tile" not in ops_of(path_graph)


# ---- Pad -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_of_opset10_attributes_matches_onnxruntime(tmp_path: Path, mode: str) -> None:
    feeds = {"x": normal(2, 4, 5)}
    attrs: dict[str, Any] = {"pads": [0, 1, 2, 0, 3, 1], "mode": mode}
    if mode == "constant":
        attrs["value"] = 2.5
    agree(save_node(tmp_path, "Pad", feeds, opset=10, **attrs), feeds, kernels=True)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_of_opset13_inputs_matches_onnxruntime(tmp_path: Path, mode: str) -> None:
    feeds = {"x": normal(1, 3, 4, 6)}
    inits = {"pads": np.array([0, 0, 1, 2, 0, 0, 3, 1], np.int64)}
    if mode == "constant":
        inits["value"] = np.array(-1.0, np.float32)
    agree(save_node(tmp_path, "Pad", feeds, inits, opset=13, mode=mode), feeds, kernels=True)


def test_pad_constant_value_omitted_pads_zeros(tmp_path: Path) -> None:
    feeds = {"x": normal(3, 4)}
    path = save_node(tmp_path, "Pad", feeds, {"pads": np.array([1, 0, 0, 2], np.int64)}, opset=13, order=["x", "pads", ""])
    agree(path, feeds)


def test_pad_with_negative_pads_crops_as_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": normal(4, 6)}
    agree(save_node(tmp_path, "Pad", feeds, {"pads": np.array([-1, 2, 1, -3], np.int64)}, opset=13), feeds, kernels=True)


@pytest.mark.parametrize("mode", ["constant", "wrap", "reflect"])
def test_pad_of_opset19_axes_matches_onnxruntime(tmp_path: Path, mode: str) -> None:
    feeds = {"x": normal(2, 3, 5)}
    inits = {"pads": np.array([1, 2, 3, 1], np.int64), "value": np.array(0.5, np.float32), "axes": np.array([-1, 1], np.int64)}
    agree(save_node(tmp_path, "Pad", feeds, inits, opset=19, mode=mode), feeds, kernels=True)


def test_pad_of_int64_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": RNG.integers(-9, 9, (3, 2)).astype(np.int64)}
    inits = {"pads": np.array([1, 0, 0, 2], np.int64), "value": np.array(7, np.int64)}
    agree(save_node(tmp_path, "Pad", feeds, inits, opset=13), feeds, kernels=True)


# ---- Range ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "limit", "delta"),
    [(np.int64(0), np.int64(7), np.int64(2)), (np.float32(1.0), np.float32(-2.0), np.float32(-0.75))],
)
def test_range_of_constants_folds_to_onnxruntime_values(tmp_path: Path, start: Any, limit: Any, delta: Any) -> None:
    x = np.zeros(1, np.asarray(start).dtype)
    inits = {"s": np.asarray(start), "l": np.asarray(limit), "d": np.asarray(delta)}
    node = helper.make_node("Range", ["s", "l", "d"], ["r"])
    add = helper.make_node("Add", ["r", "x"], ["y"])
    graph = helper.make_graph(
        [node, add], "m", [helper.make_tensor_value_info("x", _elem(x), [1])],
        [helper.make_tensor_value_info("y", _elem(x), None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    g = agree(_save(tmp_path / "range.onnx", graph, 17), {"x": x})
    assert ops_of(g) == ["Add"]


def test_range_of_live_data_fails_in_one_line(tmp_path: Path) -> None:
    feeds = {"n": np.array(5, np.int64)}
    inits = {"s": np.array(0, np.int64), "d": np.array(1, np.int64)}
    path = save_node(tmp_path, "Range", feeds, inits, order=["s", "n", "d"])
    with pytest.raises(OnnxImportError) as info:
        import_onnx(path)
    message = str(info.value)
    assert "\n" not in message
    assert "node range" in message and "Range's limit depends on a graph input" in message
    assert "static shapes" in message


# ---- Einsum --------------------------------------------------------------------------------------
EINSUM_FORMS = {
    # equation: (operand shapes, the catalogue ops it becomes)
    "bhid,bhjd->bhij": (((2, 3, 4, 5), (2, 3, 6, 5)), ["Transpose", "MatMul"]),
    "bhij,bhjd->bhid": (((2, 3, 4, 6), (2, 3, 6, 5)), ["MatMul"]),
    "bij,bjk->bik": (((2, 3, 4), (2, 4, 5)), ["MatMul"]),
    "i,j->ij": (((3,), (4,)), ["Reshape", "Reshape", "Mul"]),
    "bi,bj->bij": (((2, 3), (2, 4)), ["Reshape", "Reshape", "Mul"]),
    "ij,jk": (((3, 4), (4, 5)), ["MatMul"]),
    "bid,jd->bij": (((2, 3, 4), (5, 4)), ["Transpose", "MatMul"]),
    "d,dj->j": (((4,), (4, 5)), ["Reshape", "MatMul", "Reshape"]),
    "bhd,hdk->bhk": (((2, 3, 4), (3, 4, 5)), None),
    "...ij,...kj->...ik": (((2, 3, 4), (2, 5, 4)), ["Transpose", "MatMul"]),
    "bnqd,bnkd->bnqk": (((1, 2, 3, 4), (1, 2, 5, 4)), ["Transpose", "MatMul"]),
    "ij->ji": (((3, 4),), ["Transpose"]),
    "bij->bj": (((2, 3, 4),), ["ReduceSum"]),
    "ijk,ik->j": (((2, 3, 4), (2, 4)), None),
}


@pytest.mark.parametrize("equation", list(EINSUM_FORMS))
def test_einsum_lowers_to_catalogue_ops_matching_onnxruntime(tmp_path: Path, equation: str) -> None:
    shapes, ops = EINSUM_FORMS[equation]
    feeds = {f"x{k}": normal(*s) for k, s in enumerate(shapes)}
    graph = agree(save_node(tmp_path, "Einsum", feeds, opset=12, equation=equation), feeds, kernels=True, rtol=1e-5, atol=1e-5)
    if ops is not None:
        assert ops_of(graph) == ops
    assert graph.nodes[-1].name == "einsum"


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("ii->i", ((3, 3),)), ("ij,jk,kl->il", ((2, 3), (3, 4), (4, 5))), ("bij,bjj->bi", ((2, 3, 4), (2, 4, 4)))],
)
def test_einsum_outside_the_lowered_forms_fails_naming_the_equation(tmp_path: Path, equation: str, shapes: tuple) -> None:
    feeds = {f"x{k}": normal(*s) for k, s in enumerate(shapes)}
    with pytest.raises(OnnxImportError, match=f"Einsum '{equation}'") as info:
        import_onnx(save_node(tmp_path, "Einsum", feeds, opset=12, equation=equation))
    assert "\n" not in str(info.value)


# ---- ConvTranspose -------------------------------------------------------------------------------
CONV_TRANSPOSE_FORMS: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    # name: (x shape, W shape (C, M/group, k...), bias, attributes)
    "plain": ((1, 3, 4, 5), (3, 2, 3, 3), False, {}),
    "upsample_s2_p1_op1": ((2, 4, 5, 4), (4, 3, 3, 3), True, {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    "k4_s2_p1": ((1, 8, 6, 6), (8, 4, 4, 4), True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "groups_dilations_asym_pads": ((2, 4, 5, 6), (4, 2, 3, 2), True, {"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 0]}),
    "depthwise": ((1, 6, 5, 5), (6, 1, 3, 3), True, {"group": 6, "strides": [2, 2]}),
    "same_upper": ((1, 2, 3, 4), (2, 3, 3, 2), True, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 3, 4), (2, 3, 3, 2), False, {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "output_shape": ((1, 2, 3, 4), (2, 3, 3, 3), True, {"strides": [2, 2], "output_shape": [6, 8]}),
    "output_shape_same_upper": ((1, 2, 3, 4), (2, 3, 3, 3), True, {"strides": [2, 2], "output_shape": [6, 7], "auto_pad": "SAME_UPPER"}),
    "output_shape_past_natural": ((1, 1, 3, 3), (1, 2, 3, 3), False, {"strides": [3, 2], "output_shape": [10, 8]}),
    "valid": ((1, 2, 3, 3), (2, 2, 2, 2), False, {"auto_pad": "VALID", "strides": [2, 2]}),
    "1d": ((2, 3, 7), (3, 5, 4), True, {"strides": [3], "pads": [1, 2], "output_padding": [1]}),
    "1d_kernel_shape": ((1, 4, 6), (4, 2, 3), False, {"kernel_shape": [3], "dilations": [2]}),
}


@pytest.mark.parametrize("name", list(CONV_TRANSPOSE_FORMS))
def test_conv_transpose_matches_onnxruntime(tmp_path: Path, name: str) -> None:
    xs, ws, bias, attrs = CONV_TRANSPOSE_FORMS[name]
    feeds = {"x": normal(*xs)}
    inits = {"w": normal(*ws)}
    if bias:
        inits["b"] = normal(ws[1] * attrs.get("group", 1))
    graph = agree(save_node(tmp_path, "ConvTranspose", feeds, inits, opset=11, **attrs), feeds, kernels=True, rtol=1e-4, atol=1e-5)
    assert ops_of(graph) == ["ConvTranspose"]


def test_conv_transpose_same_with_stride_above_kernel_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": normal(1, 2, 3, 3)}
    inits = {"w": normal(2, 2, 1, 1)}
    path = save_node(tmp_path, "ConvTranspose", feeds, inits, strides=[3, 2], auto_pad="SAME_UPPER")
    agree(path, feeds, kernels=True, rtol=1e-4, atol=1e-5)


def test_conv_transpose_with_a_live_weight_matches_onnxruntime(tmp_path: Path) -> None:
    feeds = {"x": normal(1, 3, 4, 4), "w": normal(3, 2, 2, 2)}
    agree(save_node(tmp_path, "ConvTranspose", feeds, strides=[2, 2]), feeds, kernels=True, rtol=1e-4, atol=1e-5)


def test_conv_transpose_3d_fails_in_one_line(tmp_path: Path) -> None:
    feeds = {"x": normal(1, 2, 3, 3, 3)}
    with pytest.raises(OnnxImportError, match="ConvTranspose with 3 spatial axes"):
        import_onnx(save_node(tmp_path, "ConvTranspose", feeds, {"w": normal(2, 2, 2, 2, 2)}))
