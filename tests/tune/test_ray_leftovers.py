"""A driver killed with SIGKILL leaves no process of its local Ray instance behind.

A real driver (a subprocess that starts Ray as ``fusiontune tune --workers 2`` does, through
:class:`~fusiontune.tune.ray_command.RayCommandEvaluator`, and runs jobs on it) is killed with
SIGKILL; every process below it (listed with psutil, Ray's own dependency, before the kill) must
be gone within seconds, while another Ray instance on the machine (this test's) runs on. Without
the watchdog, Ray's two agents outlived the driver by about a minute.
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

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog reads /proc"),
]

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"

DRIVER = textwrap.dedent(
    """\
    import re, sys, time
    from pathlib import Path
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.tune.ray_command import RayCommandEvaluator
    from fusiontune.tune.records import EvalRequest
    from fusiontune.workloads.space import loads_space

    spaces, trials = Path(sys.argv[1]), Path(sys.argv[2])
    text = (spaces / "cann_atc_template.toml").read_text()
    text = re.sub(r'^workdir = "\\."', f'workdir = "{spaces}"', text, flags=re.M)
    space = loads_space(text, str(trials / "job.toml"))
    evaluator = RayCommandEvaluator(space.target, trials, workers=2)
    configs = [FusionConfig.defaults(space.passes), FusionConfig.all_off(space.passes)]
    results = evaluator.evaluate([EvalRequest(i, c) for i, c in enumerate(configs)])
    assert all(r.ok for r in results), results
    print("READY", flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_driver_leaves_no_ray_process_behind(ray_cluster, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(SPACES), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    below: list[int] = []
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "READY", "the driver did not start Ray"
        below = [p.pid for p in psutil.Process(driver.pid).children(recursive=True)]
        names = {psutil.Process(p).name() for p in below if alive(p)}
        assert {"raylet", "gcs_server"} <= names, names  # a real instance, started by the driver
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        killed_at = time.monotonic()
        left = below
        while left and time.monotonic() - killed_at < 5.0:
            time.sleep(0.1)
            left = [p for p in left if alive(p)]
        assert not left, [(p, psutil.Process(p).cmdline()[:1]) for p in left]
        # Only that instance: this process's own Ray instance still runs tasks.
        assert ray_cluster.get(ray_cluster.remote(lambda: 42).remote(), timeout=60) == 42
    finally:
        driver.kill()
        driver.wait()
        for pid in below:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
