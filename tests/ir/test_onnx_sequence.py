"""Live tensor sequences at import: SplitToSequence / SequenceAt / ConcatFromSequence against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fusiontune.ir.interpreter import run_graph
from fusiontune.ir.onnx_import import OnnxImportError, import_onnx

ort = pytest.importorskip("onnxruntime")


def _model(tmp_path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], out_shapes: dict[str, list[int]]) -> Path:
    graph = helper.make_graph(
        nodes,
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12])],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in out_shapes.items()],
        inits,
    )
    path = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _check(path: Path) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((2, 3, 12)).astype(np.float32)
    graph = import_onnx(path)
    got = run_graph(graph, {"x": x}, dtype=None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x}), strict=True))
    for name, arr in want.items():
        np.testing.assert_array_equal(got[name], arr, err_msg=name)
    return got


def test_split_to_sequence_then_sequence_at_is_one_split(tmp_path: Path) -> None:
    """GPT-2's q, k, v as the dynamo exporter writes them without its optimizer."""
    nodes = [
        helper.make_node("SplitToSequence", ["x", "size"], ["s"], axis=2, keepdims=1),
        *(helper.make_node("SequenceAt", ["s", f"p{i}"], [f"y{i}"]) for i in range(3)),
    ]
    inits = [helper.make_tensor("size", TensorProto.INT64, [], [4])]
    inits += [helper.make_tensor(f"p{i}", TensorProto.INT64, [], [i - 3 if i == 2 else i]) for i in range(3)]
    path = _model(tmp_path, nodes, inits, {f"y{i}": [2, 3, 4] for i in range(3)})
    graph = import_onnx(path)
    assert [n.op for n in graph.nodes].count("Split") == 1
    _check(path)


def test_uneven_chunks_sizes_and_keepdims_0(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x", "size"], ["s"], axis=-1),  # 5, 5, 2
        helper.make_node("SequenceAt", ["s", "last"], ["y0"]),
        helper.make_node("SplitToSequence", ["x"], ["t"], axis=1, keepdims=0),
        helper.make_node("SequenceAt", ["t", "one"], ["y1"]),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["u"], axis=2),
        helper.make_node("ConcatFromSequence", ["u"], ["y2"], axis=1, new_axis=1),
    ]
    inits = [
        helper.make_tensor("size", TensorProto.INT64, [], [5]),
        helper.make_tensor("last", TensorProto.INT64, [], [-1]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("sizes", TensorProto.INT64, [2], [6, 6]),
    ]
    path = _model(tmp_path, nodes, inits, {"y0": [2, 3, 2], "y1": [2, 12], "y2": [2, 2, 3, 6]})
    _check(path)


def test_sequence_position_out_of_range_is_one_line(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x", "size"], ["s"], axis=2),
        helper.make_node("SequenceAt", ["s", "p"], ["y"]),
    ]
    inits = [helper.make_tensor("size", TensorProto.INT64, [], [6]), helper.make_tensor("p", TensorProto.INT64, [], [2])]
    path = _model(tmp_path, nodes, inits, {"y": [2, 3, 6]})
    with pytest.raises(OnnxImportError, match="position 2 is outside a sequence of 2"):
        import_onnx(path)
