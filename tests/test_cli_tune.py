"""``fusiontune tune`` and ``fusiontune report`` on the command line: outputs, resume, user errors."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from fusiontune.cli import main

SPACE = (Path(__file__).resolve().parent / "data" / "tiny_space.toml").read_text() + """\
[search]
sampler = "tpe"
trials = 5
seed = 0
top_k = 2
workers = 0
"""


@pytest.fixture
def space(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # results/ goes under tmp_path
    path = tmp_path / "tiny.toml"
    path.write_text(SPACE)
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fusiontune: error: ")
    return err[0]


def test_tune_writes_the_report_and_resumes(space: Path, tmp_path: Path, capsys):
    assert main(["tune", str(space), "--no-progress"]) == 0
    out = capsys.readouterr().out
    results = tmp_path / "results" / "tiny"
    for name in (
        "study.db",
        "trials.csv",
        "report.md",
        "report.html",
        "fusion_switch.cfg",
        "graph_kernel_flags.txt",
        "best_config.json",
        "fusion_result.json",
    ):
        assert (results / name).is_file(), name
        assert f"results/tiny/{name}" in out
    assert "confirmation:" in out and "rank" in out
    assert "peak resident memory:" in out and "4 GB goal" in out
    assert main(["tune", str(space), "--trials", "7", "--no-confirm", "--no-progress"]) == 0
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{results / 'study.db'}")
    assert [t.number for t in study.trials] == list(range(7))
    assert "7 trials finished (2 in this run" in capsys.readouterr().out


def test_report_rebuilds_from_the_database(space: Path, tmp_path: Path, capsys):
    assert main(["tune", str(space), "--trials", "3", "--no-confirm", "--no-progress"]) == 0
    results = tmp_path / "results" / "tiny"
    (results / "trials.csv").unlink()
    assert main(["report", str(results)]) == 0
    assert (results / "trials.csv").is_file()


def test_tune_replays_a_recorded_study(space: Path, tmp_path: Path, capsys):
    assert main(["tune", str(space), "--trials", "4", "--no-confirm", "--no-progress"]) == 0
    db = tmp_path / "results" / "tiny" / "study.db"
    code = main(
        [
            "tune",
            str(space),
            "--study",
            "again",
            "--replay",
            str(db),
            "--trials",
            "6",
            "--sampler",
            "random",
            "--no-progress",
        ]
    )
    assert code == 0
    assert "confirmation skipped: replayed" in capsys.readouterr().out


def test_malformed_space_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(SPACE.replace('[workload]\nname = "mindspore_custom_op"', "[workload\nname = "))
    assert main(["tune", str(bad)]) == 2
    line = one_error_line(capsys)
    assert "bad.toml" in line
    assert not (tmp_path / "results").exists()


def test_unknown_pass_in_the_space_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "typo.toml"
    bad.write_text(SPACE.replace('"CompositeOpsFusionPass"', '"CompositeOpsFusion"'))
    assert main(["tune", str(bad)]) == 2
    line = one_error_line(capsys)
    assert "typo.toml" in line and "passes.search" in line and "CompositeOpsFusionPass" in line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://tuner@127.0.0.1:1/fusiontune",
        "nosuchdriver://x/y",
        "sqlite:////proc/no-such/study.db",
    ],
)
def test_storage_that_cannot_connect_is_one_line_and_exit_2(url: str, space: Path, capsys):
    assert main(["tune", str(space), "--storage", url]) == 2
    line = one_error_line(capsys)
    assert url.split("://")[0] in line and "storage" in line


def test_unknown_sampler_is_one_line_and_exit_2(space: Path, capsys):
    assert main(["tune", str(space), "--sampler", "cmaes"]) == 2
    assert "tpe" in one_error_line(capsys)


def test_bad_timeout_is_one_line_and_exit_2(space: Path, capsys):
    assert main(["tune", str(space), "--timeout", "8x"]) == 2
    assert "--timeout" in one_error_line(capsys)


def test_report_of_a_missing_folder_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(tmp_path / "results" / "nothing")]) == 2
    one_error_line(capsys)


def test_tune_with_nothing_within_the_bound_still_writes_the_report(
    space: Path, tmp_path: Path, capsys
):
    space.write_text(SPACE.replace("bound = 1e-6", "bound = 1e-30"))
    assert main(["tune", str(space), "--trials", "3", "--no-progress"]) == 0
    assert (tmp_path / "results" / "tiny" / "report.md").is_file()


def test_a_profile_that_cannot_be_made_leaves_the_report_without_it(
    space: Path, tmp_path: Path, capsys, monkeypatch
):
    from fusiontune.errors import UserError
    from fusiontune.report import build

    def refuse(*args, **kwargs):
        raise UserError("the study records no workload: nothing to profile")

    monkeypatch.setattr(build, "measure_profile", refuse)
    assert main(["tune", str(space), "--trials", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no kernel profile in the report: the study records no workload" in out
    assert (tmp_path / "results" / "tiny" / "report.md").is_file()
    assert not (tmp_path / "results" / "tiny" / "profile.json").exists()
