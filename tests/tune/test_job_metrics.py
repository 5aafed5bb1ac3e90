"""A job's metrics must be ones it can have: a runtime finite and > 0, an error finite and >= 0.

Each case is a real job (a small script) that prints its last JSON line; the trial fails with a
reason naming the metric and the value, so a job that lies cannot become the recommendation. The
same rule holds for results that arrive from elsewhere (a Ray node, the confirmation's evaluator).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.tune._job_output import MetricError, read_metric, refuse_bad_metrics
from fusiontune.tune.command import CommandEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.workloads.space import loads_space
from fusiontune.workloads.target import MetricSpec

SPACE = """\
[target]
kind = "command"
command = ["{{python}}", "{job}"]
timeout_s = 20
[target.metrics]
{metrics}
[passes]
GraphFusion = ["SoftmaxFusionPass"]
[accuracy]
bound = 1e-3
"""
KEYS = 'runtime = "runtime_s"\nerror = "error"'


def run_job(tmp_path: Path, last_line: str, metrics: str = KEYS) -> EvalResult:
    """One trial of a job whose last line on stdout is ``last_line``."""
    job = tmp_path / "job.py"
    job.write_text(f"print('GE noise')\nprint({last_line!r})\n")
    space = loads_space(SPACE.format(job=job, metrics=metrics), str(tmp_path / "job.toml"))
    assert space.target is not None
    evaluator = CommandEvaluator(space.target, tmp_path / "trials")
    (result,) = evaluator.evaluate([EvalRequest(0, FusionConfig.defaults(space.passes))])
    return result


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            '{"runtime_s": -0.5, "error": 0.0}',
            "runtime_s is -0.5: a runtime must be finite and > 0",
        ),
        ('{"runtime_s": 0, "error": 0.0}', "runtime_s is 0.0: a runtime must be finite and > 0"),
        (
            '{"runtime_s": Infinity, "error": 0.0}',
            "runtime_s is Infinity: a runtime must be finite",
        ),
        ('{"runtime_s": NaN, "error": 0.0}', "runtime_s is NaN: a runtime must be finite and > 0"),
        (
            '{"runtime_s": 0.01, "error": -0.001}',
            "error is -0.001: an error must be finite and >= 0",
        ),
        ('{"runtime_s": 0.01, "error": -Infinity}', "error is -Infinity: an error must be finite"),
        (
            '{"runtime_s": 0.01, "error": "0.1"}',
            'error is "0.1", a JSON string: it must be a JSON number',
        ),
        ('{"runtime_s": "0.01", "error": 0.1}', 'runtime_s is "0.01", a JSON string'),
        ('{"runtime_s": 1e999, "error": 0.1}', "runtime_s is Infinity"),  # overflows to inf
    ],
)
def test_a_metric_the_job_cannot_have_fails_the_trial_naming_it(
    tmp_path: Path, line: str, reason: str
) -> None:
    result = run_job(tmp_path, line)
    assert result.status == EvalStatus.RUN_FAILED and not result.ok
    assert result.error_msg.startswith(reason), result.error_msg
    assert result.error_msg.endswith(f"log: {tmp_path / 'trials' / '0' / 'stdout.log'}")
    assert result.error("error") == math.inf and result.median_s == math.inf
    record = json.loads((tmp_path / "trials" / "0" / "result.json").read_text())
    assert record["status"] == "run failed" and record["runtime_s"] is None


def test_a_zero_error_and_an_integer_runtime_are_metrics(tmp_path: Path) -> None:
    result = run_job(tmp_path, '{"runtime_s": 2, "error": 0}')
    assert result.ok, result.error_msg
    assert result.median_s == 2.0 and result.reported["error"] == 0.0


def test_a_regex_match_is_text_and_is_parsed_but_must_obey_the_rule(tmp_path: Path) -> None:
    metrics = "runtime_regex = 'took ([-0-9.e]+) s'\nerror_regex = 'err=(\\S+)'"
    ok = run_job(tmp_path, "took 0.25 s, err=1e-4", metrics)
    assert ok.ok and ok.median_s == 0.25 and ok.reported["error"] == 1e-4
    bad = run_job(tmp_path, "took -0.25 s, err=1e-4", metrics)
    assert bad.error_msg.startswith(
        "runtime (from runtime_regex) is -0.25: a runtime must be finite"
    )
    inf = run_job(tmp_path, "took 0.25 s, err=inf", metrics)
    assert inf.error_msg.startswith("error (from error_regex) is Infinity: an error must be finite")


def test_read_metric_refuses_a_json_string_but_not_the_same_text_from_a_regex() -> None:
    spec = MetricSpec("error", key="error")
    with pytest.raises(MetricError, match="a JSON string"):
        read_metric(spec, "", {"error": "0.1"})
    assert read_metric(MetricSpec("error", regex="e=(.*)"), "e=0.1", None) == 0.1


def _ok(samples: tuple[float, ...], error: float) -> EvalResult:
    return EvalResult(
        3,
        "k",
        "",
        EvalStatus.OK,
        median_s=sorted(samples)[len(samples) // 2],
        samples_s=samples,
        reported={"error": error},
        node="n",
    )


@pytest.mark.parametrize(
    ("samples", "error", "reason"),
    [
        ((0.1, -0.2, 0.1), 0.0, "the runtime is -0.2: a runtime must be finite and > 0"),
        ((0.1,), math.inf, "the error is Infinity: an error must be finite and >= 0"),
        ((0.1,), -1.0, "the error is -1.0: an error must be finite and >= 0"),
    ],
)
def test_a_result_from_elsewhere_with_bad_metrics_is_refused(
    samples: tuple[float, ...], error: float, reason: str
) -> None:
    refused = refuse_bad_metrics(_ok(samples, error))
    assert refused.status == EvalStatus.RUN_FAILED and refused.error_msg == reason
    assert refused.median_s == math.inf and refused.samples_s == () and refused.node == "n"


def test_a_good_or_failed_result_passes_unchanged() -> None:
    good = _ok((0.1, 0.2), 0.0)
    assert refuse_bad_metrics(good) is good
    failed = dataclasses.replace(good, status=EvalStatus.TIMEOUT, median_s=-1.0)
    assert refuse_bad_metrics(failed) is failed
