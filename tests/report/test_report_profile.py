"""The report's kernel profile: measured on request, stored as profile.json, read by every rebuild.

The study is the committed example (a real sweep of a built-in workload); the profile is real
(numba kernels, timed). Nothing depends on how fast anything is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.report import build_report
from fusiontune.report._profile import PROFILE_FILE, StoredProfile, measure_profile
from fusiontune.report.build import write_report
from fusiontune.tune.store import StudyInfo

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Where the time goes (recommended configuration)"


@pytest.fixture
def example(tmp_path: Path) -> Path:
    out = tmp_path / "example"
    out.mkdir()
    shutil.copy(REPO / "results" / "example" / "study.db", out / "study.db")
    return out


def test_no_profile_file_no_section_and_nothing_measured(example: Path) -> None:
    paths = build_report(example)
    assert SECTION not in (example / "report.md").read_text()
    assert not (example / PROFILE_FILE).exists() and example / PROFILE_FILE not in paths


def test_profile_is_measured_stored_and_kept_by_rebuilds(example: Path) -> None:
    built = write_report(example, profile=True)
    assert example / PROFILE_FILE in built.paths
    stored = StoredProfile.from_json(json.loads((example / PROFILE_FILE).read_text()))
    assert built.recommendation.config is not None
    assert stored.config_key == built.recommendation.config.key()
    md = (example / "report.md").read_text()
    section = md[md.index(SECTION) :].split("\n## ")[0]
    for k in stored.profile.kernels:
        assert f"`{k.name}`" in section
    assert "Sum of the kernels' medians" in section
    assert (
        "<h2>Where the time goes (recommended configuration)</h2>"
        in (example / "report.html").read_text()
    )

    before = (example / "report.md").read_bytes()
    build_report(example)  # a rebuild reads the record: the same bytes, no measurement
    assert (example / "report.md").read_bytes() == before


def test_a_profile_of_another_configuration_is_named_not_shown(example: Path) -> None:
    write_report(example, profile=True)
    record = json.loads((example / PROFILE_FILE).read_text())
    record["config_key"] = "0123456789ab"
    (example / PROFILE_FILE).write_text(json.dumps(record))
    build_report(example)
    md = (example / "report.md").read_text()
    assert "holds the profile of configuration `0123456789ab`" in md
    assert "Sum of the kernels' medians" not in md


def test_a_command_targets_study_has_no_kernels_to_profile(tmp_path: Path) -> None:
    info = StudyInfo(workload="job", target={"command": "python train.py"})
    with pytest.raises(UserError, match="command target"):
        measure_profile(info, FusionConfig.defaults(), None, tmp_path, info.target)


def test_report_profile_on_the_command_line(example: Path, capsys) -> None:
    assert main(["report", str(example), "--profile"]) == 0
    assert str(example / PROFILE_FILE) in capsys.readouterr().out
    (example / PROFILE_FILE).write_text("{not json")
    assert main(["report", str(example)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and PROFILE_FILE in err[0]
