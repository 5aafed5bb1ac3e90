"""No process a job starts outlives its trial, even one that leaves the job's process group.

The job daemonizes a grandchild the way a service does (fork, ``setsid()``, fork again, the middle
process exits), so the grandchild is in another session and process group, and an orphan. Under
the supervisor (:mod:`fusiontune.tune._reaper`, a child subreaper on Linux) it is re-parented to
the supervisor and killed with the rest when the job ends, times out, or its driver is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.tune._job_process import run_process
from fusiontune.tune._reaper import descendants
from fusiontune.tune.command import CommandEvaluator
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.workloads.space import loads_space

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="the subreaper is Linux's; elsewhere the group only",
)

DAEMONIZING_JOB = textwrap.dedent(
    """\
    import os, sys, time
    pidfile, mode = sys.argv[1], sys.argv[2]
    if os.fork() == 0:
        os.setsid()  # out of the job's session and process group
        if os.fork() == 0:
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            for fd in (0, 1, 2):
                os.close(fd)  # a daemon holds none of the job's pipes
            time.sleep(60)
            os._exit(0)
        os._exit(0)  # the grandchild is now an orphan
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    print('{"runtime_s": 0.1, "error": 0.0}', flush=True)
    if mode == "hang":
        time.sleep(600)
    """
)

SPACE = """\
[target]
kind = "command"
command = ["{{python}}", "{job}", "{pidfile}", "{mode}"]
timeout_s = {timeout}
[target.metrics]
runtime = "runtime_s"
error = "error"
[passes]
GraphFusion = ["SoftmaxFusionPass"]
[accuracy]
bound = 1e-3
"""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def daemonizing_trial(tmp_path: Path, mode: str, timeout: float = 20) -> tuple[EvalResult, int]:
    job = tmp_path / "daemonizing_job.py"
    job.write_text(DAEMONIZING_JOB)
    pidfile = tmp_path / "grandchild.pid"
    text = SPACE.format(job=job, pidfile=pidfile, mode=mode, timeout=timeout)
    space = loads_space(text, str(tmp_path / "job.toml"))
    assert space.target is not None
    evaluator = CommandEvaluator(space.target, tmp_path / "trials", term_grace_s=0.3)
    (result,) = evaluator.evaluate([EvalRequest(0, FusionConfig.defaults(space.passes))])
    return result, int(pidfile.read_text())


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_a_daemonized_grandchild_does_not_outlive_its_trial(tmp_path: Path, mode: str) -> None:
    result, grandchild = daemonizing_trial(tmp_path, mode, timeout=1.5)
    try:
        if mode == "hang":
            assert result.status == EvalStatus.TIMEOUT, result.error_msg
        else:
            assert result.ok, result.error_msg
        assert gone_within(grandchild, 2.0), f"grandchild {grandchild} outlived the trial"
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_killed_driver_leaves_neither_job_nor_grandchild(tmp_path: Path) -> None:
    """SIGKILL of the process that runs the job: the supervisor sees its stdin close."""
    job = tmp_path / "daemonizing_job.py"
    job.write_text(DAEMONIZING_JOB)
    pidfile = tmp_path / "grandchild.pid"
    driver_code = textwrap.dedent(
        f"""\
        from pathlib import Path
        from fusiontune.tune._job_process import run_process
        run_process([{sys.executable!r}, {str(job)!r}, {str(pidfile)!r}, "hang"], {str(tmp_path)!r},
                    dict(__import__("os").environ), 600, Path({str(tmp_path / "out.log")!r}),
                    Path({str(tmp_path / "err.log")!r}))
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", driver_code])
    try:
        end = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < end:
            time.sleep(0.02)
        grandchild = int(pidfile.read_text())
        job_pids = [p for p in descendants(driver.pid) if p != grandchild]
        driver.kill()
        driver.wait()
        assert gone_within(grandchild, 2.0), "the daemonized grandchild outlived its killed driver"
        assert all(gone_within(p, 2.0) for p in job_pids), "the supervisor or the job outlived it"
    finally:
        driver.kill()
        driver.wait()
        for pid in [int(pidfile.read_text())] if pidfile.exists() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_job_runs_in_a_group_of_its_own_that_is_gone_after(tmp_path: Path) -> None:
    script = "import os; print(os.getpgid(0), os.getpid(), os.getsid(0))"
    outcome = run_process(
        [sys.executable, "-c", script],
        tmp_path,
        dict(os.environ),
        20,
        tmp_path / "out.log",
        tmp_path / "err.log",
    )
    pgid, pid, sid = map(int, (tmp_path / "out.log").read_text().split())
    assert outcome.returncode == 0 and outcome.pgid == pid == pgid and sid != pid
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_the_jobs_exit_status_and_a_start_failure_come_through(tmp_path: Path) -> None:
    logs = (tmp_path / "out.log", tmp_path / "err.log")
    killed = run_process(
        [sys.executable, "-c", "import os; os.abort()"], tmp_path, dict(os.environ), 20, *logs
    )
    assert (
        killed.returncode == -signal.SIGABRT and not killed.timed_out and killed.start_error == ""
    )
    code = run_process("exit 3", tmp_path, dict(os.environ), 20, *logs, shell=True)
    assert code.returncode == 3
    missing = run_process(["./no-such-atc", "x"], tmp_path, dict(os.environ), 20, *logs)
    assert missing.returncode is None
    assert missing.start_error == "cannot start ./no-such-atc: No such file or directory"
