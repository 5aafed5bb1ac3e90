"""Import folds first: nodes on constants and static shapes are evaluated (their converter, else
onnx.reference), so only nodes on live data need a converter; the error lists those, with the opset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fusiontune.cli import main  # noqa: E402
from fusiontune.ir._onnx_fold import live_nodes, subgraph_reads  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.ir.onnx_import import OnnxImportError, import_onnx  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def save(tmp_path: Path, nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m", domains=None) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)  # onnxruntime reads IR <= 13
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def vi(name: str, shape, elem: int = F):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, arr) -> TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def const(out: str, arr) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [out], name=f"const_{out}", value=numpy_helper.from_array(np.asarray(arr)))


def matches_onnxruntime(path: Path, feeds: dict[str, np.ndarray], **dims: int) -> None:
    g = import_onnx(path, dims=dims)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = run_graph(g, feeds)
    for name, w in zip(g.outputs, want, strict=True):
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)


def test_mask_construction_on_shapes_folds_to_a_constant(tmp_path: Path) -> None:
    # transformers 5 style: a causal mask from Shape / Range / CumSum / comparisons / And / Not,
    # then GatherND, GatherElements, Cos, Sin, Abs, CastLike: every op on constants, one live Add.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["r"], name="range"),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["kv"], name="kv_index"),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["q"], name="q_index"),
        helper.make_node("LessOrEqual", ["kv", "q"], ["causal"], name="le"),
        helper.make_node("Unsqueeze", ["seq", "ax0"], ["seq1"], name="seq1"),
        helper.make_node("ConstantOfShape", ["seq1"], ["ones"], name="ones", value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("CumSum", ["ones", "zero"], ["pos"], name="cumsum"),
        helper.make_node("GreaterOrEqual", ["pos", "one"], ["valid"], name="ge"),
        helper.make_node("And", ["causal", "valid"], ["both"], name="and"),
        helper.make_node("Not", ["both"], ["masked"], name="not"),
        helper.make_node("Where", ["masked", "neg", "fzero"], ["bias"], name="where"),
        helper.make_node("Cast", ["pos"], ["posf"], name="posf", to=F),
        helper.make_node("Cos", ["posf"], ["cos"], name="cos"),
        helper.make_node("Sin", ["posf"], ["sin"], name="sin"),
        helper.make_node("Mul", ["cos", "sin"], ["cs"], name="cs"),
        helper.make_node("Abs", ["cs"], ["acs"], name="abs"),
        helper.make_node("Add", ["bias", "acs"], ["bias2"], name="bias2"),
        helper.make_node("GatherND", ["bias2", "nd_idx"], ["rows"], name="gathernd"),
        helper.make_node("GatherElements", ["rows", "el_idx"], ["picked"], name="gatherelements", axis=1),
        helper.make_node("CastLike", ["picked", "x"], ["picked_f"], name="castlike"),
        helper.make_node("Add", ["x", "picked_f"], ["y"], name="add"),
    ]
    inits = [
        init("zero", np.array(0, np.int64)),
        init("one", np.array(1, np.int64)),
        init("ax0", np.array([0], np.int64)),
        init("ax1", np.array([1], np.int64)),
        init("neg", np.array(-1e4, np.float32)),
        init("fzero", np.array(0.0, np.float32)),
        init("nd_idx", np.array([[3], [2], [1], [0]], np.int64)),
        init("el_idx", np.array([[0, 1, 2, 3], [3, 2, 1, 0], [1, 1, 1, 1], [0, 0, 3, 3]], np.int64)),
    ]
    path = save(tmp_path, nodes, [vi("x", ["batch", 4, 4])], [vi("y", ["batch", 4, 4])], inits)
    g = import_onnx(path, dims={"batch": 2})
    assert g.op_counts() == {"Add": 1}
    assert g.node("add").op == "Add"  # the live node keeps its ONNX name
    x = np.random.default_rng(0).standard_normal((2, 4, 4)).astype(np.float32)
    matches_onnxruntime(path, {"x": x}, batch=2)


def test_unsupported_op_on_constants_only_imports(tmp_path: Path) -> None:
    # Hardmax, EyeLike and Det have no converter: on constants, onnx.reference evaluates them
    w = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 4.0], [2.0, 2.0, 1.0]], np.float32)
    nodes = [
        helper.make_node("Hardmax", ["w"], ["h"], name="hardmax"),
        helper.make_node("EyeLike", ["w"], ["eye"], name="eye"),
        helper.make_node("Add", ["h", "eye"], ["he"], name="he"),
        helper.make_node("Det", ["w"], ["det"], name="det"),
        helper.make_node("Mul", ["he", "det"], ["c"], name="scale"),
        helper.make_node("MatMul", ["x", "c"], ["y"], name="matmul"),
    ]
    path = save(tmp_path, nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [init("w", w)])
    g = import_onnx(path)
    assert g.op_counts() == {"MatMul": 1}
    matches_onnxruntime(path, {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)})


def test_unsupported_op_on_live_data_is_one_line_with_the_opset(tmp_path: Path) -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["y"], name="hm")]
    path = save(tmp_path, nodes, [vi("x", ["batch", 3])], [vi("y", ["batch", 3])], opset=19)
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)  # batch is not fixed either: the unsupported op is reported first
    assert str(e.value) == f"{path}: unsupported ONNX ops (model opset 19): Hardmax (node hm)"


def test_mixed_model_lists_each_live_op_type_once(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Hardmax", ["w"], ["wh"], name="hm_const"),  # constant: folds, never listed
        helper.make_node("Add", ["x", "wh"], ["a"], name="add"),
        helper.make_node("Hardmax", ["a"], ["b"], name="hm_live1"),
        helper.make_node("Hardmax", ["b"], ["c"], name="hm_live2"),
        helper.make_node("LpNormalization", ["c"], ["d"], name="lp"),
        helper.make_node("Custom", ["w"], ["k"], name="custom_const", domain="com.example"),  # no reference
        helper.make_node("Add", ["d", "k"], ["y"], name="out"),
    ]
    path = save(tmp_path, nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [init("w", np.ones((2, 3), np.float32))], domains={"com.example": 1})
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)
    msg = str(e.value)
    assert msg == (
        f"{path}: unsupported ONNX ops (model opset 17): Hardmax (node hm_live1),"
        " LpNormalization (node lp), com.example.Custom (node custom_const)"
    )


def test_random_ops_are_live_even_on_constants(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("RandomNormalLike", ["w"], ["noise"], name="noise"),
        helper.make_node("Add", ["x", "noise"], ["y"], name="add"),
    ]
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], [init("w", np.zeros(3, np.float32))])
    with pytest.raises(OnnxImportError, match=r"RandomNormalLike \(node noise\)"):
        import_onnx(path)


def test_uint8_constants_keep_their_dtype_while_folding(tmp_path: Path) -> None:
    # BitwiseNot of uint8 [0, 1, 200] is [255, 254, 55]; in int64 it would be [-1, -2, -201]
    nodes = [
        helper.make_node("BitwiseNot", ["u"], ["nu"], name="bitnot"),
        helper.make_node("Cast", ["nu"], ["f"], name="cast", to=F),
        helper.make_node("Add", ["x", "f"], ["y"], name="add"),
    ]
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], [init("u", np.array([0, 1, 200], np.uint8))], opset=18)
    g = import_onnx(path)
    np.testing.assert_array_equal(g.constants[g.node("add").inputs[1]], [255.0, 254.0, 55.0])
    matches_onnxruntime(path, {"x": np.zeros(3, np.float32)})


def test_int8_constant_read_by_a_live_node_becomes_int64(tmp_path: Path) -> None:
    # Pow's exponent may be int8; the IR has no int8, so the live node reads it as int64
    nodes = [helper.make_node("Pow", ["x", "e"], ["y"], name="pow")]
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], [init("e", np.array([2, 3, -1], np.int8))])
    g = import_onnx(path)
    assert g.op_counts() == {"Pow": 1} and g.node("pow").inputs[1] in g.constants
    x = np.array([3.0, 2.0, 4.0], np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], [9.0, 8.0, 0.25])


def test_if_on_a_constant_condition_is_evaluated(tmp_path: Path) -> None:
    then_g = helper.make_graph([helper.make_node("Mul", ["w", "w"], ["t"], name="sq")], "then", [], [vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["w"], ["e"], name="neg")], "else", [], [vi("e", [3])])
    nodes = [
        helper.make_node("Greater", ["a", "b"], ["cond"], name="cond"),
        helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["x", "branch"], ["y"], name="add"),
    ]
    inits = [init("a", np.array(2.0, np.float32)), init("b", np.array(1.0, np.float32)), init("w", np.array([1.0, 2.0, 3.0], np.float32))]
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], inits)
    g = import_onnx(path)
    assert g.op_counts() == {"Add": 1}
    np.testing.assert_array_equal(g.constants[g.node("add").inputs[1]], [1.0, 4.0, 9.0])
    matches_onnxruntime(path, {"x": np.ones(3, np.float32)})


@pytest.mark.parametrize("cond", ["", "true"])
def test_loop_on_constants_is_evaluated(tmp_path: Path, cond: str) -> None:
    # three iterations of acc += w (w from the outer scope); an omitted cond means true
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "w"], ["acc_out"], name="acc"), helper.make_node("Identity", ["c_in"], ["c_out"], name="c")],
        "body",
        [vi("i", [], I64), vi("c_in", [], TensorProto.BOOL), vi("acc_in", [3])],
        [vi("c_out", [], TensorProto.BOOL), vi("acc_out", [3])],
    )
    nodes = [
        helper.make_node("Loop", ["n", cond, "acc0"], ["acc"], name="loop", body=body),
        helper.make_node("Add", ["x", "acc"], ["y"], name="add"),
    ]
    inits = [init("n", np.array(3, np.int64)), init("acc0", np.zeros(3, np.float32)), init("w", np.array([1.0, 2.0, 3.0], np.float32))]
    inits += [init("true", np.array(True))] if cond else []
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], inits)
    g = import_onnx(path)
    assert g.op_counts() == {"Add": 1}
    np.testing.assert_array_equal(g.constants[g.node("add").inputs[1]], [3.0, 6.0, 9.0])
    matches_onnxruntime(path, {"x": np.ones(3, np.float32)})


def test_if_that_reads_live_data_in_a_branch_is_live(tmp_path: Path) -> None:
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "then", [], [vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="id")], "else", [], [vi("e", [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=then_g, else_branch=else_g)]
    path = save(tmp_path, nodes, [vi("x", [3])], [vi("y", [3])], [init("c", np.array(True))])
    model = onnx.load(str(path))
    assert subgraph_reads(model.graph.node[0]) == {"x"}
    assert live_nodes(model.graph, ["x"]) == [True]
    with pytest.raises(OnnxImportError, match=r"If \(node branchy\)"):
        import_onnx(path)


def test_sequences_on_constants_fold(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["w"], ["parts"], name="split", axis=0),
        helper.make_node("SequenceAt", ["parts", "one"], ["row"], name="at"),
        helper.make_node("Add", ["x", "row"], ["y"], name="add"),
    ]
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    path = save(tmp_path, nodes, [vi("x", [1, 2])], [vi("y", [1, 2])], [init("w", w), init("one", np.array(1, np.int64))])
    g = import_onnx(path)
    assert g.op_counts() == {"Add": 1}
    matches_onnxruntime(path, {"x": np.zeros((1, 2), np.float32)})


def test_cli_unsupported_live_op_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["y"], name="hm")]
    path = save(tmp_path, nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"fusiontune: error: {path}: unsupported ONNX ops (model opset 17): Hardmax (node hm)\n"
