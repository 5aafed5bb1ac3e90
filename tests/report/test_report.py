"""The report is built from the storage alone: a hand-made optuna study following the schema.

No Ray, no numba compile: the trials are fake EvalResult records written the way the tuning loop
writes them (DESIGN.md section 8).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest

from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.config.fusion_result import read_fusion_result
from fusiontune.config.switch_file import load_config, load_switch_file
from fusiontune.errors import UserError
from fusiontune.measure import ErrorMetrics
from fusiontune.passes.base import FusionReport
from fusiontune.report import build_report, format_top, load_study_frame, report_command
from fusiontune.report.build import NO_FEASIBLE, NOT_CONFIRMED, NOT_DISTINGUISHABLE, ReportOptions
from fusiontune.report.plots import MISSING_SENTENCE
from fusiontune.report.tables import (
    best_so_far,
    effective_params,
    param_importance,
    pareto_front,
    pass_effect,
    searched_params,
)
from fusiontune.tune.records import EvalResult
from fusiontune.tune.store import StudyStore

optuna.logging.set_verbosity(optuna.logging.WARNING)

STUDY = "demo"
BOUND = 1e-3
SEARCHED = ("SoftmaxFusionPass", "GeluFusionPass", "TbeEltwiseFusionPass")
SPLIT = "TbeEltwiseSplitFusionPass.cut"
CUTS = [0, 2, 4, 8]
DISTRIBUTIONS = {
    **{f"pass.{p}": optuna.distributions.CategoricalDistribution(["off", "on"]) for p in SEARCHED},
    f"split.{SPLIT}": optuna.distributions.CategoricalDistribution(CUTS),
}

DEFAULTS = FusionConfig.defaults()
ALL_OFF = FusionConfig.all_off()
CONFIG_A = DEFAULTS.with_switches(SoftmaxFusionPass=False).with_splits(**{SPLIT: 4})
CONFIG_B = DEFAULTS.with_switches(GeluFusionPass=False)
CONFIG_C = DEFAULTS.with_splits(**{SPLIT: 8})
CONFIG_D = DEFAULTS.with_switches(TbeEltwiseFusionPass=False).with_splits(**{SPLIT: 4})
CONFIG_E = DEFAULTS.with_switches(SoftmaxFusionPass=False, GeluFusionPass=False)

# trial number -> (config, median_s or None for a failure, max_rel error, role, reused_from)
TRIALS = {
    0: (DEFAULTS, 1.0e-3, 1e-6, "defaults", None),
    1: (ALL_OFF, 2.0e-3, 0.0, "all_off", None),
    2: (CONFIG_A, 0.5e-3, 1e-5, None, None),
    3: (CONFIG_B, 0.4e-3, 1e-2, None, None),  # fastest, but breaks the bound
    4: (CONFIG_C, None, None, None, None),  # failed to compile
    5: (CONFIG_D, 0.5e-3, 1e-5, None, 2),  # same program as trial 2: reused its measurement
    6: (CONFIG_E, 0.8e-3, 2e-6, None, None),
}
CONFIRMATION = {
    "rows": [
        {
            "trial": 2,
            "config_key": CONFIG_A.key(),
            "median_s": 0.5e-3,
            "ci_low_s": 0.49e-3,
            "ci_high_s": 0.51e-3,
            "samples": 15,
        },
        {
            "trial": 6,
            "config_key": CONFIG_E.key(),
            "median_s": 0.8e-3,
            "ci_low_s": 0.78e-3,
            "ci_high_s": 0.82e-3,
            "samples": 15,
        },
        {
            "trial": 0,
            "config_key": DEFAULTS.key(),
            "median_s": 1.0e-3,
            "ci_low_s": 0.97e-3,
            "ci_high_s": 1.03e-3,
            "samples": 15,
        },
    ],
    "defaults_trial": 0,
    "winner_trial": 2,
    "distinguishable": True,
    "note": "3 configurations measured again, interleaved, in one process.",
}


def _params(config: FusionConfig) -> dict[str, object]:
    params: dict[str, object] = {
        f"pass.{p}": "on" if config.switches[p] else "off" for p in SEARCHED
    }
    params[f"split.{SPLIT}"] = config.split_points[SPLIT]
    return params


def _result(
    number: int, config: FusionConfig, median: float | None, error: float | None, noisy: bool = False
) -> EvalResult:
    phash = f"hash{2 if number == 5 else number}"
    if median is None:
        return EvalResult.failure(
            number,
            config,
            "TypingError: kernel failed to compile",
            node="node-a",
            program_hash=phash,
        )
    return EvalResult(
        trial=number,
        config_key=config.key(),
        program_hash=phash,
        status="ok",
        median_s=median,
        iqr_s=median * (0.4 if noisy else 0.02),
        cv=0.35 if noisy else 0.01,
        noisy=noisy,
        attempts=3 if noisy else 1,
        min_s=median * 0.98,
        samples_s=(median,) * 5,
        errors=ErrorMetrics(error * 3, error, error / 2, error / 10, True),
        kernels=10 + number,
        compile_s=0.25,
        peak_bytes=4096,
        node="node-a",
        fusion=FusionReport.from_counts(
            {
                "SoftmaxFusionPass": (1, int(config.switches["SoftmaxFusionPass"])),
                "TbeEltwiseFusionPass": (3, 3),
            }
        ),
    )


def make_study(
    results: Path,
    confirmation: dict | None = CONFIRMATION,
    trials: dict = TRIALS,
    directions: int = 1,
    noisy: set[int] | frozenset[int] = frozenset(),
) -> str:
    """A study in ``results/study.db`` written the way the tuning loop writes it."""
    results.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{results / 'study.db'}"
    study = optuna.create_study(study_name=STUDY, storage=url, directions=["minimize"] * directions)
    study.set_user_attr("space_path", "search_spaces/demo.toml")
    study.set_user_attr(
        "space_toml", 'workload = "mlp"\n[accuracy]\nmetric = "max_rel"\nbound = 1e-3\n'
    )
    study.set_user_attr("workload", "mlp")
    study.set_user_attr("sizes", {"batch": 64, "hidden": 128})
    study.set_user_attr("metric", "max_rel")
    study.set_user_attr("bound", BOUND)
    study.set_user_attr("machine", {"hostname": "node-a", "cpu_count": 2})
    for number, (config, median, error, role, reused) in trials.items():
        result = _result(number, config, median, error, number in noisy)
        attrs: dict[str, object] = {
            "result": result.to_json(),
            "config": config.to_json(),
            "program_hash": result.program_hash,
        }
        if role:
            attrs["role"] = role
        if reused is not None:
            attrs["reused_from"] = reused
        failed = median is None
        values = None if failed else ([median, error] if directions == 2 else [median])
        study.add_trial(
            optuna.trial.create_trial(
                params=_params(config),
                distributions=DISTRIBUTIONS,
                values=values,
                state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
                user_attrs=attrs,
                system_attrs={} if failed else {"constraints": [error - BOUND]},
            )
        )
    if confirmation is not None:
        study.set_user_attr("confirmation", confirmation)
    return url


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    out = tmp_path / "results" / STUDY
    make_study(out)
    return out


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def test_load_study_frame_has_one_row_per_trial_with_every_column(results: Path) -> None:
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY)
    assert sorted(frame["number"]) == list(TRIALS)
    for col in (
        "rank",
        "ranked_by",
        "status",
        "noisy",
        "baseline",
        "state",
        "median_s",
        "iqr_s",
        "cv",
        "max_abs",
        "max_rel",
        "rel_l2",
        "cosine",
        "feasible",
        "program_hash",
        "reused_from",
        "kernels",
        "compile_s",
        "node",
        "role",
        "speedup_vs_defaults",
        "speedup_vs_all_off",
        f"split.{SPLIT}",
        *(f"pass.{p}" for p in SEARCHED),
        "pass.MatMulBiasAddFusionPass",
    ):
        assert col in frame.columns, col
    by = frame.set_index("number")
    assert by.loc[4, "state"] == "FAIL" and "failed to compile" in by.loc[4, "error_msg"]
    assert by.loc[5, "reused_from"] == 2 and pd.isna(by.loc[2, "reused_from"])
    assert by.loc[2, "pass.SoftmaxFusionPass"] == "off" and by.loc[2, f"split.{SPLIT}"] == 4


def test_feasible_needs_complete_and_constraint_within_bound(results: Path) -> None:
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", None).set_index("number")
    assert frame["feasible"].to_dict() == {
        0: True,
        1: True,
        2: True,
        3: False,
        4: False,
        5: True,
        6: True,
    }


def test_speedups_are_relative_to_the_baseline_trials(results: Path) -> None:
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY).set_index("number")
    assert frame.loc[2, "speedup_vs_defaults"] == pytest.approx(2.0)
    assert frame.loc[2, "speedup_vs_all_off"] == pytest.approx(4.0)
    assert frame.loc[0, "speedup_vs_defaults"] == pytest.approx(1.0)
    assert math.isnan(frame.loc[4, "speedup_vs_defaults"])


def test_build_report_writes_every_file(results: Path) -> None:
    paths = build_report(results)
    names = {p.name for p in paths}
    expected = {
        "trials.csv",
        "report.md",
        "report.html",
        "fusion_switch.cfg",
        "graph_kernel_flags.txt",
        "best_config.json",
        "fusion_result.json",
        "best_so_far.png",
        "runtime_vs_error.png",
        "pass_effect.png",
        "param_importance.png",
    }
    assert expected <= names
    assert ("trials.parquet" in names) == _has_pyarrow()
    for p in paths:
        assert p.is_file() and p.stat().st_size > 0, p
        assert p.parent == results


def test_trials_csv_has_the_columns_and_speedups(results: Path) -> None:
    build_report(results)
    csv = pd.read_csv(results / "trials.csv").set_index("number")
    assert len(csv) == len(TRIALS)
    assert csv.loc[2, "speedup_vs_defaults"] == pytest.approx(2.0)
    assert csv.loc[6, "speedup_vs_all_off"] == pytest.approx(2.5)
    assert csv.loc[3, "max_rel"] == pytest.approx(1e-2)
    assert csv.loc[5, "program_hash"] == csv.loc[2, "program_hash"]


def test_recommendation_is_the_confirmed_winner(results: Path) -> None:
    build_report(results)
    assert load_switch_file(results / "fusion_switch.cfg").switches == CONFIG_A.switches
    assert load_config(results / "best_config.json") == CONFIG_A  # split points in the sidecar
    assert (results / "graph_kernel_flags.txt").read_text().strip() == render_flags(CONFIG_A)
    counts = read_fusion_result(results / "fusion_result.json")
    assert counts["SoftmaxFusionPass"] == (1, 0) and counts["TbeEltwiseFusionPass"] == (3, 3)
    data = json.loads((results / "fusion_result.json").read_text())
    assert data[0]["graph_fusion"]["SoftmaxFusionPass"] == {"match_times": "1", "effect_times": "0"}
    assert "TbeEltwiseFusionPass" in data[0]["ub_fusion"]


def test_markdown_lists_the_top_configurations_in_rank_order(results: Path) -> None:
    build_report(results)
    md = (results / "report.md").read_text()
    top = md.split("## Top 10 feasible configurations")[1].split("##")[0]
    table = [line for line in top.strip().splitlines() if line.startswith("|")]
    rows = [line.split("|")[2].strip() for line in table[2:]]
    # The winner, the other confirmed ones by confirmed median, then the sweep by speedup:
    # 3 breaks the bound, 4 failed.
    assert rows == ["2", "6", "0", "5", "1"]
    assert "Trial 2 is the winner" in md and "Confirmation" in md
    assert "mlp" in md and "max_rel <= 0.001" in md and "node-a" in md
    assert "![Runtime vs error](runtime_vs_error.png)" in md
    html = (results / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table>" in html


def test_second_build_from_the_database_alone_gives_the_same_csv(results: Path) -> None:
    build_report(results)
    first = (results / "trials.csv").read_text()
    for p in results.iterdir():
        if p.name != "study.db":
            p.unlink()
    build_report(results)
    assert (results / "trials.csv").read_text() == first
    assert load_config(results / "best_config.json") == CONFIG_A


def test_not_distinguishable_recommends_the_defaults(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    make_study(out, confirmation={**CONFIRMATION, "winner_trial": None, "distinguishable": False})
    build_report(out)
    assert load_config(out / "best_config.json") == DEFAULTS
    assert (out / "graph_kernel_flags.txt").read_text().strip() == ""
    assert NOT_DISTINGUISHABLE in (out / "report.md").read_text()


def test_without_confirmation_the_best_feasible_trial_is_recommended(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    make_study(out, confirmation=None)
    build_report(out)
    assert load_config(out / "best_config.json") == CONFIG_A  # 3 is faster but infeasible
    assert NOT_CONFIRMED in (out / "report.md").read_text()


def test_no_feasible_trial_writes_tables_but_no_cfg(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    make_study(out, confirmation=None, trials={3: TRIALS[3], 4: TRIALS[4]})
    names = {p.name for p in build_report(out)}
    assert "trials.csv" in names and "fusion_switch.cfg" not in names
    assert NO_FEASIBLE in (out / "report.md").read_text()


def test_importance_with_one_trial_is_skipped_with_a_reason(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    make_study(out, confirmation=None, trials={0: TRIALS[0]})
    names = {p.name for p in build_report(out)}
    assert "param_importance.png" not in names
    assert "Parameter importance not computed" in (out / "report.md").read_text()


def test_nsga2_study_with_two_objectives_builds(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    make_study(out, directions=2)
    names = {p.name for p in build_report(out)}
    assert "param_importance.png" in names
    assert load_config(out / "best_config.json") == CONFIG_A


def test_without_matplotlib_the_report_says_so_and_writes_tables(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    names = {p.name for p in build_report(results)}
    assert not any(n.endswith(".png") for n in names)
    assert {"trials.csv", "report.md", "report.html", "fusion_switch.cfg"} <= names
    assert MISSING_SENTENCE in (results / "report.md").read_text()


def test_pass_effect_compares_on_and_off(results: Path) -> None:
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY)
    effect = pass_effect(frame).set_index("pass")
    # Softmax off: trials 1, 2, 6 -> speedups 0.5, 2.0, 1.25; on: 0, 3, 5 -> 1.0, 2.5, 2.0.
    assert effect.loc["SoftmaxFusionPass", "off"] == pytest.approx(1.25)
    assert effect.loc["SoftmaxFusionPass", "on"] == pytest.approx(2.0)
    assert effect.loc["SoftmaxFusionPass", "n_on"] == 3


def test_pareto_front_keeps_the_undominated_trials(results: Path) -> None:
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY)
    assert list(pareto_front(frame)["number"]) == [3, 2, 6, 0, 1]


def test_format_top_ranks_feasible_trials(results: Path) -> None:
    text = format_top(load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY), n=5)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["rank", "trial", "median"]
    assert [line.split()[1] for line in lines[2:]] == ["2", "6", "0", "5", "1"]
    assert "2.00x" in lines[2] and "recommended: confirmed" in lines[2]
    assert "confirmed median" in lines[3] and "reuses #2" in lines[5] and "sweep" in lines[5]


def test_every_table_shows_one_order_and_the_study_records_its_first(results: Path) -> None:
    """The terminal table, report.md, trials.csv and the study's recommendation attr agree."""
    url = f"sqlite:///{results / 'study.db'}"
    build_report(results)
    terminal = [line.split()[1] for line in format_top(load_study_frame(url, STUDY)).splitlines()[2:]]
    md = (results / "report.md").read_text()
    top = md.split("## Top 10 feasible configurations")[1].split("##")[0]
    markdown = [line.split("|")[2].strip() for line in top.strip().splitlines() if line.startswith("|")][2:]
    csv = pd.read_csv(results / "trials.csv")
    ranked_csv = [str(n) for n in csv.loc[csv["rank"].notna(), "number"]]
    assert terminal == markdown == ranked_csv == ["2", "6", "0", "5", "1"]
    assert list(csv["rank"].dropna().astype(int)) == [1, 2, 3, 4, 5]  # ranked rows lead the file
    stored = StudyStore(optuna.load_study(study_name=STUDY, storage=url)).recommendation()
    assert stored is not None and stored.trial == 2 and stored.source == "confirmation"
    assert load_config(results / "best_config.json").key() == stored.config_key


def test_report_command_prints_the_top_and_the_paths(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_command(ReportOptions(results)) == 0
    out = capsys.readouterr().out
    assert (
        "rank" in out
        and str(results / "fusion_switch.cfg") in out
        and "Trial 2 is the winner" in out
    )


def test_report_command_with_storage_and_study_writes_a_new_folder(
    results: Path, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere"
    options = ReportOptions(other, storage=f"sqlite:///{results / 'study.db'}", study=STUDY)
    assert report_command(options) == 0
    assert (other / "report.md").is_file()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("missing_dir", "no such results folder"),
        ("empty_dir", "no such study database"),
        ("bad_study", "no study 'nope'"),
    ],
)
def test_bad_input_is_one_user_error(
    results: Path, tmp_path: Path, where: str, message: str
) -> None:
    args = {
        "missing_dir": (tmp_path / "nowhere", None),
        "empty_dir": (tmp_path, None),
        "bad_study": (results, "nope"),
    }[where]
    with pytest.raises(UserError, match=message) as info:
        build_report(args[0], study_name=args[1])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "study.db").exists()  # nothing created by looking


def test_storage_that_cannot_be_opened_is_one_user_error(tmp_path: Path) -> None:
    (tmp_path / "study.db").write_bytes(b"this is not a SQLite database" * 100)
    with pytest.raises(UserError, match="cannot open storage") as info:
        build_report(tmp_path)
    assert "\n" not in str(info.value)


def test_a_trial_left_running_by_a_kill_is_listed_not_ranked(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    url = make_study(out, confirmation=None)
    optuna.load_study(study_name=STUDY, storage=url).ask()  # in flight when the sweep died
    frame = load_study_frame(url, STUDY).set_index("number")
    assert frame.loc[7, "state"] == "RUNNING" and not frame.loc[7, "feasible"]
    assert "no result recorded" in frame.loc[7, "error_msg"]
    build_report(out)
    md = (out / "report.md").read_text()
    assert "| 7 | RUNNING |" in md
    assert load_config(out / "best_config.json") == CONFIG_A


def test_a_study_with_no_trials_gives_tables_and_no_cfg(tmp_path: Path) -> None:
    out = tmp_path / STUDY
    out.mkdir()
    optuna.create_study(study_name=STUDY, storage=f"sqlite:///{out / 'study.db'}")
    names = {p.name for p in build_report(out)}
    assert names == {"trials.csv", "report.md", "report.html"} | (
        {"trials.parquet"} if _has_pyarrow() else set()
    )


def test_passes_that_never_matched_are_listed_not_ranked(results: Path) -> None:
    """GeluFusionPass is searched, but no trial's fusion report has it matching: no effect, no
    importance, one line naming it; the passes that matched keep their effect."""
    url = f"sqlite:///{results / 'study.db'}"
    study = optuna.load_study(study_name=STUDY, storage=url)
    searched = searched_params(study)
    assert "pass.GeluFusionPass" in searched
    effective, never = effective_params(study, searched)
    assert never == ["GeluFusionPass", "TbeEltwiseSplitFusionPass"] and "pass.GeluFusionPass" not in effective
    assert "pass.SoftmaxFusionPass" in effective and f"split.{SPLIT}" not in effective
    importance, _method, _target = param_importance(study, effective)
    assert importance is None or "pass.GeluFusionPass" not in importance
    build_report(results)
    md = (results / "report.md").read_text()
    effect_section = md.split("## Per-pass effect")[1].split("\n## ")[0]
    assert "Never matched in this workload" in effect_section and "GeluFusionPass" in effect_section
    assert "| GeluFusionPass |" not in effect_section


def test_a_noisy_measurement_is_flagged_in_every_table(tmp_path: Path) -> None:
    noisy = dict(TRIALS)
    out = tmp_path / "results" / STUDY
    make_study(out, trials=noisy, noisy={6})
    frame = load_study_frame(f"sqlite:///{out / 'study.db'}", STUDY)
    assert list(frame.loc[frame["noisy"], "number"]) == [6]
    row = [line for line in format_top(frame).splitlines()[2:] if line.split()[1] == "6"]
    assert row and "noisy: CV" in row[0]
    build_report(out)
    assert "noisy: CV" in (out / "report.md").read_text()
    csv = pd.read_csv(out / "trials.csv")
    assert bool(csv.loc[csv["number"] == 6, "noisy"].iloc[0])


def test_best_so_far_follows_trial_numbers_not_the_ranking(results: Path) -> None:
    """The table leads with the ranking (2, 6, 0, 5, 1); the curve is over trial numbers."""
    frame = load_study_frame(f"sqlite:///{results / 'study.db'}", STUDY)
    assert list(frame["number"][:5]) == [2, 6, 0, 5, 1]
    best = best_so_far(frame)
    assert list(best.index) == sorted(TRIALS)
    # Feasible medians by number: 0 -> 1.0 ms, 1 -> 2.0, 2 -> 0.5, 3 breaks the bound, 4 failed.
    assert list(best * 1e3) == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5])
