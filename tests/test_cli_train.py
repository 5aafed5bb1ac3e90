"""``tune`` and ``bisect`` on a training space, unchanged: real passes, real kernels, in process."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fusiontune.cli import main

SPACE = """\
[workload]
name = "mlp"
sizes = { batch = 8, hidden = 16 }
train = true
optimizer = "adam"

[passes]
search = ["TbeEltwiseFusionPass", "GeluFusionPass", "LowPrecisionFusionPass"]

[accuracy]
metric = "max_rel"
bound = 1e-4

[measure]
warmup = 0
repeat = 2
min_repeat_ms = 0.0

[search]
sampler = "random"
trials = 5
seed = 0
top_k = 2
workers = 0
"""


@pytest.fixture
def space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mlp_train.toml"
    path.write_text(SPACE)
    return path


def test_tune_searches_a_training_step(space: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(space), "--no-progress", "--no-confirm"]) == 0
    results = tmp_path / "results" / "mlp_train"
    rows = list(csv.DictReader((results / "trials.csv").open()))
    assert len(rows) >= 5
    # Every trial measured the step: the kernels of the all-off step outnumber the forward's.
    fused = json.loads((results / "fusion_result.json").read_text())
    assert "AutodiffPass" in json.dumps(fused)
    assert (results / "fusion_switch.cfg").is_file()


def test_bisect_names_the_fusion_that_breaks_the_gradients(space: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bisect", str(space)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "results" / "mlp_train" / "bisect.json").read_text())
    culprits = {c["pass"]: c for c in data["culprits"]}
    # float16 intermediates lose the gradients' float32 accuracy; one application is enough.
    assert "LowPrecisionFusionPass" in culprits and "culprit: LowPrecisionFusionPass" in out
    assert 1 <= len(culprits["LowPrecisionFusionPass"]["applications"]) < culprits["LowPrecisionFusionPass"]["total_applications"]
    assert data["safe_error"] <= 1e-4 < data["bad_error"]
