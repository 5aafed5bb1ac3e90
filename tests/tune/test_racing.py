"""Racing of a command target: a clearly slower configuration stops repeating, ties run in full.

The job is a small script written into the test's folder: its runtime is a product of factors,
one per pass that is on, times a run-to-run noise that is the same for every configuration
(``NOISE[run]``, about 1%), so which configurations are clearly slower is known exactly.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import optuna
import pandas as pd
import pytest

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure.racing import RACE
from fusiontune.tune.command import CommandEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult
from fusiontune.tune.store import StudyStore
from fusiontune.workloads.space import SearchSpace, load_space

JOB = """
import json, sys
from pathlib import Path

SPEED = {"FastPass": 0.7, "SlowPass": 1.5, "TiePass": 1.004, "BadPass": 0.9}
NOISE = [1.0, 1.01, 0.99, 1.006, 0.994]
config, trial_dir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
on = {name for name, value in config["GraphFusion"].items() if value == "on"}
counter = trial_dir / "runs"
run = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(run + 1))
runtime = 1.0
for name in on:
    runtime *= SPEED.get(name, 1.0)
error = 1e-2 if "BadPass" in on else 1e-4
print(json.dumps({"runtime_s": runtime * NOISE[run % len(NOISE)], "error": error}))
"""

SPACE = """
[target]
kind = "command"
command = ["{{python}}", "job.py", "{{config_json}}", "{{trial_dir}}"]
repeats = {repeats}
racing = {racing}
timeout_s = 60

[passes]
GraphFusion = ["FastPass", "SlowPass", "TiePass", "BadPass"]

[accuracy]
bound = 1e-3

[search]
sampler = "random"
seed = 3
top_k = {top_k}
"""


def write_space(tmp_path: Path, repeats: int = 5, racing: bool = True, top_k: int = 3) -> Path:
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    path = tmp_path / "job.toml"
    path.write_text(SPACE.format(repeats=repeats, racing=str(racing).lower(), top_k=top_k))
    return path


def config(space: SearchSpace, *on: str) -> FusionConfig:
    switches = {name: name in on for name in space.searched}
    return FusionConfig.all_off(space.passes).with_switches(**switches)


def run_trials(tmp_path: Path, *requests: EvalRequest) -> list[EvalResult]:
    space = load_space(write_space(tmp_path))
    assert space.target is not None
    return CommandEvaluator(space.target, tmp_path / "trials").evaluate(list(requests))


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    return load_space(write_space(tmp_path))


@pytest.fixture
def incumbent(space: SearchSpace, tmp_path: Path) -> EvalResult:
    (result,) = run_trials(tmp_path, EvalRequest(0, config(space, "FastPass")))
    assert result.ok and result.runs == 5 and not result.raced_out
    return result


def race(result: EvalResult, **fields: object) -> dict[str, object]:
    return {"race_against": result.samples_s, "race_node": result.node, **fields}


# ---- the evaluator -------------------------------------------------------------------------------
def test_a_clearly_slower_configuration_stops_after_two_runs(
    space: SearchSpace, incumbent: EvalResult, tmp_path: Path
) -> None:
    (slow,) = run_trials(
        tmp_path, EvalRequest(1, config(space, "FastPass", "SlowPass"), **race(incumbent))
    )
    assert slow.ok and slow.raced_out and slow.runs == 2
    assert slow.median_s == pytest.approx(0.7 * 1.5 * 1.005)  # the median of the runs made
    assert len(slow.samples_s) == 2
    trial = tmp_path / "trials" / "1"
    assert (trial / "stdout.2.log").is_file() and not (trial / "stdout.3.log").exists()
    record = json.loads((trial / "result.json").read_text())
    assert [r["run"] for r in record["runs"]] == [1, 2]
    assert record["raced_out"].startswith("clearly slower than the incumbent after 2 of 5 runs")
    assert slow.extra["raced_out"] == record["raced_out"]


def test_the_incumbent_and_near_ties_run_every_repeat(
    space: SearchSpace, incumbent: EvalResult, tmp_path: Path
) -> None:
    same, tie, faster = run_trials(
        tmp_path,
        EvalRequest(1, config(space, "FastPass"), **race(incumbent)),
        EvalRequest(2, config(space, "FastPass", "TiePass"), **race(incumbent)),
        EvalRequest(
            3,
            FusionConfig.all_off(space.passes).with_switches(FastPass=True, BadPass=True),
            **race(incumbent),
        ),
    )
    for result in (same, tie, faster):
        assert result.ok and result.runs == 5 and not result.raced_out
    assert same.samples_s == incumbent.samples_s


def test_an_error_above_the_bound_stops_after_the_first_run(
    space: SearchSpace, tmp_path: Path
) -> None:
    (bad,) = run_trials(tmp_path, EvalRequest(1, config(space, "BadPass"), race_bound=space.bound))
    assert bad.ok and bad.raced_out and bad.runs == 1
    assert bad.reported["error"] == pytest.approx(1e-2)  # infeasible as measured
    assert bad.extra["raced_out"] == "error 0.01 above the bound 0.001 after 1 of 5 runs"


def test_a_request_without_an_incumbent_or_on_another_node_runs_every_repeat(
    space: SearchSpace, incumbent: EvalResult, tmp_path: Path
) -> None:
    slow = config(space, "FastPass", "SlowPass")
    plain, elsewhere = run_trials(
        tmp_path,
        EvalRequest(1, slow),
        EvalRequest(2, slow, **race(incumbent, race_node="another-node")),
    )
    assert plain.runs == 5 and elsewhere.runs == 5
    assert not plain.raced_out and not elsewhere.raced_out


def test_racing_fields_survive_the_record(
    space: SearchSpace, incumbent: EvalResult, tmp_path: Path
) -> None:
    (slow,) = run_trials(tmp_path, EvalRequest(1, config(space, "SlowPass"), **race(incumbent)))
    again = EvalResult.from_json(json.loads(json.dumps(slow.to_json())))
    assert (again.runs, again.raced_out) == (2, True)
    old = {k: v for k, v in slow.to_json().items() if k not in ("runs", "raced_out")}
    assert (EvalResult.from_json(old).runs, EvalResult.from_json(old).raced_out) == (0, False)


def test_racing_is_a_switch_of_the_target(tmp_path: Path) -> None:
    assert load_space(write_space(tmp_path)).target.racing  # type: ignore[union-attr]
    assert not load_space(write_space(tmp_path, racing=False)).target.racing  # type: ignore[union-attr]
    bad = tmp_path / "bad.toml"
    bad.write_text(SPACE.format(repeats=5, racing='"yes"', top_k=3))
    with pytest.raises(Exception, match="target.racing: expected true or false"):
        load_space(bad)


# ---- the sweep and the confirmation ---------------------------------------------------------------
def tune(tmp_path: Path, trials: int, *extra: str) -> tuple[list, str]:
    path = tmp_path / "job.toml"
    assert (
        main(
            ["tune", str(path), "--workers", "0", "--trials", str(trials), "--no-progress", *extra]
        )
        == 0
    )
    storage = f"sqlite:///{tmp_path / 'results' / 'job' / 'study.db'}"
    study = optuna.load_study(study_name="job", storage=storage)
    return StudyStore(study).trials(), storage


def test_tune_races_out_slow_trials_and_resumes(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path)
    trials, _ = tune(tmp_path, 6, "--no-confirm")
    err = capsys.readouterr().err
    assert len(trials) == 6 and all(t.state == "COMPLETE" for t in trials)
    results = {t.number: t.result for t in trials if t.result is not None and t.reused_from is None}
    raced = [r for r in results.values() if r.raced_out]
    assert raced, "some trial must be raced out"
    for r in results.values():
        assert r.runs == 5 or (r.raced_out and r.runs < 5 and len(r.samples_s) == r.runs)
    saved = sum(5 - r.runs for r in raced)
    assert f"racing: {saved} of " in err and f"({len(raced)} trial" in err
    # trials.csv says which trials were raced out and how many runs each made.
    table = pd.read_csv(tmp_path / "results" / "job" / "trials.csv").set_index("number")
    for number, r in results.items():
        assert table.loc[number, "runs"] == r.runs
        assert bool(table.loc[number, "raced_out"]) == r.raced_out
    # Resume: the same command to a larger total continues the study, racing in the new window.
    trials, _ = tune(tmp_path, 9, "--no-confirm")
    capsys.readouterr()
    assert [t.number for t in trials] == list(range(9))
    assert all(t.state == "COMPLETE" for t in trials)


def test_a_trial_raced_out_keeps_its_measurement_and_feasibility(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path)
    trials, storage = tune(tmp_path, 8, "--no-confirm")
    capsys.readouterr()
    baselines = StudyStore(optuna.load_study(study_name="job", storage=storage)).baselines()
    # What the first trials raced against: the window's feasible baselines (all-off here).
    known = [
        r.median_s
        for b in baselines
        for r in (b.defaults, b.all_off)
        if r.ok and r.reported["error"] <= 1e-3
    ]
    raced = 0
    for t in sorted(trials, key=lambda t: t.number):
        assert t.result is not None
        if t.result.raced_out:
            raced += 1
            assert t.measured and t.values == (t.result.median_s,)
            bad = t.config is not None and t.config.switches.get("BadPass", False)
            assert t.feasible == (not bad)
            if not bad:  # raced out by time: clearly slower than the fastest feasible before it
                assert t.median_s > (1 + RACE.margin) * min(known)
        elif t.feasible and t.reused_from is None:
            known.append(t.median_s)
    assert raced


def test_without_racing_every_trial_runs_every_repeat(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path, racing=False)
    trials, _ = tune(tmp_path, 6, "--no-confirm")
    assert "racing:" not in capsys.readouterr().err
    assert all(
        t.result is not None and t.result.runs == 5 and not t.result.raced_out for t in trials
    )


def test_the_confirmation_stops_rerunning_a_clearly_slower_candidate(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path, top_k=4)
    tune(tmp_path, 8)
    out = capsys.readouterr().out
    store_url = f"sqlite:///{tmp_path / 'results' / 'job' / 'study.db'}"
    record = StudyStore(optuna.load_study(study_name="job", storage=store_url)).confirmation()
    assert record is not None
    samples = {row.trial: row.samples for row in record.rows}
    best = min(record.rows, key=lambda row: row.median_s if row.feasible else math.inf)
    assert samples[best.trial] == 15 and samples[record.defaults_trial] == 15
    raced = [row for row in record.rows if row.samples < 15]
    assert raced and all(row.samples == 5 for row in raced)  # after round 1 of 3
    assert "not run again, clearly slower than the best" in record.note and record.note in out
    for row in raced:
        assert f"trial {row.trial} (clearly slower than trial {best.trial}" in record.note
        assert not (tmp_path / "results" / "job" / "confirm" / "round1" / str(row.trial)).exists()


def test_an_incumbent_with_impossible_runtimes_is_no_race(
    space: SearchSpace, tmp_path: Path
) -> None:
    slow = config(space, "SlowPass")
    (result,) = run_trials(tmp_path, EvalRequest(1, slow, race_against=(0.0, -1.0)))
    assert result.ok and result.runs == 5 and not result.raced_out


def test_a_runs_budget_spends_the_runs_racing_saves_on_new_trials(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path)
    trials, _ = tune(tmp_path, 100, "--no-confirm", "--runs", "25")
    out = capsys.readouterr().out
    assert "stopped on runs" in out
    results = [t.result for t in trials if t.result is not None and t.reused_from is None]
    runs = sum(r.runs for r in results)
    assert 25 <= runs < 25 + 5  # one trial of 5 runs at most past the budget
    assert any(r.raced_out for r in results)
    assert len(results) > 25 // 5  # more trials than the runs pay for without racing
    assert len(trials) < 100


def test_a_runs_budget_needs_a_command_target(tmp_path: Path, capsys) -> None:
    space = tmp_path / "mlp.toml"
    space.write_text('[workload]\nname = "mlp"\n[passes]\nsearch = ["GeluFusionPass"]\n')
    assert main(["tune", str(space), "--runs", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs budgets job runs of a command target" in err[0]
