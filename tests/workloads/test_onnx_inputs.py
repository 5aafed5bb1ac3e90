"""Running an ONNX model on the user's arrays: an .npz keyed by input name fixes the shapes (and the
named dimensions inputs share), is cast where no value changes, and becomes the workload's inputs;
``run --save-outputs`` writes the outputs by name; a bad file is one line naming the file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fusiontune.cli import main  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.ir.onnx_import import InputFileError, OnnxImportError, import_model  # noqa: E402
from fusiontune.runner import save_outputs  # noqa: E402
from fusiontune.workloads.onnx_model import OnnxSource, cast_input, load_onnx_workload  # noqa: E402
from fusiontune.workloads.space import SpaceError, load_space  # noqa: E402

VOCAB, HIDDEN = 30, 8


def embedder(tmp_path: Path, mask_dims=("batch", "seq")) -> Path:
    """ids (int64, [batch, seq]) -> Gather(table) * mask (int64, ``mask_dims``) -> y [batch, seq, 8]."""
    table = np.random.default_rng(0).standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Cast", ["mask"], ["mf"], name="mask_float", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "last"], ["m3"], name="mask_unsqueeze"),
        helper.make_node("Mul", ["e", "m3"], ["y"], name="apply_mask"),
    ]
    graph = helper.make_graph(
        nodes,
        "embedder",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, list(mask_dims)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([-1], np.int64), "last")],
    )
    path = tmp_path / "embedder.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def npz(tmp_path: Path, name: str = "inputs.npz", **arrays: np.ndarray) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def ids_and_mask(batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int32),  # int32 for an int64 input
        "mask": (rng.random((batch, seq)) < 0.7).astype(np.int64),
    }


# ---- the arrays become the workload ----------------------------------------------------------
def test_npz_arrays_fix_the_shapes_and_are_the_workload_inputs(tmp_path: Path) -> None:
    arrays = ids_and_mask()
    file = npz(tmp_path, **arrays, labels=np.zeros(3))  # a key that is no input: ignored
    w = load_onnx_workload(OnnxSource.make(embedder(tmp_path), inputs=file))
    assert dict(w.params) == {"batch": 2, "seq": 5}
    assert w.inputs["ids"].dtype == np.int64 and w.inputs["mask"].dtype == np.int64
    np.testing.assert_array_equal(w.inputs["ids"], arrays["ids"])
    np.testing.assert_array_equal(w.inputs["mask"], arrays["mask"])
    np.testing.assert_array_equal(w.reference["y"], run_graph(w.graph, dict(arrays), "float64")["y"])
    assert w.graph.values["y"].shape == (2, 5, HIDDEN)


def test_a_missing_input_is_drawn_when_its_shape_is_fixed(tmp_path: Path) -> None:
    file = npz(tmp_path, ids=ids_and_mask(3, 4)["ids"])  # mask shares batch and seq with ids
    w = load_onnx_workload(OnnxSource.make(embedder(tmp_path), inputs=file))
    assert w.inputs["mask"].shape == (3, 4)


def test_a_missing_input_with_an_open_dimension_names_the_file_and_input(tmp_path: Path) -> None:
    path = embedder(tmp_path, mask_dims=("batch", "past"))
    file = npz(tmp_path, ids=ids_and_mask()["ids"])
    with pytest.raises(InputFileError) as e:
        load_onnx_workload(OnnxSource.make(path, inputs=file))
    assert str(e.value) == (
        f"{file}: no key 'mask', and nothing fixes input 'mask''s dimension 1 ('past'):"
        " add 'mask' to the file, or fix it with --dim past=N"
    )


def test_input_shape_on_one_input_fixes_the_dimensions_it_shares(tmp_path: Path) -> None:
    result = import_model(embedder(tmp_path), input_shapes={"ids": (2, 16)})
    assert dict(result.input_shapes) == {"ids": (2, 16), "mask": (2, 16)}
    assert dict(result.dims) == {"batch": 2, "seq": 16}
    assert result.graph.values["y"].shape == (2, 16, HIDDEN)


# ---- shapes that do not fit ------------------------------------------------------------------
@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"ids": np.zeros((2, 5), np.int64), "mask": np.ones((2, 6), np.int64)},
            "key 'mask': dimension 1 ('seq') is 6, but key 'ids' makes seq 5",
        ),
        ({"ids": np.zeros((2, 5, 1), np.int64)}, "key 'ids': shape 2x5x1 has rank 3, the model's input 'ids' has rank 2 [batch, seq]"),
        ({"ids": np.zeros((0, 5), np.int64)}, "key 'ids': shape 0x5 has an empty or negative dimension"),
    ],
)
def test_shapes_that_do_not_fit_name_the_file_key_and_dimension(tmp_path: Path, arrays, message: str) -> None:
    file = npz(tmp_path, **arrays)
    with pytest.raises(InputFileError) as e:
        load_onnx_workload(OnnxSource.make(embedder(tmp_path), inputs=file))
    assert str(e.value).startswith(f"{file}: {message}") and "\n" not in str(e.value)


def test_a_fixed_model_dimension_is_checked(tmp_path: Path) -> None:
    path = embedder(tmp_path, mask_dims=("batch", 5))
    file = npz(tmp_path, ids=np.zeros((2, 4), np.int64), mask=np.ones((2, 4), np.int64))
    with pytest.raises(InputFileError, match=r"key 'mask': dimension 1 is 4, the model fixes it to 5"):
        load_onnx_workload(OnnxSource.make(path, inputs=file))


def test_array_and_dim_options_must_agree(tmp_path: Path) -> None:
    file = npz(tmp_path, **ids_and_mask(2, 5))
    with pytest.raises(InputFileError, match=r"key 'ids': dimension 1 \('seq'\) is 5, but --dim seq=9 makes seq 9"):
        load_onnx_workload(OnnxSource.make(embedder(tmp_path), {"seq": 9}, inputs=file))
    with pytest.raises(InputFileError, match=r"key 'ids' has shape 2x5, --input-shape ids=2x6 says otherwise"):
        load_onnx_workload(OnnxSource.make(embedder(tmp_path), input_shapes={"ids": (2, 6)}, inputs=file))


# ---- dtypes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "array, dtype, expected",
    [
        (np.array([1, 2], np.int32), "int64", np.array([1, 2], np.int64)),
        (np.array([0.5, 2.0]), "float32", np.array([0.5, 2.0], np.float32)),
        (np.array([True, False]), "int64", np.array([1, 0], np.int64)),
        (np.array([0, 1]), "bool", np.array([False, True])),
        (np.array([3, 4], np.int64), "float32", np.array([3.0, 4.0], np.float32)),
        (np.array([1.5], np.float32), "float64", np.array([1.5])),
    ],
)
def test_casts_that_change_no_value_are_made(array: np.ndarray, dtype: str, expected: np.ndarray) -> None:
    out = cast_input("in.npz", "k", array, dtype)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "array, dtype, message",
    [
        (np.array([1.0, 2.0]), "int64", "in.npz: key 'k': holds float64 values, the input is int64"),
        (np.array([2**40]), "int32", "in.npz: key 'k': int64 values out of the int32 range of the input"),
        (np.array([1e300]), "float32", "in.npz: key 'k': float64 values out of the float32 range of the input"),
        (np.array([0, 2]), "bool", "in.npz: key 'k': int64 values other than 0 and 1 for a bool input"),
        (np.array([2**30 + 1], np.int64), "float32", "in.npz: key 'k': int64 values that float32 cannot hold exactly"),
        (np.array([1j]), "float32", "in.npz: key 'k': holds complex128 values, the input is float32"),
        (np.array(["a"]), "int64", "in.npz: key 'k': holds <U1 values, the input is int64"),
    ],
)
def test_lossy_or_odd_casts_are_one_line_errors(array: np.ndarray, dtype: str, message: str) -> None:
    with pytest.raises(InputFileError) as e:
        cast_input("in.npz", "k", array, dtype)
    assert str(e.value).startswith(message)


def test_float_ids_and_out_of_range_ids_are_errors(tmp_path: Path) -> None:
    path = embedder(tmp_path)
    arrays = ids_and_mask()
    file = npz(tmp_path, "float_ids.npz", ids=arrays["ids"].astype(np.float32), mask=arrays["mask"])
    with pytest.raises(InputFileError, match="float_ids.npz: key 'ids': holds float32 values, the input is int64"):
        load_onnx_workload(OnnxSource.make(path, inputs=file))
    big = arrays["ids"].copy()
    big[0, 0] = VOCAB
    file = npz(tmp_path, "big_ids.npz", ids=big, mask=arrays["mask"])
    with pytest.raises(InputFileError, match=rf"big_ids.npz: key 'ids': indices from \d+ to {VOCAB}, outside the {VOCAB} rows"):
        load_onnx_workload(OnnxSource.make(path, inputs=file))


# ---- files that are not .npz archives --------------------------------------------------------
def test_files_that_are_not_npz_are_one_line_errors(tmp_path: Path) -> None:
    model = embedder(tmp_path)
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    truncated = tmp_path / "truncated.npz"
    np.savez(truncated, ids=np.arange(1000))
    truncated.write_bytes(truncated.read_bytes()[:500])
    cases = {
        text: "not an .npz file of arrays",
        truncated: "not an .npz file of arrays (BadZipFile",
        single: "a single .npy array, expected an .npz archive keyed by input name",
        tmp_path / "missing.npz": "no such file",
        tmp_path: "not a file",
    }
    for file, message in cases.items():
        with pytest.raises(InputFileError) as e:
            load_onnx_workload(OnnxSource.make(model, inputs=file))
        assert str(e.value).startswith(f"{file.resolve()}: {message}") and "\n" not in str(e.value)


def test_object_arrays_are_refused_without_unpickling(tmp_path: Path) -> None:
    file = tmp_path / "objects.npz"
    np.savez(file, ids=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputFileError, match=r"objects.npz: key 'ids': cannot be read"):
        load_onnx_workload(OnnxSource.make(embedder(tmp_path), inputs=file))


# ---- the command line and search spaces ------------------------------------------------------
def test_cli_run_on_an_npz_saves_the_outputs_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arrays = ids_and_mask()
    file = npz(tmp_path, ids=arrays["ids"])  # mask: drawn at random (its shape is fixed by ids)
    saved = tmp_path / "outs" / "y.npz"
    rc = main(["run", str(embedder(tmp_path)), "--inputs", str(file), "--save-outputs", str(saved), "--repeat", "1", "--out", str(tmp_path / "out"), "--json"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "has no array for input 'mask': drawn at random" in captured.err
    assert '"saved_outputs"' in captured.out and '"params": {\n    "batch": 2,\n    "seq": 5\n  }' in captured.out
    with np.load(saved) as out:
        assert out.files == ["y"]
        y = out["y"]
    assert y.shape == (2, 5, HIDDEN) and y.dtype == np.float32
    table = numpy_helper.to_array(onnx.load(str(tmp_path / "embedder.onnx")).graph.initializer[0])
    rows = table[arrays["ids"]]  # the file's ids; each row scaled by the drawn mask's integer
    factor = y[..., 0] / rows[..., 0]
    np.testing.assert_allclose(factor, np.round(factor), atol=1e-5)
    np.testing.assert_allclose(y, rows * np.round(factor)[..., None], rtol=1e-6)


def test_save_outputs_takes_any_output_name(tmp_path: Path) -> None:
    path = save_outputs(tmp_path / "o", {"file": np.ones(2), "allow_pickle": np.zeros(1, np.int64)})
    assert path == tmp_path / "o"  # no .npz appended
    with np.load(path) as out:
        assert out.files == ["file", "allow_pickle"]
        np.testing.assert_array_equal(out["file"], [1.0, 1.0])


def test_cli_bad_npz_exits_2_with_one_line_naming_file_and_key(tmp_path: Path) -> None:
    file = npz(tmp_path, ids=np.zeros((2, 5), np.int64), mask=np.ones((2, 6), np.int64))
    proc = subprocess.run(
        [sys.executable, "-m", "fusiontune", "run", str(embedder(tmp_path)), "--inputs", str(file)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0] == f"fusiontune: error: {file}: key 'mask': dimension 1 ('seq') is 6, but key 'ids' makes seq 5"


def test_cli_inputs_is_for_onnx_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "mlp", "--inputs", "x.npz"]) == 2
    assert "--inputs are for ONNX models" in capsys.readouterr().err


def _space(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "models").mkdir()
    embedder(tmp_path / "models")
    space = tmp_path / "space.toml"
    space.write_text(
        f'[workload]\nonnx = "models/embedder.onnx"\n{extra}\n'
        '[passes]\nsearch = ["TbeEltwiseFusionPass", "MatmulElemReluFusionPass"]\n'
    )
    return space


def test_space_inputs_are_relative_to_the_space_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    arrays = ids_and_mask(3, 4)
    npz(tmp_path / "data", "arrays.npz", **arrays)
    space = load_space(_space(tmp_path, 'inputs = "data/arrays.npz"'))
    assert space.onnx is not None and space.onnx.inputs == str((tmp_path / "data" / "arrays.npz").resolve())
    assert dict(space.sizes) == {"batch": 3, "seq": 4}
    w = load_onnx_workload(space.onnx)
    np.testing.assert_array_equal(w.inputs["ids"], arrays["ids"])


@pytest.mark.parametrize(
    "extra, message",
    [
        ('inputs = "missing.npz"', "missing.npz: no such file"),
        ("inputs = 3", "expected the path of a .npz file, got an integer"),
        ('inputs = "bad.npz"', "bad.npz: key 'ids': holds float64 values, the input is int64"),
    ],
)
def test_space_bad_inputs_blame_the_inputs_key(tmp_path: Path, extra: str, message: str) -> None:
    npz(tmp_path, "bad.npz", ids=np.zeros((2, 5), np.float64))  # floats for int64 ids
    space = _space(tmp_path, extra)
    with pytest.raises(SpaceError) as e:
        load_space(space)
    assert str(e.value).startswith(f"{space}: workload.inputs: ") and "\n" not in str(e.value)
    assert message in str(e.value)


def test_import_errors_are_onnx_import_errors() -> None:
    assert issubclass(InputFileError, OnnxImportError)
