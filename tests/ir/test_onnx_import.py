"""The ONNX importer: folding, Gemm and Slice semantics, errors that name what to fix, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fusiontune.cli import main  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.ir.onnx_import import OnnxImportError, import_onnx  # noqa: E402
from fusiontune.workloads.onnx_model import OnnxSource, index_bounds, load_onnx_workload  # noqa: E402

F = TensorProto.FLOAT


def save(tmp_path: Path, nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m", domains=None) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)  # onnxruntime 1.31 reads IR <= 13
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def vi(name: str, shape, elem: int = F):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, arr) -> TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_shape_subgraph_folds_into_a_constant_reshape(tmp_path: Path) -> None:
    # x (2, 3, 4) -> Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape: (2, 12)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["b"], name="take_batch", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="unsq"),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
        helper.make_node("Relu", ["y"], ["out"], name="relu"),
    ]
    inits = [init("zero", np.array(0, np.int64)), init("ax0", np.array([0], np.int64)), init("minus1", np.array([-1], np.int64))]
    path = save(tmp_path, nodes, [vi("x", [2, 3, 4])], [vi("out", [2, 12])], inits)
    g = import_onnx(path)
    assert [n.op for n in g.nodes] == ["Reshape", "Relu"]
    assert g.node("reshape").attrs["shape"] == (2, 12)
    assert g.outputs == ("out",)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["out"], ort_run(path, {"x": x})[0], rtol=1e-6)


def test_unsupported_ops_are_all_listed_with_one_node_each(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Hardmax", ["x"], ["a"], name="hardmax1"),
        helper.make_node("Hardmax", ["a"], ["b"], name="hardmax2"),
        helper.make_node("Custom", ["b"], ["c"], name="custom1", domain="com.example"),
        helper.make_node("Relu", ["c"], ["d"], name="relu"),
        helper.make_node("LpNormalization", ["d"], ["y"], name="lpnorm"),
    ]
    path = save(tmp_path, nodes, [vi("x", [1, 2, 3, 3])], [vi("y", [1, 2, 3, 3])], domains={"com.example": 1})
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "(model opset 17)" in msg
    assert "Hardmax (node hardmax1)" in msg and "com.example.Custom (node custom1)" in msg
    assert "LpNormalization (node lpnorm)" in msg
    assert "hardmax2" not in msg and "Relu" not in msg


def test_dynamic_dimension_must_be_fixed(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    path = save(tmp_path, nodes, [vi("x", ["batch", 8])], [vi("y", ["batch", 8])])
    with pytest.raises(OnnxImportError, match=r"input 'x' dimension 0 \('batch'\) is dynamic: fix it with --dim batch=N"):
        import_onnx(path)
    assert import_onnx(path, dims={"batch": 3}).values["x"].shape == (3, 8)
    assert import_onnx(path, input_shapes={"x": (5, 8)}).values["y"].shape == (5, 8)
    with pytest.raises(OnnxImportError, match="--dim seq: no input dimension has this name"):
        import_onnx(path, dims={"batch": 3, "seq": 4})
    with pytest.raises(OnnxImportError, match="--input-shape x: dimension 1 is 9, the model fixes it to 8"):
        import_onnx(path, input_shapes={"x": (5, 9)})
    with pytest.raises(OnnxImportError, match=r"--input-shape x: dimension 0 \('batch'\) is 5, but --dim batch=3 makes batch 3"):
        import_onnx(path, input_shapes={"x": (5, 8)}, dims={"batch": 3})


@pytest.mark.parametrize(
    "attrs, const_b, with_c",
    [
        ({}, True, True),
        ({"transB": 1}, True, True),
        ({"transA": 1, "alpha": 0.5, "beta": 2.0}, True, True),
        ({"alpha": 0.25}, False, True),  # alpha on two runtime operands: a Mul after the MatMul
        ({"transA": 1, "transB": 1}, False, False),
        ({"beta": 0.0}, True, True),
    ],
)
def test_gemm_variants_match_onnxruntime(tmp_path: Path, attrs: dict, const_b: bool, with_c: bool) -> None:
    rng = np.random.default_rng(1)
    a_shape = (4, 3) if attrs.get("transA") else (3, 4)
    b_shape = (5, 4) if attrs.get("transB") else (4, 5)
    b = rng.standard_normal(b_shape).astype(np.float32)
    c = rng.standard_normal((5,)).astype(np.float32)
    ins = ["a", "b"] + (["c"] if with_c else [])
    inputs = [vi("a", list(a_shape))] + ([] if const_b else [vi("b", list(b_shape))])
    inits = ([init("b", b)] if const_b else []) + ([init("c", c)] if with_c else [])
    path = save(tmp_path, [helper.make_node("Gemm", ins, ["y"], name="gemm", **attrs)], inputs, [vi("y", [3, 5])], inits)
    g = import_onnx(path)
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    if not const_b:
        feeds["b"] = b
    assert "Transpose" not in g.op_counts() or not const_b or attrs.get("transA")  # weight transposes fold
    np.testing.assert_allclose(run_graph(g, feeds)["y"], ort_run(path, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([1, 0], [1000, 3], [0, 1], [1, 1]),  # end past the dimension
        ([-100], [100], [1], [2]),  # start before 0
        ([-1], [-1000], [0], [-1]),  # whole axis reversed: "before 0" as the end
        ([10], [-10], [1], [-3]),  # start past the end with a negative step
        ([2], [1], [0], [1]),  # empty
        ([0, -2], [-1, 1000], [-2, -1], [2, 1]),  # negative axes
    ],
)
def test_slice_clamps_like_onnxruntime(tmp_path: Path, starts, ends, axes, steps) -> None:
    inits = [init(n, np.array(v, np.int64)) for n, v in (("s", starts), ("e", ends), ("a", axes), ("t", steps))]
    node = helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"], name="slice")
    path = save(tmp_path, [node], [vi("x", [5, 7])], [vi("y", ["r", "c"])], inits)
    x = np.arange(35, dtype=np.float32).reshape(5, 7)
    want = ort_run(path, {"x": x})[0]
    got = run_graph(import_onnx(path), {"x": x}, None)["y"]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_softmax_on_a_middle_axis_transposes_around_it(tmp_path: Path) -> None:
    path = save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])])
    g = import_onnx(path)
    assert g.op_counts() == {"Transpose": 2, "Softmax": 1}
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], ort_run(path, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_layer_norm_over_two_trailing_axes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    inits = [init("g", rng.standard_normal((3, 4)).astype(np.float32)), init("b", rng.standard_normal((3, 4)).astype(np.float32))]
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-2, epsilon=1e-3)
    path = save(tmp_path, [node], [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])], inits)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_graph(import_onnx(path), {"x": x})["y"], ort_run(path, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_node_names_are_kept_and_made_unique(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="block/act"),
        helper.make_node("Relu", ["a"], ["b"], name="block/act"),
        helper.make_node("Neg", ["b"], ["y"]),
    ]
    g = import_onnx(save(tmp_path, nodes, [vi("x", [2])], [vi("y", [2])]))
    assert [n.name for n in g.nodes] == ["block/act", "block/act_1", "Neg_2"]


def test_not_onnx_and_checker_failures_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01not a model at all" * 10)
    with pytest.raises(OnnxImportError, match="junk.onnx: not an ONNX model"):
        import_onnx(junk)
    bad = helper.make_model(helper.make_graph([helper.make_node("Relu", ["nope"], ["y"], name="r")], "g", [vi("x", [2])], [vi("y", [2])]))
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    with pytest.raises(OnnxImportError, match="bad.onnx: fails onnx.checker"):
        import_onnx(tmp_path / "bad.onnx")
    with pytest.raises(OnnxImportError, match="no such file"):
        import_onnx(tmp_path / "missing.onnx")


def _embedding_model(tmp_path: Path) -> Path:
    table = np.random.default_rng(4).standard_normal((50, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"), helper.make_node("Tanh", ["e"], ["y"], name="tanh")]
    return save(tmp_path, nodes, [vi("ids", ["batch", "seq"], TensorProto.INT64)], [vi("y", ["batch", "seq", 8])], [init("table", table)], name="embedder")


def test_index_inputs_are_drawn_in_range_of_the_gathered_axis(tmp_path: Path) -> None:
    path = _embedding_model(tmp_path)
    w = load_onnx_workload(OnnxSource.make(path, {"batch": 4, "seq": 64}))
    assert w.name == "embedder" and dict(w.params) == {"batch": 4, "seq": 64}
    assert index_bounds(w.graph) == {"ids": 50}
    ids = w.inputs["ids"]
    assert ids.shape == (4, 64) and ids.min() >= 0 and ids.max() < 50 and ids.max() >= 8


def test_cli_run_onnx_model_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedding_model(tmp_path)
    rc = main(["run", str(path), "--dim", "batch=2", "--input-shape", "ids=2x5", "--repeat", "1", "--out", str(tmp_path / "out"), "--json"])
    assert rc == 0
    assert '"workload": "embedder"' in capsys.readouterr().out


def test_cli_run_bad_onnx_file_exits_2_with_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "broken.onnx"
    junk.write_text("this is not protobuf")
    proc = subprocess.run([sys.executable, "-m", "fusiontune", "run", str(junk)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "broken.onnx" in lines[0] and "Traceback" not in proc.stderr


def test_index_inputs_of_gather_nd_and_gather_elements_are_bounded(tmp_path: Path) -> None:
    table = np.random.default_rng(5).standard_normal((6, 40, 8)).astype(np.float32)
    nodes = [
        helper.make_node("GatherND", ["table", "nd"], ["a"], name="gnd"),  # indexes axes 0 and 1
        helper.make_node("GatherElements", ["table", "el"], ["b"], name="gel", axis=2),
        helper.make_node("ReduceSum", ["a"], ["ra"], name="ra", keepdims=0),
        helper.make_node("ReduceSum", ["b"], ["rb"], name="rb", keepdims=0),
    ]
    path = save(
        tmp_path,
        nodes,
        [vi("nd", [3, 2], TensorProto.INT64), vi("el", [6, 40, 8], TensorProto.INT64)],
        [vi("ra", []), vi("rb", [])],
        [init("table", table)],
        name="indexer",
    )
    w = load_onnx_workload(OnnxSource.make(path, {}))
    assert index_bounds(w.graph) == {"nd": 6, "el": 8}
    assert w.inputs["nd"].max() < 6 and w.inputs["el"].max() < 8
