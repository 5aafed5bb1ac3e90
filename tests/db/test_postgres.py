"""Shared studies: the README's PostgreSQL URL, and three drivers on one study at once.

Three real ``fusiontune tune`` processes start together on one empty database (PostgreSQL, from
the session's throwaway server, and a SQLite file), in one working directory, so they also share
``results/<study>/``: what a user gets by running the same command in three terminals. Everything
asserted is read back from the storage with plain optuna and from the files they wrote; the sweep
runs once per backend and each test checks one property of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

pytestmark = pytest.mark.db

REPO = Path(__file__).resolve().parents[2]
# The console script pip installed beside this interpreter, as a user runs it.
_SCRIPT = Path(sys.executable).parent / "fusiontune"
FUSIONTUNE = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "fusiontune"]
STUDY = "shared"
DRIVERS = 3
BUDGET = 12
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
# Each measurement takes a few tens of ms, so the drivers' sweeps overlap after their imports.
SPACE = (
    (REPO / "tests" / "data" / "tiny_space.toml")
    .read_text()
    .replace("min_repeat_ms = 0.0", "min_repeat_ms = 20.0")
    .replace(
        '"TbeEltwiseSplitFusionPass.cut" = [0, 2]', '"TbeEltwiseSplitFusionPass.cut" = [0, 1, 2, 3]'
    )
    + """\
[search]
sampler = "tpe"
trials = 40
seed = 0
top_k = 2
workers = 0
"""
)


# ---- the README's URL ----------------------------------------------------------------------------
def test_open_storage_opens_the_readme_postgresql_url(postgres_url: str) -> None:
    from fusiontune.tune._storage import open_storage

    assert postgres_url.startswith("postgresql://")  # no +driver: what the README shows
    storage = open_storage(postgres_url)
    assert storage.engine.dialect.driver == "psycopg"  # SQLAlchemy 2.1's default: psycopg 3
    study = optuna.create_study(storage=storage, study_name="readme")
    study.tell(study.ask(), 1.5)
    again = optuna.load_study(study_name="readme", storage=postgres_url)
    assert [t.values for t in again.trials] == [[1.5]]


# ---- three drivers, one study ----------------------------------------------------------------------
@dataclass(frozen=True)
class Driver:
    pid: int
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SharedSweep:
    url: str
    workdir: Path
    drivers: tuple[Driver, ...]

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=STUDY, storage=self.url)

    def trials(self) -> list[FrozenTrial]:
        return self.study().get_trials(deepcopy=False)

    def explain(self) -> str:
        """Every driver's exit code and the end of its stderr, for failure messages."""
        return "\n".join(
            f"driver {d.pid}: exit {d.returncode}\n{d.stderr[-3000:]}" for d in self.drivers
        )


def run_concurrent_drivers(url: str, workdir: Path) -> SharedSweep:
    """Start ``DRIVERS`` ``fusiontune tune`` processes at once in ``workdir`` and wait for all."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tiny.toml").write_text(SPACE)
    argv = [
        *FUSIONTUNE,
        "tune",
        "tiny.toml",
        "--study",
        STUDY,
        "--storage",
        url,
        "--trials",
        str(BUDGET),
        "--workers",
        "0",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(DRIVERS)
    ]
    drivers = []
    deadline = time.monotonic() + 600
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += "\n[test] killed: still running after 600 s"
        drivers.append(Driver(proc.pid, proc.returncode, out, err))
    return SharedSweep(url, workdir, tuple(drivers))


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def shared_sweep(request, tmp_path_factory) -> SharedSweep:
    root = tmp_path_factory.mktemp(f"shared-{request.param}")
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_server").create_database("shared_sweep")
    else:
        url = f"sqlite:///{root / 'study.db'}"
    return run_concurrent_drivers(url, root / "work")


def test_every_driver_exits_0(shared_sweep: SharedSweep) -> None:
    codes = [d.returncode for d in shared_sweep.drivers]
    assert codes == [0] * DRIVERS, shared_sweep.explain()


def test_no_driver_prints_a_traceback(shared_sweep: SharedSweep) -> None:
    with_traceback = [d.pid for d in shared_sweep.drivers if "Traceback" in d.stderr]
    assert not with_traceback, shared_sweep.explain()


def test_the_drivers_really_shared_the_sweep(shared_sweep: SharedSweep) -> None:
    """At least two drivers asked trials: otherwise the other properties prove nothing."""
    from fusiontune.tune._storage import DRIVER_ATTR

    pids = {d.pid for d in shared_sweep.drivers}
    askers = Counter(t.system_attrs.get(DRIVER_ATTR, {}).get("pid") for t in shared_sweep.trials())
    assert len(set(askers) & pids) >= 2, f"trials per driver pid: {dict(askers)}"


def test_the_budget_counts_for_the_study_exactly(shared_sweep: SharedSweep) -> None:
    states = Counter(t.state.name for t in shared_sweep.trials())
    finished = sum(n for s, n in states.items() if TrialState[s] in FINISHED)
    assert finished == BUDGET, (
        f"{finished} finished trials for a budget of {BUDGET}: {dict(states)}"
    )


def test_no_trial_is_left_running(shared_sweep: SharedSweep) -> None:
    running = [t.number for t in shared_sweep.trials() if t.state == TrialState.RUNNING]
    assert running == []


def test_the_baselines_are_enqueued_once_per_study(shared_sweep: SharedSweep) -> None:
    roles = Counter(t.user_attrs.get("role") for t in shared_sweep.trials())
    assert (roles["defaults"], roles["all_off"]) == (1, 1), dict(roles)


def test_no_trial_of_a_live_driver_is_failed_as_stale(shared_sweep: SharedSweep) -> None:
    """No driver died, so no trial may carry ``interrupted``."""
    failed = {
        t.number: t.user_attrs["interrupted"]
        for t in shared_sweep.trials()
        if t.state == TrialState.FAIL and "interrupted" in t.user_attrs
    }
    assert failed == {}


def test_the_results_folder_names_one_recommendation(shared_sweep: SharedSweep) -> None:
    """The shared ``results/<study>/`` is whole and says what the study's storage says.

    Three drivers confirmed and wrote the same folder. Its recommendation files must all name one
    configuration: the one ``fusiontune report`` rebuilds from the storage into a fresh folder.
    """
    results = shared_sweep.workdir / "results" / STUDY
    written = json.loads((results / "best_config.json").read_text())
    switch = json.loads((results / "fusion_switch.cfg").read_text())
    rebuilt = shared_sweep.workdir / "rebuilt"
    rebuilt.mkdir()
    proc = subprocess.run(
        [*FUSIONTUNE, "report", str(rebuilt), "--storage", shared_sweep.url, "--study", STUDY],
        cwd=shared_sweep.workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    recommended = {
        json.dumps(written, sort_keys=True),
        json.dumps(json.loads((rebuilt / "best_config.json").read_text()), sort_keys=True),
    }
    assert len(recommended) == 1, recommended
    assert switch == json.loads((rebuilt / "fusion_switch.cfg").read_text())
