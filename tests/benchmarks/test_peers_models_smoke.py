"""Smoke run of ``benchmarks/peers.py --models DIR`` on a folder made here.

The folder holds a small ONNX model written with onnx.helper and its ``<stem>.inputs.npz``, a
second one whose inputs follow the other convention (``<stem>.npz``), one that does not import
and one without inputs: the two good ones are timed beside onnxruntime and summarized, the two
bad ones get one line each, and the run goes on. Nothing depends on how fast anything is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers.py"


def write_model(path: Path, rows: int, cols: int, symbolic: bool) -> None:
    """``Relu(x @ W + b) * 2`` with a symbolic batch dimension when ``symbolic``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((cols, cols)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cols).astype(np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["y"], name="scale"),
    ]
    batch: str | int = "batch" if symbolic else rows
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cols])],
        [w, b, two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_peers_models_runs_a_folder_and_says_why_a_model_did_not_run(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    models = tmp_path / "models"
    models.mkdir()
    rng = np.random.default_rng(1)
    write_model(models / "dense.onnx", 8, 32, symbolic=True)
    np.savez(models / "dense.inputs.npz", x=rng.standard_normal((8, 32)).astype(np.float32))
    write_model(models / "plain.onnx", 4, 16, symbolic=False)
    np.savez(models / "plain.npz", x=rng.standard_normal((4, 16)).astype(np.float32))
    (models / "broken.onnx").write_bytes(b"not a protobuf")
    np.savez(models / "broken.inputs.npz", x=np.zeros((1, 1), np.float32))
    write_model(models / "lonely.onnx", 2, 8, symbolic=False)  # no inputs beside it

    figures_path = tmp_path / "peers.json"
    cmd = [sys.executable, str(PEERS), "--models", str(models), "--rounds", "2", "--threads", "1",
           "--skip", "torch.compile", "--json", str(figures_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout

    cases = json.loads(figures_path.read_text())["cases"]
    assert set(cases) == {"broken", "dense", "lonely", "plain"}
    for name in ("dense", "plain"):
        case = cases[name]
        assert "error" not in case, case.get("error")
        assert case["peers"]["onnxruntime"]["median_s"] > 0
        assert case["ratios"]["onnxruntime"] > 0
        kinds = {k["kind"] for k in case["profile"]["kernels"]}
        assert "matmul" in kinds
    assert "no inputs beside it" in cases["lonely"]["error"]
    not_run = [line for line in out.splitlines() if ": not run: " in line]
    assert [line.split(":")[0] for line in not_run] == ["broken", "lonely"]

    assert "## Summary: onnxruntime / fusiontune per model" in out
    assert "geometric mean of onnxruntime / fusiontune over 2 models" in out
    assert "fusiontune's kernel time over all models, by kind: matmul" in out
    assert "RESULTS.md" not in out  # --models writes no results file unless asked


def test_peers_isolate_runs_every_peer_in_a_process_of_its_own(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "dense.onnx", 8, 32, symbolic=False)
    np.savez(
        models / "dense.inputs.npz",
        x=np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32),
    )

    figures_path = tmp_path / "peers.json"
    cmd = [sys.executable, str(PEERS), "--models", str(models), "--rounds", "2", "--threads", "1", "--isolate",
           "--skip", "torch.compile", "--skip", "jax", "--also-layer", "omp", "--json", str(figures_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "- processes: every peer in its own" in proc.stdout

    case = json.loads(figures_path.read_text())["cases"]["dense"]
    assert "error" not in case, case.get("error")
    for name in ("fusiontune", "onnxruntime", "numpy"):
        peer = case["peers"][name]
        assert peer["note"].endswith("own process"), (name, peer["note"])
        # its outputs came back from its process and were checked against float64
        assert not peer["wrong"] and peer["max_rel"] <= case["tolerance"]
        assert peer["median_s"] > 0 and len(peer["samples_s"]) == 2
    assert case["peers"]["numexpr"]["note"].startswith(("n/a", "not installed"))
    # --also-layer: fusiontune once more, in a process started on another threading layer
    again = case["peers"]["fusiontune@omp"]
    assert again["note"].endswith("own process, FUSIONTUNE_THREADING=omp"), again["note"]
    assert not again["wrong"] and again["median_s"] > 0 and len(again["samples_s"]) == 2
    kinds = {k["kind"] for k in case["profile"]["kernels"]}  # profiled in fusiontune's process
    assert "matmul" in kinds
