"""Search spaces that name an ONNX model: loading, bad keys, and one workload builder for all evaluators."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fusiontune.workloads.onnx_model import (  # noqa: E402
    OnnxSource,
    load_workload,
    space_workload,
    workload_source,
)
from fusiontune.workloads.space import SpaceError, load_space  # noqa: E402

DATA = Path(__file__).parent.parent / "data" / "onnx_space.toml"


def tiny_mlp(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    b1 = numpy_helper.from_array(rng.standard_normal((16,)).astype(np.float32), "b1")
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w1, w2, b1],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def space_file(tmp_path: Path) -> Path:
    tiny_mlp(tmp_path / "models" / "tiny_mlp.onnx")
    return Path(shutil.copy(DATA, tmp_path / "onnx_space.toml"))


def test_onnx_space_loads_with_the_model_path_relative_to_the_space(space_file: Path) -> None:
    space = load_space(space_file)
    assert space.workload == "tiny_mlp"
    assert dict(space.sizes) == {"batch": 4}
    assert space.onnx == OnnxSource.make(space_file.parent / "models" / "tiny_mlp.onnx", {"batch": 4})
    assert Path(space.onnx.path).is_absolute()


def test_every_evaluator_builds_the_same_workload_from_the_space(space_file: Path) -> None:
    space = load_space(space_file)
    local = space_workload(space)
    shipped = pickle.loads(pickle.dumps(space))  # what Ray sends to its actors
    remote = load_workload(workload_source(shipped), dict(shipped.sizes))
    assert local.name == remote.name == "tiny_mlp"
    assert local.graph.structural_hash() == remote.graph.structural_hash()
    assert local.graph.values["x"].shape == (4, 8)
    np.testing.assert_array_equal(local.inputs["x"], remote.inputs["x"])


@pytest.mark.parametrize(
    "edit, key",
    [
        (('onnx = "models/tiny_mlp.onnx"', 'onnx = "models/tiny_mlp.onnx"\nname = "mlp"'), "workload.name"),
        (('onnx = "models/tiny_mlp.onnx"', 'onnx = "models/missing.onnx"'), "workload.onnx"),
        (("batch = 4", "batch = 0"), "workload.dims.batch"),
        (("batch = 4", "seq = 4"), "workload.onnx"),  # batch unfixed, and no dimension named seq
        (('onnx = "models/tiny_mlp.onnx"', 'onnx = "models/tiny_mlp.onnx"\ninput_shapes = {x = "4x8"}'), "workload.input_shapes.x"),
    ],
)
def test_bad_onnx_workload_keys_are_one_line_errors(space_file: Path, edit: tuple[str, str], key: str) -> None:
    space_file.write_text(space_file.read_text().replace(*edit))
    with pytest.raises(SpaceError) as e:
        load_space(space_file)
    assert str(e.value).startswith(f"{space_file}: {key}: ") and "\n" not in str(e.value)


def test_input_shapes_fix_a_model_input(space_file: Path) -> None:
    text = space_file.read_text().replace("[workload.dims]\nbatch = 4\n", "[workload.input_shapes]\nx = [3, 8]\n")
    space_file.write_text(text)
    space = load_space(space_file)
    assert space_workload(space).graph.values["y"].shape == (3, 4)
