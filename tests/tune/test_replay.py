"""ReplayEvaluator: recorded configurations answer from the table, unknown ones fail, no numba."""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.measure import ErrorMetrics
from fusiontune.tune.evaluator import Evaluator, LocalEvaluator
from fusiontune.tune.records import OK, EvalRequest, EvalResult
from fusiontune.tune.replay import NOT_RECORDED, ReplayEvaluator
from fusiontune.tune.store import StudyStore
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import load_space

SPACE = (Path(__file__).resolve().parents[1] / "data" / "tiny_space.toml").read_text() + """\
[search]
sampler = "random"
seed = 0
workers = 0
"""

DEFAULTS = FusionConfig.defaults()
ERRORS = ErrorMetrics(1e-8, 1e-8, 1e-8, 1e-8, True)
ALL_OFF = FusionConfig.all_off()


def recorded(config: FusionConfig, median_s: float, trial: int = 7) -> EvalResult:
    return EvalResult(
        trial, config.key(), f"hash-{trial}", OK, median_s=median_s, errors=ERRORS
    )


def test_replay_is_an_evaluator():
    assert isinstance(ReplayEvaluator([]), Evaluator)


def test_a_recorded_configuration_answers_its_recorded_result():
    replay = ReplayEvaluator([recorded(DEFAULTS, 2e-3)])
    (result,) = replay.evaluate([EvalRequest(11, DEFAULTS)])
    assert result.ok and result.median_s == 2e-3 and result.errors == ERRORS
    assert result.trial == 11 and result.extra["replayed_from"] == 7


def test_an_unknown_configuration_is_a_failed_result():
    replay = ReplayEvaluator([recorded(DEFAULTS, 2e-3)])
    (result,) = replay.evaluate([EvalRequest(3, ALL_OFF)])
    assert not result.ok and result.error_msg == NOT_RECORDED
    assert result.trial == 3 and result.config_key == ALL_OFF.key()


def test_answers_keep_request_order():
    replay = ReplayEvaluator(
        {DEFAULTS.key(): recorded(DEFAULTS, 1.0), ALL_OFF.key(): recorded(ALL_OFF, 2.0)}
    )
    results = replay.evaluate(
        [EvalRequest(0, ALL_OFF), EvalRequest(1, DEFAULTS), EvalRequest(2, ALL_OFF)]
    )
    assert [r.median_s for r in results] == [2.0, 1.0, 2.0]


def test_a_successful_record_wins_over_a_failed_one_of_the_same_configuration():
    failed = EvalResult.failure(1, DEFAULTS, "worker died")
    replay = ReplayEvaluator([failed, recorded(DEFAULTS, 3.0), recorded(DEFAULTS, 9.0)])
    assert replay.evaluate([EvalRequest(0, DEFAULTS)])[0].median_s == 3.0


def test_a_dataframe_table_with_metric_columns():
    frame = pd.DataFrame(
        [
            {"config_key": DEFAULTS.key(), "median_s": 1.5, "max_rel": 2e-7, "kernels": 3.0},
            {"config_key": ALL_OFF.key(), "status": "failed", "error_msg": "timed out after 5 s"},
        ]
    )
    replay = ReplayEvaluator(frame)
    ok, failed = replay.evaluate([EvalRequest(0, DEFAULTS), EvalRequest(1, ALL_OFF)])
    assert ok.ok and ok.median_s == 1.5 and ok.error("max_rel") == 2e-7 and ok.kernels == 3
    assert not failed.ok and failed.error_msg == "timed out after 5 s"


@pytest.fixture(scope="module")
def recorded_study(tmp_path_factory) -> tuple[str, object]:
    tmp = tmp_path_factory.mktemp("replay")
    (tmp / "space.toml").write_text(SPACE)
    space = load_space(tmp / "space.toml")
    url = f"sqlite:///{tmp / 'study.db'}"
    local = LocalEvaluator(make_workload("mindspore_custom_op"), space.measure)
    run_tune(space, local, url, "recorded", 10, progress=False)
    return url, space


def test_from_study_replays_every_measured_configuration(recorded_study):
    url, _ = recorded_study
    replay = ReplayEvaluator.from_study(url)
    for t in StudyStore(optuna.load_study(study_name="recorded", storage=url)).trials():
        assert t.config is not None
        (result,) = replay.evaluate([EvalRequest(t.number, t.config)])
        assert result.ok and result.median_s == t.values[0]


def test_from_study_takes_a_plain_path(recorded_study):
    url, _ = recorded_study
    assert len(ReplayEvaluator.from_study(url.removeprefix("sqlite:///"))) > 0


def test_from_study_names_a_missing_study(recorded_study):
    url, _ = recorded_study
    with pytest.raises(UserError, match="no study 'other'"):
        ReplayEvaluator.from_study(url, "other")


def test_a_replayed_sweep_is_deterministic(recorded_study, tmp_path: Path):
    url, space = recorded_study
    values = []
    for name in ("a", "b"):
        replay = ReplayEvaluator.from_study(url)
        target = f"sqlite:///{tmp_path / (name + '.db')}"
        run_tune(space, replay, target, name, 12, sampler="tpe", seed=3, progress=False)
        study = optuna.load_study(study_name=name, storage=target)
        values.append([(t.state, t.values, t.params) for t in study.trials])
    assert values[0] == values[1]
