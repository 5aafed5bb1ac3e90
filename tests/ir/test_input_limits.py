"""A static 0-size input dimension is reported as such, not as a dynamic one.

``onnx`` reads an unset ``dim_value`` as 0, so the importer must ask whether the field is set
(``HasField``): a model that declares ``dim_value: 0`` has a 0-size input, and a workload of it
measures nothing, which is refused in one line naming the input and the axis.
"""

from __future__ import annotations

from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from fusiontune.cli import main  # noqa: E402
from fusiontune.ir.onnx_import import OnnxImportError, import_model  # noqa: E402

EMPTY = "a 0-size input has no elements to measure"


def relu_model(tmp_path: Path, dims: list[int | str | None]) -> Path:
    """A one-Relu model whose input and output have ``dims`` (an int sets dim_value, a str
    dim_param, None neither), saved with onnx's own helpers."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    return path


def test_a_declared_zero_dimension_is_set_not_unknown(tmp_path: Path) -> None:
    dim = onnx.load(relu_model(tmp_path, [0, 4])).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.HasField("dim_value") and dim.dim_value == 0


def test_a_zero_size_input_dimension_is_refused_naming_input_and_axis(tmp_path: Path) -> None:
    path = relu_model(tmp_path, [4, 0])
    with pytest.raises(OnnxImportError) as info:
        import_model(path)
    message = str(info.value)
    assert message == f"{path}: input 'x' dimension 1 is 0 in the model [4, 0]: {EMPTY}"
    assert "dynamic" not in message


def test_a_zero_size_dimension_cannot_be_overridden_by_a_shape(tmp_path: Path) -> None:
    with pytest.raises(OnnxImportError, match="dimension 0 is 0 in the model"):
        import_model(relu_model(tmp_path, [0, 4]), input_shapes={"x": (2, 4)})


def test_an_unset_dimension_is_still_dynamic(tmp_path: Path) -> None:
    path = relu_model(tmp_path, [None, 4])
    with pytest.raises(OnnxImportError, match=r"dimension 0 \(unnamed\) is dynamic"):
        import_model(path)
    assert import_model(path, input_shapes={"x": (2, 4)}).input_shapes["x"] == (2, 4)


def test_a_named_dimension_is_still_dynamic(tmp_path: Path) -> None:
    path = relu_model(tmp_path, ["batch", 4])
    with pytest.raises(OnnxImportError, match=r"dimension 0 \('batch'\) is dynamic"):
        import_model(path)
    assert import_model(path, dims={"batch": 3}).input_shapes["x"] == (3, 4)


def test_run_refuses_a_zero_size_model_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = relu_model(tmp_path, [0, 4])
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"fusiontune: error: {path}: input 'x' dimension 0 is 0 in the model [0, 4]: {EMPTY}\n"
    )


def test_a_zero_input_shape_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["run", str(relu_model(tmp_path, ["n", 4])), "--input-shape", "x=0x4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x" in err and "0x4" in err and "Traceback" not in err
