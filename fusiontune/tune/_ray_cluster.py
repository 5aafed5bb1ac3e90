"""Connecting to Ray: a local instance for one sweep, or a running cluster; the nodes that measure.

Shared by both Ray evaluators (:mod:`~fusiontune.tune.ray_evaluator`,
:mod:`~fusiontune.tune.ray_command`). ``ray`` is imported where used.

A local instance comes with a watchdog (:mod:`~fusiontune.tune._ray_watchdog`): if the driver
dies, even by SIGKILL, no process of its instance outlives it by more than a moment (Ray's own
agents would wait about a minute for the GCS that died with the driver).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from fusiontune.errors import UserError
from fusiontune.tune._ray_worker import MEASURE_SLOT, import_ray, one_line

OBJECT_STORE_BYTES = 200 << 20
"""Object store of a local cluster: only configs and results travel, never arrays."""

_PROBE_TIMEOUT_S = 5.0
_WATCHDOG = str(Path(__file__).with_name("_ray_watchdog.py"))
_TAG = "FUSIONTUNE_RAY_INSTANCE"  # the environment variable that marks a local instance's processes
_WATCHDOG_WAIT_S = 15.0  # its kill rounds take at most 10 s

_watchdog: subprocess.Popen[bytes] | None = None  # of the local instance this process started


# ---- connecting ----------------------------------------------------------------------------------
def _probe(address: str) -> None:
    """Fail fast on an unreachable ``host:port`` (``ray.init`` would retry for minutes)."""
    if address in ("auto", "local") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise UserError(
            f"--ray-address {address!r}: expected HOST:PORT, e.g. 10.0.0.5:6379 (as `ray start --head` prints)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
            f"(start it with `ray start --head --resources='{{\"{MEASURE_SLOT}\": 1}}'`)"
        ) from None


def start_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Start a local Ray instance, or join the cluster at ``address``, unless already connected.

    Args:
        address: None starts a local instance (dashboard off, ``num_cpus`` CPUs, one measure
            slot, a 200 MB object store) and its watchdog (:mod:`~fusiontune.tune._ray_watchdog`:
            the instance does not outlive this process; :func:`stop_ray` ends both);
            ``HOST:PORT`` or ``auto`` joins a running cluster.
        num_cpus: CPUs of the local instance (default: ``os.cpu_count()``).

    Returns:
        True if this call connected (the caller calls :func:`stop_ray`), False if Ray was already
        up.

    Raises:
        UserError: the cluster cannot be reached.
    """
    ray = import_ray()
    if address is not None:
        _probe(address)
    if ray.is_initialized():
        return False
    quiet = dict(log_to_driver=False, configure_logging=False)
    if address is None:
        _start_local(num_cpus or os.cpu_count() or 1, quiet)
        return True
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        # Ray sends its token only where told to: a cluster with token authentication (the
        # default since Ray 2.5x) refuses a driver that has not set RAY_AUTH_MODE=token.
        raise UserError(
            f"cannot join the Ray cluster at {address}: {one_line(exc)} (if it uses token "
            "authentication, set RAY_AUTH_MODE=token, with the head's token in ~/.ray/auth_token "
            "or RAY_AUTH_TOKEN)"
        ) from None
    return True


def _start_local(num_cpus: int, quiet: dict[str, bool]) -> None:
    """``ray.init`` of a local instance, tagged for its watchdog (see :mod:`._ray_watchdog`)."""
    global _watchdog
    ray = import_ray()
    if _watchdog is not None:  # an earlier instance, shut down without stop_ray()
        _stop_watchdog(_watchdog)
        _watchdog = None
    value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    watchdog = _start_watchdog(f"{_TAG}={value}")
    # Inherited by every process ray.init starts, and by theirs; set only meanwhile, so that
    # nothing this process starts later carries it.
    os.environ[_TAG] = value
    try:
        ray.init(
            # "local": without it, ray.init joins the cluster last started on this machine
            # (/tmp/ray/ray_current_cluster), e.g. another user's, instead of starting one.
            address="local",
            num_cpus=num_cpus,
            resources={MEASURE_SLOT: 1},
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            **quiet,
        )
    except BaseException:
        _stop_watchdog(watchdog)  # what the failed start left behind goes too
        raise
    finally:
        os.environ.pop(_TAG, None)
    assert watchdog.stdin is not None
    watchdog.stdin.write(b"r")  # record the instance's processes now, not in a second
    watchdog.stdin.flush()
    _watchdog = watchdog


def stop_ray() -> None:
    """Shut Ray down, and have the watchdog of a local instance kill whatever of it remains."""
    global _watchdog
    ray = import_ray()
    try:
        if ray.is_initialized():
            ray.shutdown()
    finally:
        if _watchdog is not None:
            _stop_watchdog(_watchdog)
            _watchdog = None


def _start_watchdog(tag: str) -> subprocess.Popen[bytes]:
    """The watchdog of the processes tagged ``tag`` (``NAME=VALUE``), waiting for our end."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", _WATCHDOG, tag, str(os.getpid())],
        stdin=subprocess.PIPE,  # its end: this process closed it, or died
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to our process group (Ctrl-C) is not for it
    )


def _stop_watchdog(watchdog: subprocess.Popen[bytes]) -> None:
    """Close the watchdog's pipe and wait while it kills what is left of the instance."""
    assert watchdog.stdin is not None
    watchdog.stdin.close()
    try:
        watchdog.wait(timeout=_WATCHDOG_WAIT_S)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def measuring_nodes() -> dict[str, float]:
    """The alive nodes that have a measure slot: Ray node id -> CPUs.

    The ids are those ``ray.get_runtime_context().get_node_id()`` gives on the node, so the ones
    ``EvalResult.node`` records and ``EvalRequest.node`` takes.
    """
    return {
        n["NodeID"]: float(n["Resources"].get("CPU", 0.0))
        for n in import_ray().nodes()
        if n.get("Alive") and n["Resources"].get(MEASURE_SLOT, 0) >= 1
    }
