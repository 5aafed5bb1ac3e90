"""Command target: the user's own job, run per trial in its folder; failures are values; CLI end to end.

The job is the bundled example (``search_spaces/examples/cann_job.py``, ``mindspore_job.py``):
pure Python, deterministic, with test hooks (``FT_EXAMPLE_HANG`` ...) that make it hang, crash
or print garbage when one of the named passes is on (``*``: always).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import optuna
import pytest

from fusiontune.cli import main
from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import ConfigError, FusionConfig, JobPass, job_table
from fusiontune.config.switch_file import dump_switch_json, load_config, loads_switch
from fusiontune.tune._job_output import fusion_from_log, last_json_object
from fusiontune.tune.command import CommandEvaluator
from fusiontune.tune.records import EvalRequest, EvalStatus
from fusiontune.tune.store import StudyStore
from fusiontune.workloads.space import (
    SpaceError,
    baseline_params,
    config_from_params,
    load_space,
    loads_space,
)

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
CANN = SPACES / "cann_atc_template.toml"
MINDSPORE = SPACES / "mindspore_template.toml"
CULPRIT = "ConvBatchnormFusionPass"
# The example jobs' optima within the bound of 1e-3 (see their docstrings).
CANN_OFF = {CULPRIT, "ConvConcatFusionPass", "TfMergeSubFusionPass"}
CANN_BEST_S = 0.0131
MINDSPORE_OFF = {"matmul_elem_gelu_fusion", "split_concat_fusion", "shape_reshape"}
MINDSPORE_BEST_S = 0.032
GE_LINE = (
    "[INFO] GE(3675829,atc.bin):2025-04-10-20:10:58.288.365 [pattern_fusion_base_pass.cc:259]3675829"
    " RunOnePattern:GraphId[0], GraphFusionPass[TfTagNoConstFoldingFusionPass]: "
    "pattern=tfTagNoConstFoldingFusion1, matched_times=2, effected_times=2."
)


def space_text(template: Path, **target: str) -> str:
    """The template with its workdir made absolute (so a copy runs anywhere) and target keys set."""
    text = template.read_text()
    text = re.sub(r'^workdir = "\."', f'workdir = "{SPACES}"', text, flags=re.M)
    for key, value in target.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    return text


def write_space(tmp_path: Path, template: Path = CANN, name: str = "job.toml", **target: str) -> Path:
    path = tmp_path / name
    path.write_text(space_text(template, **target))
    return path


def optimum(space) -> FusionConfig:
    off = CANN_OFF if "ConvBatchnormFusionPass" in space.searched else MINDSPORE_OFF
    return FusionConfig.defaults(space.passes).with_switches(**dict.fromkeys(off, False))


def evaluate(tmp_path: Path, config_of=None, grace: float = 0.3, **target: str):
    space = load_space(write_space(tmp_path, **target))
    config = config_of(space) if config_of else optimum(space)
    evaluator = CommandEvaluator(space.target, tmp_path / "trials", term_grace_s=grace)
    (result,) = evaluator.evaluate([EvalRequest(7, config)])
    return space, result, tmp_path / "trials" / "7"


def group_gone(pgid: int, within_s: float = 3.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


# ---- configurations over a job's own passes ------------------------------------------------------
TABLE = job_table(
    [JobPass("SoftmaxFusionPass", "GraphFusion"), JobPass("MyRule", "GraphFusion", switchable=False),
     JobPass("TbeEltwiseFusionPass", "UBFusion")]
)


def test_job_config_resolves_against_its_table_not_the_registry() -> None:
    config = FusionConfig.all_off(TABLE)
    assert dict(config.switches) == {"MyRule": True, "SoftmaxFusionPass": False, "TbeEltwiseFusionPass": False}
    assert config.is_job and not FusionConfig.defaults().is_job
    with pytest.raises(ConfigError, match="not a pass of the job's table"):
        config.with_switches(GeluFusionPass=True)
    with pytest.raises(ConfigError, match="cannot be switched off"):
        config.with_switches(MyRule=False)


def test_job_config_round_trips_through_json_cfg_and_flags() -> None:
    config = FusionConfig.defaults(TABLE).with_switches(SoftmaxFusionPass=False)
    assert FusionConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    cfg = json.loads(dump_switch_json(config))
    assert cfg == {"Switch": {"GraphFusion": {"SoftmaxFusionPass": "off"}, "UBFusion": {"TbeEltwiseFusionPass": "on"}}}
    assert loads_switch(dump_switch_json(config), passes=TABLE) == config
    assert render_flags(config) == "--enable_pass=TbeEltwiseFusionPass --disable_pass=SoftmaxFusionPass"
    # Registry configurations keep their keys and JSON.
    assert FusionConfig.from_json(FusionConfig.defaults().to_json()) == FusionConfig.defaults()
    assert "pass_table" not in FusionConfig.defaults().to_json()


def test_command_space_searches_the_jobs_passes() -> None:
    space = load_space(CANN)
    assert space.target is not None and space.workload == "" and space.metric == "error"
    assert "DeleteNoConstFolding" not in space.searched and len(space.searched) == 11
    base = baseline_params(space)
    assert set(base) == {"defaults", "all_off"}
    defaults = config_from_params(space, base["defaults"])
    assert defaults == FusionConfig.defaults(space.passes)
    assert all(defaults.switches.values())
    all_off = config_from_params(space, base["all_off"])
    assert [n for n, on in all_off.switches.items() if on] == ["DeleteNoConstFolding"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"command": '"python job.py"'}, "target.command: expected an argv array of strings"),
        ({"command": "[]"}, "target.command: expected a non-empty array of strings"),
        ({"command": '["python", 3]'}, "target.command[1]: expected a string, got an integer"),
        ({"command": '["python", "--cfg={switchfile}"]'}, "target.command[1]: unknown placeholder {switchfile}"),
        ({"env": '{ X = "{flags}" }'}, "target.env.X: unknown placeholder {flags}"),
        ({"env": "{ X = 1 }"}, "target.env.X: expected a string"),
        ({"timeout_s": "0"}, "target.timeout_s: expected a positive number of seconds, got 0"),
        ({"timeout_s": '"10m"'}, "target.timeout_s: expected a positive number of seconds, got '10m'"),
        ({"repeats": "0"}, "target.repeats: expected an integer from 1 to 100, got 0"),
        ({"runtime": "5"}, "target.metrics.runtime: expected the key of the runtime"),
        ({"kind": '"embedded"'}, 'target.kind: expected "command"'),
        ({"not_switchable": '["Nope"]'}, "passes.not_switchable[0]: 'Nope' is not listed"),
    ],
)
def test_bad_target_is_one_line_naming_file_and_key(change: dict[str, str], expected: str) -> None:
    with pytest.raises(SpaceError) as info:
        loads_space(space_text(CANN, **change), "spaces/job.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("spaces/job.toml: ")
    assert expected in message, message


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('[workload]\nname = "mlp"\n', "workload: not used with a command target"),
        ('[split_points]\n"A.b" = 1\n', "split_points: not used with a command target"),
        ("[measure]\nrepeat = 3\n", "measure: not used with a command target"),
    ],
)
def test_target_with_embedded_sections_is_refused(extra: str, expected: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(expected)):
        loads_space(space_text(CANN) + extra, "job.toml")


def test_metric_given_as_key_and_regex_is_refused() -> None:
    text = space_text(CANN).replace('error = "error" ', 'error = "error"\nerror_regex = "e=(.*)" ', 1)
    with pytest.raises(SpaceError, match=r"target.metrics.error_regex: give error .* not both"):
        loads_space(text, "job.toml")


def test_bad_target_on_the_command_line_exits_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path, command='["{python}", "{oops}"]')
    assert main(["tune", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "job.toml: target.command[1]: unknown placeholder {oops}" in err[0]


# ---- one trial -----------------------------------------------------------------------------------
def test_command_evaluator_is_an_evaluator(tmp_path: Path) -> None:
    from fusiontune.tune.evaluator import Evaluator

    assert isinstance(CommandEvaluator(load_space(CANN).target, tmp_path), Evaluator)


def test_a_trial_runs_the_job_in_its_folder_and_reads_metrics_and_fusion(tmp_path: Path) -> None:
    space, result, trial = evaluate(tmp_path)
    assert result.ok, result.error_msg
    assert result.trial == 7 and result.median_s == pytest.approx(CANN_BEST_S)
    assert result.reported["error"] == pytest.approx(3.5e-4)
    assert result.fusion.counts()["TbeEltwiseFusionPass"] == (6, 6) and CULPRIT not in result.fusion.counts()
    assert result.extra["fusion_source"] == str(trial / "fusion_result.json")
    for name in ("fusion_switch.cfg", "graph_kernel_flags.txt", "config.json", "stdout.log",
                 "stderr.log", "result.json", "metrics.json", "fusion_result.json"):
        assert (trial / name).is_file(), name
    cfg = json.loads((trial / "fusion_switch.cfg").read_text())["Switch"]
    assert cfg["GraphFusion"][CULPRIT] == "off" and cfg["UBFusion"]["TbeEltwiseFusionPass"] == "on"
    assert "--disable_pass=ConvBatchnormFusionPass" in (trial / "graph_kernel_flags.txt").read_text()
    record = json.loads((trial / "result.json").read_text())
    assert record["runs"][0]["exit_code"] == 0 and record["status"] == "ok"
    assert record["command"][2] == f"--fusion_switch_file={trial / 'fusion_switch.cfg'}"
    assert json.loads((trial / "metrics.json").read_text())["runtime_s"] == pytest.approx(CANN_BEST_S)


def test_a_hanging_job_is_killed_at_its_timeout_with_its_whole_process_group(tmp_path: Path) -> None:
    hook = '{ FT_EXAMPLE_HANG = "*", FT_EXAMPLE_IGNORE_TERM = "1" }'  # only SIGKILL ends it
    start = time.monotonic()
    _space, result, trial = evaluate(tmp_path, env=hook, timeout_s="1")
    elapsed = time.monotonic() - start
    record = json.loads((trial / "result.json").read_text())
    pgid = record["runs"][0]["pgid"]
    worker = int(re.search(r"worker pid (\d+)", (trial / "stdout.log").read_text()).group(1))
    try:
        assert not result.ok
        assert result.error_msg.startswith("timed out after 1 s: the job's process group was killed")
        assert str(trial / "stdout.log") in result.error_msg
        assert record["runs"][0]["timed_out"] and elapsed < 8
        assert group_gone(pgid), "the job's process group is still alive"
        with pytest.raises(ProcessLookupError):
            os.kill(worker, 0)  # the job's own child went with the group
    finally:
        for kill in (lambda: os.killpg(pgid, signal.SIGKILL), lambda: os.kill(worker, signal.SIGKILL)):
            try:
                kill()
            except ProcessLookupError:
                pass


def test_a_crashing_job_is_a_failed_trial_with_the_signal_and_the_log(tmp_path: Path) -> None:
    _space, result, trial = evaluate(tmp_path, env='{ FT_EXAMPLE_CRASH = "*" }')
    assert not result.ok
    assert "killed by SIGSEGV: Fatal error: segmentation fault" in result.error_msg
    assert result.error_msg.endswith(f"log: {trial / 'stderr.log'}")


def test_garbage_output_is_a_failed_trial_naming_the_missing_json(tmp_path: Path) -> None:
    _space, result, trial = evaluate(tmp_path, env='{ FT_EXAMPLE_GARBAGE = "*" }')
    assert not result.ok
    assert result.error_msg.startswith("no JSON object on stdout")
    assert result.error_msg.endswith(f"log: {trial / 'stdout.log'}")


def test_a_cfg_the_job_rejects_fails_with_the_jobs_message(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path, UBFusion='["FusionVirtualOpSetSwitch", "TbeEltwiseFusionPas"]'))
    evaluator = CommandEvaluator(space.target, tmp_path / "trials")
    (result,) = evaluator.evaluate([EvalRequest(0, FusionConfig.defaults(space.passes))])
    assert not result.ok
    assert "exited with code 1" in result.error_msg
    assert "unknown fusion rule 'TbeEltwiseFusionPas' in UBFusion" in result.error_msg


def test_a_missing_metric_key_is_named(tmp_path: Path) -> None:
    _space, result, trial = evaluate(tmp_path, runtime='"latency_s"')
    assert not result.ok
    assert "metric key 'latency_s' (runtime) is not in the JSON object on stdout" in result.error_msg
    assert str(trial / "stdout.log") in result.error_msg


def test_regex_metrics_read_the_last_match(tmp_path: Path) -> None:
    text = space_text(CANN).replace(
        'runtime = "runtime_s" ', 'runtime_regex = \'"runtime_s": ([0-9.e-]+)\' ', 1
    ).replace('error = "error" ', "error_regex = 'matched_times=(\\d+)' ", 1)
    path = tmp_path / "regex.toml"
    path.write_text(text)
    space = load_space(path)
    (result,) = CommandEvaluator(space.target, tmp_path).evaluate([EvalRequest(0, optimum(space))])
    assert result.ok, result.error_msg
    assert result.median_s == pytest.approx(CANN_BEST_S)
    assert result.reported["error"] == 3  # the last GE line: TbeMultiOutputFusionPass, 3 matches


def test_repeats_give_the_median_runtime_and_the_largest_error(tmp_path: Path) -> None:
    _space, result, trial = evaluate(tmp_path, repeats="3")
    assert result.ok and len(result.samples_s) == 3
    assert (trial / "stdout.3.log").is_file()
    assert [r["run"] for r in json.loads((trial / "result.json").read_text())["runs"]] == [1, 2, 3]


def test_a_chatty_job_gets_capped_logs_with_head_and_tail(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path, env='{ FT_EXAMPLE_FLOOD = "400000" }'))
    evaluator = CommandEvaluator(space.target, tmp_path / "trials", cap_bytes=20_000)
    (result,) = evaluator.evaluate([EvalRequest(0, optimum(space))])
    log = (tmp_path / "trials" / "0" / "stdout.log").read_text()
    assert result.ok, result.error_msg  # the JSON line at the end is in the kept tail
    assert len(log) < 21_000 and "bytes dropped here" in log
    assert log.startswith("ATC start working now")


def test_a_program_that_does_not_exist_is_a_failed_trial(tmp_path: Path) -> None:
    _space, result, _trial = evaluate(tmp_path, command='["./no-such-atc", "{switch_file}"]')
    assert not result.ok and result.error_msg.startswith("cannot start ./no-such-atc")


def test_shell_command_quotes_its_placeholders(tmp_path: Path) -> None:
    line = '"{python} examples/cann_job.py --fusion_switch_file {switch_file} | cat"'
    text = space_text(CANN, command=line).replace("[target]\n", "[target]\nshell = true\n", 1)
    (tmp_path / "sh.toml").write_text(text)
    space = load_space(tmp_path / "sh.toml")
    trials = tmp_path / "with space"  # a path the shell must see quoted
    (result,) = CommandEvaluator(space.target, trials).evaluate([EvalRequest(0, optimum(space))])
    assert result.ok, result.error_msg
    assert result.extra["fusion_source"] == "log lines"  # no --output_dir: from GE's lines


def test_fusion_statistics_from_ge_log_lines() -> None:
    second = GE_LINE.replace("tfTagNoConstFoldingFusion1", "other").replace("=2,", "=3,")
    ub = "UBFusionPass[TbeEltwiseFusionPass]: pattern=Eltwise, matched_times=4, effected_times=1"
    found = fusion_from_log(GE_LINE + " " + second, ub)
    assert found == {"TfTagNoConstFoldingFusionPass": (5, 4), "TbeEltwiseFusionPass": (4, 1)}
    assert fusion_from_log("GraphId[0], nothing here") == {}


def test_last_json_object_scans_from_the_end() -> None:
    assert last_json_object('{"a": 1}\nnoise {"x"\n{"b": 2}\n[1, 2]\n') == {"b": 2}
    assert last_json_object("no json at all") is None


def test_mindspore_job_reads_the_flags_and_reports_fusion_in_its_log(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path, MINDSPORE))
    (result,) = CommandEvaluator(space.target, tmp_path).evaluate([EvalRequest(0, optimum(space))])
    assert result.ok, result.error_msg
    assert result.median_s == pytest.approx(MINDSPORE_BEST_S)
    assert result.extra["fusion_source"] == "log lines"
    assert result.fusion.counts()["inference_swiglu_fusion"] == (2, 2)
    assert result.extra["metrics"]["steps"] == 10
    flags = (tmp_path / "0" / "graph_kernel_flags.txt").read_text()
    assert "--disable_pass=split_concat_fusion,shape_reshape,matmul_elem_gelu_fusion" in flags


# ---- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize(("template", "best_s"), [(CANN, CANN_BEST_S), (MINDSPORE, MINDSPORE_BEST_S)])
def test_tune_finds_the_example_jobs_optimum_and_reports_its_fusion(
    template: Path, best_s: float, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path, template, name="job.toml")
    assert main(["tune", str(path), "--trials", "40", "--no-progress"]) == 0
    out = capsys.readouterr().out
    results = tmp_path / "results" / "job"
    study = optuna.load_study(study_name="job", storage=f"sqlite:///{results / 'study.db'}")
    space = load_space(path)
    best = min((t for t in StudyStore(study).trials() if t.feasible), key=lambda t: t.median_s)
    assert best.median_s == pytest.approx(best_s)
    assert load_config(results / "best_config.json") == optimum(space)
    assert load_config(results / "fusion_switch.cfg", passes=space.passes) == optimum(space)
    assert "winner" in out and "the defaults break the accuracy bound" in out
    assert (results / "trials" / str(best.number) / "stdout.log").is_file()
    assert (results / "confirm" / "round2").is_dir()
    report = (results / "report.md").read_text()
    assert "## Fusion statistics of the recommended configuration" in report
    assert "| matched_times | effected_times |" in report
    assert (results / "fusion_result.json").is_file()
    csv = (results / "trials.csv").read_text().splitlines()[0]
    assert f"pass.{space.searched[0]}" in csv and "max_rel" not in csv
    (results / "report.md").unlink()
    assert main(["report", str(results)]) == 0  # rebuilt from the database alone
    assert "Fusion statistics of the recommended" in (results / "report.md").read_text()


def test_a_sweep_with_a_hanging_configuration_completes(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path, env='{ FT_EXAMPLE_HANG = "TfMergeSubFusionPass" }', timeout_s="1")
    assert main(["tune", str(path), "--trials", "6", "--no-confirm", "--no-progress"]) == 0
    capsys.readouterr()
    results = tmp_path / "results" / "job"
    study = optuna.load_study(study_name="job", storage=f"sqlite:///{results / 'study.db'}")
    assert len(study.trials) == 6
    by_role = {t.role: t for t in StudyStore(study).trials()}
    defaults = by_role["defaults"]
    assert defaults.state == "FAIL"  # TfMergeSubFusionPass is on in the defaults
    assert defaults.status == EvalStatus.TIMEOUT and defaults.result is not None
    assert defaults.result.error_msg.startswith("timed out after 1 s")
    assert by_role["all_off"].state == "COMPLETE"
    for t in study.trials:
        record = json.loads((results / "trials" / str(t.number) / "result.json").read_text())
        assert group_gone(record["runs"][0]["pgid"])
    assert "timed out after 1 s" in (results / "report.md").read_text()


def test_bisect_names_the_planted_culprit(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path)
    assert main(["bisect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"culprit: {CULPRIT}" in out
    results = tmp_path / "results" / "job"
    data = json.loads((results / "bisect.json").read_text())
    assert [c["pass"] for c in data["culprits"]] == [CULPRIT]
    assert data["evaluation_count"] <= 7  # ceil(log2(11)) + endpoints + safe
    space = load_space(path)
    safe = load_config(results / "safe_fusion_switch.cfg", passes=space.passes)
    assert safe == FusionConfig.defaults(space.passes).with_switches(**{CULPRIT: False})
    assert (results / "bisect" / "0" / "fusion_switch.cfg").is_file()
    assert "--disable_pass=ConvBatchnormFusionPass" in (results / "safe_graph_kernel_flags.txt").read_text()


# ---- Ray -----------------------------------------------------------------------------------------
@pytest.mark.ray
def test_ray_runs_command_trials_on_the_workers_nodes(ray_cluster, tmp_path: Path) -> None:
    from fusiontune.tune.ray_command import RayCommandEvaluator

    space = load_space(write_space(tmp_path))
    configs = [FusionConfig.defaults(space.passes), FusionConfig.all_off(space.passes), optimum(space)]
    with RayCommandEvaluator(space.target, tmp_path / "trials", workers=2) as evaluator:
        results = evaluator.evaluate([EvalRequest(i, c) for i, c in enumerate(configs)])
    assert [r.trial for r in results] == [0, 1, 2] and all(r.ok for r in results)
    assert results[2].median_s == pytest.approx(CANN_BEST_S)
    node = ray_cluster.get_runtime_context().get_node_id()
    assert {r.node for r in results} == {node}
    assert all((tmp_path / "trials" / str(i) / "result.json").is_file() for i in range(3))
