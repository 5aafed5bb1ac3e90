"""Run one process of a user's job: its own process group, a time limit, capped logs.

The job starts in a new session (``start_new_session=True``), so it and everything it starts
share one process group. Past the time limit the group gets SIGTERM, a short grace, then
SIGKILL; when the job's main process exits, whatever it left behind in the group is killed too,
so no trial leaves processes running. stdout and stderr are read through pipes in this thread
(one ``selectors`` loop, no reader threads that could hang on a pipe a stray process holds) and
written to files capped in size: the head as it comes (a hanging job's first lines are on disk
while it hangs), the tail kept in memory and written at the end, with a marker where the middle
was dropped.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LOG_CAP_BYTES = 1 << 20
"""Each of stdout and stderr keeps at most this much: half from the start, half from the end."""

TERM_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL of a job's process group."""

_LINGER_S = 2.0  # after the main process exits, how long a stray child may keep the pipes open
_READ = 1 << 16


@dataclass(frozen=True)
class ProcessOutcome:
    """How one run of the job ended.

    Attributes:
        returncode: the exit status (negative: killed by that signal); None if it never started.
        timed_out: it ran past the limit and its process group was killed.
        wall_s: seconds from start to exit.
        start_error: why it could not be started (no such program, permission), else "".
        pgid: the process group it ran in (its pid), 0 if it never started.
        stdout_bytes: bytes it wrote on stdout (the file may hold fewer).
        stderr_bytes: bytes it wrote on stderr.
    """

    returncode: int | None
    timed_out: bool
    wall_s: float
    start_error: str = ""
    pgid: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0


class CappedLog:
    """A pipe's bytes to a file, at most ``cap`` of them: the head as it comes, the tail at the end."""

    def __init__(self, path: Path, cap: int = LOG_CAP_BYTES) -> None:
        self.path = path
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.file = open(path, "wb")  # noqa: SIM115 - closed by finish()
        self.head = 0
        self.total = 0
        self.tail = bytearray()

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if self.head < self.head_cap:
            n = min(len(data), self.head_cap - self.head)
            self.file.write(data[:n])
            self.file.flush()
            self.head += n
            data = data[n:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:  # trim now and then, not on every chunk
                del self.tail[: len(self.tail) - self.tail_cap]

    def finish(self) -> None:
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap else b""
        dropped = self.total - self.head - len(tail)
        if dropped > 0:
            self.file.write(f"\n[fusiontune: {dropped} bytes dropped here; the log is capped at"
                            f" {self.head_cap + self.tail_cap} bytes]\n".encode())
        self.file.write(tail)
        self.file.close()


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its credentials: nothing more we may do
        return False
    return True


def run_process(
    command: Sequence[str] | str,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    timeout_s: float,
    stdout_path: Path,
    stderr_path: Path,
    *,
    shell: bool = False,
    cap_bytes: int = LOG_CAP_BYTES,
    term_grace_s: float = TERM_GRACE_S,
) -> ProcessOutcome:
    """Run the job once and wait for it, at most ``timeout_s`` (then kill its process group).

    Args:
        command: the argv, or (``shell``) one line for ``/bin/sh -c``.
        cwd: its working directory.
        env: its whole environment.
        timeout_s: the time limit.
        stdout_path: where its stdout goes (capped, see :class:`CappedLog`).
        stderr_path: where its stderr goes.
        shell: run ``command`` through ``/bin/sh``.
        cap_bytes: the cap of each log.
        term_grace_s: seconds between SIGTERM and SIGKILL on a timeout.

    Returns:
        How it ended; never raises for the job's own failure (a missing program included).
    """
    out, err = CappedLog(stdout_path, cap_bytes), CappedLog(stderr_path, cap_bytes)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,  # type: ignore[arg-type]
            cwd=cwd,
            env=dict(env),
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills all of it
        )
    except OSError as exc:
        out.finish()
        err.finish()
        what = exc.strerror or type(exc).__name__
        name = exc.filename or (command if isinstance(command, str) else command[0])
        return ProcessOutcome(None, False, 0.0, f"cannot start {name}: {what}")
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    selector = selectors.DefaultSelector()
    for fd in sinks:
        selector.register(fd, selectors.EVENT_READ)
    deadline = start + timeout_s
    timed_out = False
    exited_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                exited_at = now if exited_at is None else exited_at
                if not selector.get_map() or now - exited_at > _LINGER_S:
                    break  # done; or a child it left behind holds the pipes (killed below)
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            wait = min(deadline - now, 0.25)
            if selector.get_map():
                _drain(selector, sinks, wait)
            else:  # it closed both pipes and runs on
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
        if timed_out:
            kill_group(proc.pid, signal.SIGTERM)
            grace_end = time.monotonic() + term_grace_s
            while proc.poll() is None and time.monotonic() < grace_end:
                _drain(selector, sinks, 0.05)
        # Whatever is left of the group (a hung child, or one the job left behind) goes now.
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        wall_s = time.monotonic() - start
        end = time.monotonic() + 1.0
        while selector.get_map() and time.monotonic() < end:  # what was written before the end
            _drain(selector, sinks, 0.05)
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()
        out.finish()
        err.finish()
        if proc.poll() is None:  # an exception here (KeyboardInterrupt): leave nothing behind
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
    return ProcessOutcome(
        proc.returncode, timed_out, wall_s, "", proc.pid, out.total, err.total
    )


def _drain(selector: selectors.BaseSelector, sinks: dict[int, CappedLog], timeout: float) -> None:
    for key, _ in selector.select(timeout=max(0.0, timeout)):
        fd = int(key.fd)
        try:
            data = os.read(fd, _READ)
        except OSError:
            data = b""
        if data:
            sinks[fd].write(data)
        else:
            selector.unregister(fd)
