"""Progress without a terminal: one line per 10 trials or per minute, whichever comes first.

The unit tests drive :class:`ProgressLines` with a fake clock; the last test runs a real in-process
sweep on the seed network with stderr captured (not a terminal) and reads the lines it printed.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from fusiontune.tune._console import (
    PROGRESS_EVERY_S,
    PROGRESS_EVERY_TRIALS,
    ProgressLines,
    format_elapsed,
    progress_bar,
)
from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import load_space


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines_of(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def test_progress_lines_print_one_line_per_ten_trials_when_trials_are_fast():
    out, clock = io.StringIO(), Clock()
    with ProgressLines(40, 0, "s", stream=out, clock=clock) as p:
        for _ in range(25):
            clock.now += 0.5
            p.told(True)
    lines = lines_of(out)
    assert lines[0].startswith("progress s: 0/40 trials finished at the start")
    assert [re.search(r"(\d+)/40", line).group(1) for line in lines[1:]] == ["10", "20", "25"]


def test_progress_lines_print_every_trial_told_a_minute_after_the_last_line():
    out, clock = io.StringIO(), Clock()
    with ProgressLines(200, 0, "overnight", stream=out, clock=clock) as p:
        for _ in range(3):
            clock.now += 150.0  # an overnight sweep's 2.5-minute trials
            p.told(True)
    lines = lines_of(out)[1:]
    assert [line.split(",")[0] for line in lines] == [
        f"progress overnight: {n}/200 trials finished" for n in (1, 2, 3)
    ]
    assert lines[-1].endswith("7m30s elapsed")


def test_progress_line_says_finished_total_best_failures_and_elapsed():
    out, clock = io.StringIO(), Clock()
    p = ProgressLines(40, 12, "mlp", stream=out, clock=clock)
    p.told(False)
    p.told(True)
    p.set_postfix_str("best feasible 1.23 ms (trial 17)")
    clock.now += 185
    assert p.line() == (
        "progress mlp: 14/40 trials finished, best feasible 1.23 ms (trial 17), 1 failed,"
        " 3m05s elapsed"
    )


def test_progress_lines_end_with_a_line_only_when_trials_came_since_the_last():
    out = io.StringIO()
    with ProgressLines(20, 0, "s", stream=out, clock=Clock()) as p:
        for _ in range(PROGRESS_EVERY_TRIALS):
            p.told(True)
    assert len(lines_of(out)) == 2  # the start and the 10th trial; nothing new at the end


def test_messages_go_through_the_progress_lines_stream():
    out = io.StringIO()
    ProgressLines(1, 0, "s", stream=out).write("baselines on this machine: ...")
    assert lines_of(out) == ["baselines on this machine: ..."]


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0 s"), (59.9, "59 s"), (65, "1m05s"), (3600 * 2 + 7 * 60, "2h07m")]
)
def test_format_elapsed(seconds, text):
    assert format_elapsed(seconds) == text


def test_progress_bar_without_a_terminal_is_lines_and_off_with_no_progress(capsys):
    assert isinstance(progress_bar(True, 5, 0, "s"), ProgressLines)  # pytest's stderr: no tty
    assert progress_bar(False, 5, 0, "s").disable


def test_the_documented_interval_is_ten_trials_or_a_minute():
    assert (PROGRESS_EVERY_TRIALS, PROGRESS_EVERY_S) == (10, 60.0)


SPACE = """\
[workload]
name = "mindspore_custom_op"

[passes]
search = ["TbeEltwiseFusionPass", "CompositeOpsFusionPass", "TbeMultiOutputFusionPass", "TbeEltwiseSplitFusionPass"]

[split_points]
"TbeEltwiseSplitFusionPass.cut" = [0, 2]

[accuracy]
metric = "max_rel"
bound = 1e-6

[measure]
warmup = 0
repeat = 2
number = 1
min_repeat_ms = 0.0

[search]
sampler = "random"
trials = 12
seed = 0
workers = 0
"""


class FailingOddTrials:
    """In process; the request of every odd-numbered trial fails (the sweep reuses the
    measurements of programs already measured, so not every trial reaches the evaluator)."""

    def __init__(self, workload, measure) -> None:
        self.inner = LocalEvaluator(workload, measure)

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        out = []
        for r in requests:
            if r.trial >= 2 and r.trial % 2:
                out.append(EvalResult.failure(r.trial, r.config, "injected failure"))
            else:
                out.extend(self.inner.evaluate([r]))
        return out

    def close(self) -> None:
        return None


def test_a_sweep_without_a_terminal_prints_progress_lines(tmp_path: Path, capsys):
    path = tmp_path / "space.toml"
    path.write_text(SPACE)
    space = load_space(path)
    evaluator = FailingOddTrials(make_workload("mindspore_custom_op"), space.measure)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run_tune(space, evaluator, url, "s", 12)
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("progress s:")
    ]
    assert lines[0].startswith("progress s: 0/12 trials finished at the start")
    assert re.fullmatch(
        r"progress s: 10/12 trials finished, best feasible .+ \(trial \d+\), \d+ failed, \d+ s elapsed",
        lines[1],
    )
    failed = len(
        optuna.load_study(study_name="s", storage=url).get_trials(states=(TrialState.FAIL,))
    )
    assert failed > 0
    assert re.match(rf"progress s: 12/12 trials finished, .*, {failed} failed, ", lines[2])
    assert len(lines) == 3
