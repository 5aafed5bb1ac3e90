"""Run one process of a user's job: under a supervisor that reaps it all, a time limit, capped logs.

The job runs under a small supervisor process (:mod:`fusiontune.tune._reaper`, a fresh
interpreter that imports only the standard library), started in a new session. The supervisor
makes itself the job's *child subreaper* on Linux, so every process the job starts stays below
it, even one that leaves the job's process group with ``setsid()`` (a daemonizing child); it
starts the job in a process group of its own; past the time limit it sends SIGTERM to that group
and to every descendant, waits a short grace, then kills; when the job's main process exits, it
SIGKILLs whatever the job left behind, group or not, until nothing is left. If this process goes
away (killed, interrupted), the supervisor sees its stdin close and does the same. Elsewhere than
Linux, only the job's process group is killed (see :mod:`~fusiontune.tune._reaper`).

stdout and stderr are read through pipes in this thread (one ``selectors`` loop, no reader
threads that could hang on a pipe a stray process holds) and written to files capped in size:
the head as it comes (a hanging job's first lines are on disk while it hangs), the tail kept in
memory and written at the end, with a marker where the middle was dropped.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LOG_CAP_BYTES = 1 << 20
"""Each of stdout and stderr keeps at most this much: half from the start, half from the end."""

TERM_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL of a job's process group."""

_SUPERVISOR_MARGIN_S = 10.0  # past the job's limit and grace, before the supervisor is killed
_KILL_WAIT_S = 6.0  # how long the supervisor may take to kill everything when we stop early
_REAPER = str(Path(__file__).with_name("_reaper.py"))
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
            self.file.write(
                f"\n[fusiontune: {dropped} bytes dropped here; the log is capped at"
                f" {self.head_cap + self.tail_cap} bytes]\n".encode()
            )
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
    """Run the job once under its supervisor and wait for it, at most ``timeout_s``.

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
    argv = ["/bin/sh", "-c", command] if shell else list(command)
    if isinstance(command, str) and not shell:
        argv = [command]
    out, err = CappedLog(stdout_path, cap_bytes), CappedLog(stderr_path, cap_bytes)
    status_r, status_w = os.pipe()
    supervisor = [
        sys.executable,
        "-I",
        "-S",
        _REAPER,
        "--status",
        str(status_w),
        "--timeout",
        repr(float(timeout_s)),
        "--grace",
        repr(float(term_grace_s)),
        "--",
        *argv,
    ]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            supervisor,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,  # its end (EOF) tells the supervisor that we are gone
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,  # no terminal's Ctrl-C or SIGHUP reaches the job through us
        )
    except OSError as exc:
        os.close(status_r)
        out.finish()
        err.finish()
        what = exc.strerror or type(exc).__name__
        return ProcessOutcome(None, False, 0.0, f"cannot start {exc.filename or argv[0]}: {what}")
    finally:
        os.close(status_w)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    status = _StatusLine()
    sinks: dict[int, CappedLog | _StatusLine] = {
        proc.stdout.fileno(): out,
        proc.stderr.fileno(): err,
        status_r: status,
    }
    selector = selectors.DefaultSelector()
    for fd in sinks:
        selector.register(fd, selectors.EVENT_READ)
    # The supervisor enforces the limit; this is for a supervisor that itself hangs.
    backstop = start + timeout_s + term_grace_s + _SUPERVISOR_MARGIN_S
    backstop_hit = False
    try:
        while status.final is None:
            if proc.poll() is not None and status_r not in selector.get_map():
                break  # it ended without a word (killed)
            if time.monotonic() >= backstop:
                backstop_hit = True
                break
            _drain(selector, sinks, min(0.25, max(0.0, backstop - time.monotonic())))
        wall_s = time.monotonic() - start
        if status.final is None and status.job_pid:  # the supervisor failed: its group at least
            kill_group(status.job_pid, signal.SIGKILL)
        kill_group(proc.pid, signal.SIGKILL)  # safe: not yet waited for, its pid is still its own
        proc.wait()
        end = time.monotonic() + 1.0
        while selector.get_map() and time.monotonic() < end:  # what was written before the end
            _drain(selector, sinks, 0.05)
    finally:
        selector.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()  # stdin first: its EOF makes a supervisor still running kill the job
        os.close(status_r)
        out.finish()
        err.finish()
        if proc.poll() is None:  # an exception here (KeyboardInterrupt): leave nothing behind
            try:  # the closed stdin has told the supervisor to kill it all: let it finish
                proc.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                if status.job_pid:
                    kill_group(status.job_pid, signal.SIGKILL)
                kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
    return _outcome(status, proc.returncode, backstop_hit, wall_s, out.total, err.total)


def _outcome(
    status: _StatusLine, supervisor_code: int, backstop_hit: bool, wall_s: float, out: int, err: int
) -> ProcessOutcome:
    """The job's outcome from the supervisor's last status line (its exit status, and the wall
    time it measured), or, when it never wrote one, a failure that says so."""
    pgid = status.job_pid
    final = status.final or ""
    word, *fields = final.split(" ", 1) if final else [""]
    if word == "error":
        return ProcessOutcome(None, False, 0.0, fields[0], pgid, out, err)
    if word == "exit":
        code, timed_out, job_wall_s = fields[0].split()
        if code != "none":
            return ProcessOutcome(
                int(code), timed_out == "1", float(job_wall_s), "", pgid, out, err
            )
        why = "the job's supervisor lost it (its caller closed the control pipe)"
        return ProcessOutcome(None, timed_out == "1", float(job_wall_s), why, pgid, out, err)
    if backstop_hit:
        return ProcessOutcome(None, True, wall_s, "", pgid, out, err)
    how = f"exit status {supervisor_code}"
    if supervisor_code < 0:
        how = signal.Signals(-supervisor_code).name
    why = f"the job's supervisor ended ({how}) without reporting the job's exit"
    return ProcessOutcome(None, False, wall_s, why, pgid, out, err)


class _StatusLine:
    """The supervisor's status pipe: ``started <pid>``, then ``exit ...`` or ``error ...``."""

    def __init__(self) -> None:
        self.buffer = b""
        self.job_pid = 0
        self.final: str | None = None

    def write(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            raw, _, self.buffer = self.buffer.partition(b"\n")
            line = raw.decode("utf-8", errors="replace")
            if line.startswith("started "):
                self.job_pid = int(line.split()[1])
            elif line.startswith(("exit ", "error ")):
                self.final = line


def _drain(
    selector: selectors.BaseSelector, sinks: Mapping[int, CappedLog | _StatusLine], timeout: float
) -> None:
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
