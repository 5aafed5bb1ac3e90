"""Smoke run of ``benchmarks/ab_revision.py``: the working tree against its own HEAD on a small
ONNX model written here. Both sides build, run and are timed; the outputs agree exactly (HEAD's
kernels are the working tree's unless this very change touched them). A revision that does not
exist is one line and exit code 2. Nothing depends on how fast anything is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / "benchmarks" / "ab_revision.py"


def _model(folder: Path) -> Path:
    """``Relu(Conv3x3 s2(x))`` over a 1x3x16x16 input, with its inputs file beside it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "stem.onnx"
    onnx.save(model, str(path))
    np.savez(folder / "stem.inputs.npz", x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    return path


def test_ab_revision_times_head_beside_the_working_tree(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    model = _model(tmp_path)
    run = subprocess.run([sys.executable, str(AB), "--base", "HEAD", "--rounds", "1", str(model)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(s for s in run.stdout.splitlines() if s.startswith("stem "))
    assert "base" in line and "now" in line and line.rstrip().endswith("max |base - now| 0.0e+00")
    assert "geometric mean" in run.stdout and "over 1 models" in run.stdout
    bad = subprocess.run([sys.executable, str(AB), "--base", "no-such-revision-here", str(model)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("ab_revision: --base no-such-revision-here: git archive failed")
    assert "Traceback" not in bad.stderr
