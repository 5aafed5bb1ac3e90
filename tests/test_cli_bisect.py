"""``fusiontune bisect`` on a real workload: real passes, real numba kernels, the in-process evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.switch_file import dump_switch_json, load_config
from fusiontune.measure import MeasureConfig
from fusiontune.tune.evaluate import evaluate_config
from fusiontune.workloads import make_workload

SIZES = {"batch": 1, "seq": 16, "hidden": 32, "heads": 2, "ffn": 64}
SPACE = f"""\
[workload]
name = "transformer_block"
sizes = {{ batch = {SIZES['batch']}, seq = {SIZES['seq']}, hidden = {SIZES['hidden']}, heads = {SIZES['heads']}, ffn = {SIZES['ffn']} }}

[passes]
search = "ALL"

[accuracy]
metric = "max_rel"
bound = 5e-4
"""


@pytest.fixture
def space(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tb.toml"
    path.write_text(SPACE)
    return path


@pytest.mark.slow
def test_bisect_names_the_culprits_and_the_safe_cfg_holds_the_bound(space: Path, tmp_path: Path, capsys) -> None:
    code = main(["bisect", str(space)])
    out = capsys.readouterr().out
    assert code == 0, out
    results = tmp_path / "results" / "tb"
    data = json.loads((results / "bisect.json").read_text())
    culprits = {c["pass"]: c for c in data["culprits"]}
    # The float16 intermediates break a 5e-4 bound on their own, in one named fusion.
    assert "LowPrecisionFusionPass" in culprits
    lowp = culprits["LowPrecisionFusionPass"]
    assert 1 <= len(lowp["applications"]) < lowp["total_applications"]
    assert all(app["nodes"] for app in lowp["applications"])
    for c in culprits:
        assert f"culprit: {c}" in out
    # Each evaluation was printed as it happened, with its error and verdict.
    assert out.count("max_rel=") >= data["evaluation_count"]
    assert data["evaluation_count"] < data["linear_scan_evaluations"]
    assert data["safe_error"] <= 5e-4 < data["bad_error"]
    # The safe cfg is the bad configuration with only the culprits off, and it holds the bound.
    safe = load_config(results / "safe_fusion_switch.cfg")
    bad = FusionConfig.from_json(data["bad_config"])
    assert sorted(bad.diff(safe)) == sorted(culprits)
    workload = make_workload("transformer_block", **SIZES)
    result = evaluate_config(workload, safe, MeasureConfig(warmup=0, number=1, repeat=1, min_repeat_ms=0.0))
    assert result.ok and result.error("max_rel") <= 5e-4
    # Replaying the recorded evaluations gives the same answer without measuring anything.
    assert main(["bisect", str(space), "--replay", str(results / "bisect.json"), "--name", "again"]) == 0
    again = json.loads((tmp_path / "results" / "again" / "bisect.json").read_text())
    assert again["culprits"] == data["culprits"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fusiontune: error: ")
    return err[0]


def test_a_bad_configuration_that_holds_the_bound_is_refused_with_exit_2(space: Path, tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "defaults.cfg"
    cfg.write_text(dump_switch_json(FusionConfig.defaults()))
    assert main(["bisect", str(space), "--bad", str(cfg)]) == 2
    assert "bad configuration holds the bound" in one_error_line(capsys)
    # What was evaluated is kept.
    data = json.loads((tmp_path / "results" / "tb" / "bisect.json").read_text())
    assert data["status"] == "refused" and data["evaluation_count"] == 2


def test_bad_arguments_are_one_line_and_exit_2(space: Path, tmp_path: Path, capsys) -> None:
    assert main(["bisect", str(space), "--metric", "max_rell"]) == 2
    assert "max_rell" in one_error_line(capsys)
    assert main(["bisect", str(space), "--bad", str(tmp_path / "missing.cfg")]) == 2
    assert "missing.cfg" in one_error_line(capsys)
    broken = tmp_path / "broken.cfg"
    broken.write_text('{"Switch":{"GraphFusion":{"SoftmaxFusionPas":"off"}}}')
    assert main(["bisect", str(space), "--good", str(broken)]) == 2
    assert "SoftmaxFusionPas" in one_error_line(capsys)
    assert main(["bisect", str(space), "--replay", str(tmp_path / "tb.toml")]) == 2
    one_error_line(capsys)


def test_a_bound_below_the_float32_floor_is_warned_about_and_the_bisection_goes_on(
    space: Path, tmp_path: Path, capsys
) -> None:
    from fusiontune.runner import float32_floor

    floor = float32_floor(make_workload("transformer_block", **SIZES)).max_rel
    bound = floor / 10
    code = main(["bisect", str(space), "--bound", f"{bound:g}"])
    captured = capsys.readouterr()
    warning, error = captured.err.strip().splitlines()
    assert warning == (
        f"fusiontune: warning: the bound max_rel <= {bound:g} is below the float32 floor of"
        f" transformer_block (max_rel {floor:.3g}, the unfused program in float32 vs the float64"
        " reference): even exact passes will be blamed for rounding"
    )
    # It went on: both endpoints were evaluated; the all-off one breaks a bound below the floor.
    assert captured.out.count("] endpoints ") == 2
    assert code == 2 and error.startswith("fusiontune: error: the good configuration breaks the bound too")
