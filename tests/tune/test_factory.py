"""create_evaluator: the one place an evaluator is chosen, by the table in its module docstring."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusiontune.errors import UserError
from fusiontune.tune.factory import create_evaluator
from fusiontune.workloads.space import SearchSpace, loads_space

DATA = Path(__file__).resolve().parents[1] / "data"
COMMAND_SPACE = """\
[target]
kind = "command"
command = ["{python}", "job.py"]
[target.metrics]
runtime = "runtime_s"
error = "error"
[passes]
GraphFusion = ["SoftmaxFusionPass"]
[accuracy]
bound = 1e-3
"""


def tiny_space(tmp_path: Path) -> SearchSpace:
    return loads_space((DATA / "tiny_space.toml").read_text(), str(tmp_path / "tiny.toml"))


def test_no_workers_evaluates_in_process_on_the_workload_it_built(tmp_path: Path) -> None:
    from fusiontune.tune.evaluator import Evaluator, LocalEvaluator

    created = create_evaluator(tiny_space(tmp_path), workers=0)
    assert isinstance(created.evaluator, LocalEvaluator)
    assert isinstance(created.evaluator, Evaluator)  # the protocol every caller speaks
    assert created.workload is not None and created.workload.name == "mindspore_custom_op"
    assert created.evaluator.workload is created.workload


def test_a_command_target_runs_the_job_in_base_dir(tmp_path: Path) -> None:
    from fusiontune.tune.command import CommandEvaluator

    space = loads_space(COMMAND_SPACE, str(tmp_path / "job.toml"))
    created = create_evaluator(space, base_dir=tmp_path / "trials")
    assert isinstance(created.evaluator, CommandEvaluator) and created.workload is None
    assert created.evaluator.base_dir == (tmp_path / "trials").resolve()


def test_a_missing_replay_file_is_one_user_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "study.db"
    with pytest.raises(UserError, match=f"^{missing}: no such file") as info:
        create_evaluator(tiny_space(tmp_path), replay=str(missing))
    assert "\n" not in str(info.value)


def test_negative_workers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="workers must be 0"):
        create_evaluator(tiny_space(tmp_path), workers=-1)
