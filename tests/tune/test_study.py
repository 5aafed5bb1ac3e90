"""The tuning loop: budget and resume, baselines, shared measurements, interruption, stale trials.

Every sweep runs on the seed network ``mindspore_custom_op`` (4x4) in process, timed with two
samples: after the first kernels load from the shared disk cache a trial takes milliseconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.tune._storage import DRIVER_ATTR, HEARTBEAT_ATTR
from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.tune.store import StudyStore, TrialRecord
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import SearchSpace, config_from_params, load_space

SPACE = """\
[workload]
name = "mindspore_custom_op"

[passes]
search = ["TbeEltwiseFusionPass", "CompositeOpsFusionPass", "TbeMultiOutputFusionPass", "TbeEltwiseSplitFusionPass"]

[split_points]
"TbeEltwiseSplitFusionPass.cut" = [0, 2]

[accuracy]
metric = "max_rel"
bound = {bound}

[measure]
warmup = 0
repeat = 2
number = 1
min_repeat_ms = 0.0

[search]
sampler = "random"
trials = 6
seed = 0
top_k = 2
workers = 0
"""
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


def write_space(
    tmp_path: Path, bound: float = 1e-6, name: str = "space.toml", **replace: str
) -> SearchSpace:
    text = SPACE.replace("{bound}", repr(bound))
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return load_space(path)


@pytest.fixture(scope="module")
def workload():
    return make_workload("mindspore_custom_op")


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    return write_space(tmp_path)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results' / 'study.db'}"


class Recording:
    """LocalEvaluator that records what it was asked, and can act on the k-th trial's request.

    Baseline measurements (trial -1) are recorded apart, in ``baseline_requests``.
    """

    def __init__(self, workload, measure, on_request=None) -> None:
        self.inner = LocalEvaluator(workload, measure)
        self.requests: list[EvalRequest] = []
        self.baseline_requests: list[EvalRequest] = []
        self.on_request = on_request

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        out = []
        for r in requests:
            if r.trial < 0:
                self.baseline_requests.append(r)
            else:
                self.requests.append(r)
                if self.on_request is not None:
                    self.on_request(len(self.requests), r)
            out.extend(self.inner.evaluate([r]))
        return out

    def close(self) -> None:
        return None


def load(url: str, name: str = "s") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def records(url: str, name: str = "s") -> list[TrialRecord]:
    return StudyStore(load(url, name)).trials()


def finished_numbers(study: optuna.Study) -> list[int]:
    return sorted(t.number for t in study.get_trials(deepcopy=False, states=FINISHED))


# ---- budget and resume ---------------------------------------------------------------------------
def test_resumed_sweep_ends_with_exactly_the_requested_total(space, workload, url):
    ev = Recording(workload, space.measure)
    first = run_tune(space, ev, url, "s", 3, progress=False)
    assert (first.n_finished, first.n_new, first.stopped_reason) == (3, 3, "budget")
    second = run_tune(space, ev, url, "s", 7, progress=False)
    assert (second.n_finished, second.n_new) == (7, 4)
    study = load(url)
    assert [t.number for t in study.trials] == list(range(7))
    assert finished_numbers(study) == list(range(7))


def test_rerun_with_the_budget_met_adds_nothing(space, workload, url):
    ev = Recording(workload, space.measure)
    run_tune(space, ev, url, "s", 3, progress=False)
    again = run_tune(space, ev, url, "s", 3, progress=False)
    assert (again.n_finished, again.n_new) == (3, 0)
    assert len(load(url).trials) == 3


# ---- baselines -----------------------------------------------------------------------------------
def test_baselines_are_enqueued_first_with_their_roles(space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 4, progress=False)
    trials = records(url)
    assert [t.role for t in trials] == ["defaults", "all_off", "", ""]
    assert trials[0].config == FusionConfig.defaults()
    assert all(v == "off" for k, v in trials[1].params.items() if k.startswith("pass."))


def test_baselines_are_not_enqueued_again_on_resume(space, workload, url):
    ev = Recording(workload, space.measure)
    run_tune(space, ev, url, "s", 3, progress=False)
    run_tune(space, ev, url, "s", 6, progress=False)
    roles = [t.role for t in records(url)]
    assert roles.count("defaults") == 1 and roles.count("all_off") == 1


def test_study_records_what_the_report_needs(space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 3, progress=False)
    study = load(url)
    store = StudyStore(study)
    info = store.info()
    assert info.workload == "mindspore_custom_op" and info.metric == "max_rel"
    assert info.bound == 1e-6 and info.space_toml == Path(space.path).read_text()
    assert info.space_path and info.sizes and info.machine
    baselines = {b.id: b for b in store.baselines()}
    for t, frozen in zip(store.trials(), study.trials, strict=True):
        result = t.result
        assert result is not None and result.trial == t.number and result.ok
        assert t.config is not None and result.config_key == t.config.key()
        assert t.program_hash == result.program_hash
        assert frozen.system_attrs["constraints"] == [t.constraint]
        assert t.constraint == pytest.approx(result.error("max_rel") - 1e-6)
        assert t.values == (result.median_s,)
        assert t.baseline in baselines  # measured in this window, on this node
        assert baselines[t.baseline].node == result.node


# ---- shared measurements -------------------------------------------------------------------------
def test_configurations_with_one_program_share_one_measurement(space, workload, url):
    ev = Recording(workload, space.measure)
    run_tune(space, ev, url, "s", 12, progress=False)
    trials = load(url).trials
    by_hash: dict[str, list] = {}
    for t in StudyStore(load(url)).trials():
        by_hash.setdefault(t.program_hash, []).append(t)
    assert len(by_hash) < len(trials), "the space has fewer programs than 12 configurations"
    for group in by_hash.values():
        first, *rest = group
        assert first.reused_from is None
        for t in rest:
            assert t.reused_from == first.number and t.baseline == first.baseline
            assert t.values == first.values
    assert len(ev.requests) == len(by_hash)


def test_duplicates_inside_one_batch_are_measured_once(space, workload, url):
    ev = Recording(workload, space.measure)
    run_tune(space, ev, url, "s", 12, batch_size=4, progress=False)
    hashes = {t.program_hash for t in StudyStore(load(url)).trials()}
    assert len(ev.requests) == len(hashes)


# ---- samplers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "nsga2"])
def test_every_sampler_runs_a_short_sweep(sampler, space, workload, url):
    result = run_tune(
        space, Recording(workload, space.measure), url, "s", 5, sampler=sampler, progress=False
    )
    assert result.n_finished == 5
    study = load(url)
    assert len(study.directions) == (2 if sampler == "nsga2" else 1)
    for t, record in zip(study.trials, records(url), strict=True):
        if t.state == TrialState.COMPLETE:
            assert t.constraints == {"0": record.constraint}


def test_tpe_does_not_propose_a_configuration_again(space, workload, url):
    """After its random start-up trials, TPE proposes only configurations the study lacks."""
    run_tune(space, Recording(workload, space.measure), url, "s", 24, sampler="tpe", progress=False)
    seen: set[tuple] = set()
    for t in load(url).trials:
        point = tuple(sorted(t.params.items()))
        if t.number >= 12:  # 2 baselines + 10 start-up trials
            assert point not in seen, f"trial {t.number} repeats a configuration"
        seen.add(point)


def test_grid_stops_when_every_point_is_measured(tmp_path, workload, url):
    space = write_space(
        tmp_path,
        **{
            '"TbeEltwiseFusionPass", "CompositeOpsFusionPass", "TbeMultiOutputFusionPass", "TbeEltwiseSplitFusionPass"': '"TbeEltwiseFusionPass"',
            '"TbeEltwiseSplitFusionPass.cut" = [0, 2]': "",
        },
    )
    result = run_tune(
        space, Recording(workload, space.measure), url, "s", 20, sampler="grid", progress=False
    )
    assert result.stopped_reason == "grid exhausted"
    assert result.n_finished == 4  # two baselines, then the two grid points


def test_grid_over_a_large_space_is_refused(tmp_path, workload, url):
    space = load_space_text(tmp_path, '[workload]\nname = "mlp"\n[passes]\nsearch = "ALL"\n')
    with pytest.raises(UserError, match="grid has .* points"):
        run_tune(
            space, Recording(workload, space.measure), url, "s", 5, sampler="grid", progress=False
        )


def load_space_text(tmp_path: Path, text: str) -> SearchSpace:
    path = tmp_path / "other.toml"
    path.write_text(text)
    return load_space(path)


# ---- outcomes of one trial -----------------------------------------------------------------------
def test_an_error_over_the_bound_is_an_infeasible_trial(tmp_path, workload, url):
    space = write_space(tmp_path, bound=1e-12)
    result = run_tune(space, Recording(workload, space.measure), url, "s", 3, progress=False)
    assert result.best_trial is None
    for t in records(url):
        assert t.state == "COMPLETE" and t.constraint is not None and t.constraint > 0


def test_a_failed_evaluation_is_a_failed_trial(space, workload, url):
    class Failing(Recording):
        def evaluate(self, requests):
            return [
                EvalResult.failure(r.trial, r.config, "kernel failed to compile") for r in requests
            ]

    result = run_tune(space, Failing(workload, space.measure), url, "s", 3, progress=False)
    assert result.n_finished == 3 and result.best_trial is None
    for t in records(url):
        assert t.state == "FAIL" and t.result is not None
        assert t.result.error_msg == "kernel failed to compile"


def test_best_trial_is_the_fastest_feasible(space, workload, url):
    result = run_tune(space, Recording(workload, space.measure), url, "s", 6, progress=False)
    best = min((t for t in records(url) if t.feasible), key=lambda t: t.median_s)
    assert result.best_median_s == best.median_s
    assert result.best_trial == best.number or records(url)[result.best_trial].values == best.values


def test_wall_time_budget_stops_starting_batches(space, workload, url):
    slow = Recording(workload, space.measure, on_request=lambda k, r: time.sleep(0.3))
    result = run_tune(space, slow, url, "s", 50, timeout_s=0.5, progress=False)
    assert result.stopped_reason == "timeout"
    assert 1 <= result.n_finished <= 3


# ---- interruption --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_trial_in_flight_is_recorded(sig, space, workload, url):
    def signal_on_third(k: int, request: EvalRequest) -> None:
        if k == 3:
            os.kill(os.getpid(), sig)

    result = run_tune(
        space, Recording(workload, space.measure, signal_on_third), url, "s", 10, progress=False
    )
    assert result.stopped_reason == "interrupted"
    study = load(url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3  # the third one recorded
    assert signal.getsignal(sig) is not None  # the previous handler is back
    resumed = run_tune(space, Recording(workload, space.measure), url, "s", 6, progress=False)
    assert resumed.n_finished == 6 and finished_numbers(load(url)) == list(range(6))


def test_a_second_ctrl_c_aborts_and_fails_the_trial_in_flight(space, workload, url):
    def two_ctrl_c(k: int, request: EvalRequest) -> None:
        if k == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run_tune(
            space, Recording(workload, space.measure, two_ctrl_c), url, "s", 10, progress=False
        )
    trials = StudyStore(load(url)).trials()
    assert [t.state for t in trials] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert trials[2].interrupted and trials[2].status == EvalStatus.NOT_RECORDED
    resumed = run_tune(space, Recording(workload, space.measure), url, "s", 5, progress=False)
    assert resumed.n_finished == 5 and finished_numbers(load(url)) == list(range(5))


# ---- trials left RUNNING ---------------------------------------------------------------------------
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_running_trials_of_a_dead_driver_are_failed_at_resume_not_repeated(space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 2, progress=False)
    study = load(url)
    unstamped = study.ask()  # a driver that died before stamping its trial
    stamped = study.ask()  # a driver on this host whose process is gone
    study._storage.set_trial_system_attr(
        stamped._trial_id,
        DRIVER_ATTR,
        {"host": socket.gethostname(), "pid": dead_pid(), "start": 1.0, "token": "x"},
    )
    result = run_tune(space, Recording(workload, space.measure), url, "s", 6, progress=False)
    study = load(url)
    for number in (unstamped.number, stamped.number):
        t = StudyStore(study).trial(number)
        assert t.state == "FAIL" and t.interrupted and t.status == EvalStatus.NOT_RECORDED
    assert result.n_finished == 6
    assert [t.number for t in study.trials] == list(range(6))
    assert not study.get_trials(states=(TrialState.RUNNING,))


def test_running_trials_of_a_live_driver_elsewhere_are_left_alone(space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 2, progress=False)
    study = load(url)
    other = study.ask()
    study._storage.set_trial_system_attr(
        other._trial_id, DRIVER_ATTR, {"host": "another-host", "pid": 1, "start": 1.0, "token": "y"}
    )
    study._storage.set_trial_system_attr(other._trial_id, HEARTBEAT_ATTR, time.time())
    # Its trial counts against the budget: this driver measures one more, then waits for it.
    result = run_tune(space, Recording(workload, space.measure), url, "s", 4, timeout_s=1.5, progress=False)
    assert result.stopped_reason == "timeout" and result.n_finished == 3
    assert load(url).trials[other.number].state == TrialState.RUNNING


def test_a_killed_driver_loses_only_its_trial_in_flight(space, url, tmp_path):
    """kill -9 during a measurement; the next run fails that trial and goes on, nothing repeated."""
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from fusiontune.tune.evaluator import LocalEvaluator
        from fusiontune.tune.study import run_tune
        from fusiontune.workloads import make_workload
        from fusiontune.workloads.space import load_space

        space = load_space({space.path!r})
        inner = LocalEvaluator(make_workload("mindspore_custom_op"), space.measure)

        class Hangs:
            def evaluate(self, requests):
                if requests[0].trial == 2:
                    print("in flight", flush=True)
                    time.sleep(60)
                return inner.evaluate(requests)

            def close(self):
                pass

        run_tune(space, Hangs(), {url!r}, "s", 10, progress=False)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "in flight"
    finally:
        proc.kill()  # SIGKILL: no handler runs
        proc.wait()
    assert [t.state for t in load(url).trials] == [TrialState.COMPLETE] * 2 + [TrialState.RUNNING]
    workload = make_workload("mindspore_custom_op")
    result = run_tune(space, Recording(workload, space.measure), url, "s", 5, progress=False)
    trials = records(url)
    assert trials[2].state == "FAIL" and trials[2].interrupted
    assert result.n_finished == 5 and [t.number for t in trials] == list(range(5))


# ---- storage and compatibility ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad_url",
    [
        "nosuchdriver://host/db",
        "sqlite:////proc/fusiontune-no-such-dir/study.db",
        "postgresql://tuner@127.0.0.1:1/fusiontune",
        "not a url",
    ],
)
def test_a_storage_that_cannot_be_opened_is_one_user_error(bad_url, space, workload):
    with pytest.raises(UserError) as info:
        run_tune(space, Recording(workload, space.measure), bad_url, "s", 2, progress=False)
    message = str(info.value)
    assert "\n" not in message and message.startswith("storage ")


def test_a_study_from_another_bound_is_refused(tmp_path, space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 2, progress=False)
    other = write_space(tmp_path, bound=1e-3, name="other.toml")
    with pytest.raises(UserError, match="bound"):
        run_tune(other, Recording(workload, other.measure), url, "s", 4, progress=False)


def test_a_study_with_other_parameters_is_refused(tmp_path, space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 2, progress=False)
    other = write_space(
        tmp_path,
        name="other.toml",
        **{'"TbeEltwiseSplitFusionPass.cut" = [0, 2]': '"TbeEltwiseSplitFusionPass.cut" = [0, 4]'},
    )
    with pytest.raises(UserError, match="other parameters"):
        run_tune(other, Recording(workload, other.measure), url, "s", 4, progress=False)


def test_config_of_every_trial_matches_its_params(space, workload, url):
    run_tune(space, Recording(workload, space.measure), url, "s", 5, progress=False)
    for t in records(url):
        assert t.config == config_from_params(space, t.params)


# ---- on a real local Ray cluster -----------------------------------------------------------------
@pytest.mark.ray
def test_a_ray_sweep_survives_a_worker_killed_mid_measurement(space, url, ray_cluster):
    """Two actors; the one measuring trial 1 (the all-off baseline, always measured) dies."""
    from fusiontune.tune.ray_evaluator import RayEvaluator

    evaluator = RayEvaluator(
        "mindspore_custom_op", {}, space.measure, workers=2, fault_hook="kill_on_trial=1"
    )
    try:
        result = run_tune(space, evaluator, url, "s", 6, batch_size=2, progress=False)
    finally:
        evaluator.close()
    assert result.n_finished == 6 and result.stopped_reason == "budget"
    trials = records(url)
    assert trials[1].state == "FAIL" and trials[1].status == EvalStatus.WORKER_DIED
    assert trials[1].result is not None and trials[1].result.error_msg
    assert [t.number for t in trials if t.state == "FAIL"] == [1]
    for t in trials:
        if t.state == "COMPLETE":
            assert t.result is not None and t.result.node
