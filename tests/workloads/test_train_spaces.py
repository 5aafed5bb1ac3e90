"""The shipped ONNX training space: it loads, its workload is a training step, and that step trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime.program import build_program
from fusiontune.workloads.onnx_model import space_workload
from fusiontune.workloads.space import load_space
from fusiontune.workloads.workload import Workload

SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "bert_encoder_train.toml"
POINT = "RecomputeSplitFusionPass.recompute"


@pytest.fixture(scope="module")
def workload() -> Workload:
    return space_workload(load_space(SPACE))


def test_onnx_training_space_loads_and_searches_the_recompute_split_point() -> None:
    space = load_space(SPACE)
    assert space.onnx is not None and Path(space.onnx.path).name == "bert_encoder.onnx"
    assert space.train is not None and space.train.loss == "mse" and space.train.optimizer == "sgd"
    assert space.splits[POINT] == (0, 2)


def test_onnx_training_step_trains_within_the_bound(workload: Workload) -> None:
    """Every weight gets a gradient; the fused step holds the bound and recompute lowers its peak."""
    space = load_space(SPACE)
    assert workload.train is not None and len(workload.train.params) > 10
    ref = workload.reference
    assert all(np.abs(ref[f"grad/{p}"]).max() > 0 for p in workload.train.params[:4])
    peaks = {}
    for level in (0, 2):
        config = FusionConfig.resolve(split_points={POINT: level})
        program = build_program(run_pipeline(workload.graph, config, train=workload.train).fused)
        out = program.run({k: np.array(v) for k, v in workload.inputs.items()})
        assert workload.errors(out).max_rel <= space.bound
        peaks[level] = program.peak_bytes
    assert peaks[2] < peaks[0]
