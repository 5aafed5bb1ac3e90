"""The supervisor of one run of a user's job: it runs the job and leaves none of its processes behind.

Started by :func:`fusiontune.tune._job_process.run_process` as ``python -I -S _reaper.py --status
FD --timeout S --grace G -- ARGV...`` (a file, not ``-m``: only the standard library is imported,
which keeps its start to a few tens of milliseconds). It:

1. makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a process its job
   orphans (a daemon: double fork, ``setsid()``) is re-parented to it instead of to init, so
   every process the job ever started stays in its process tree, whatever group or session it
   moved to;
2. starts the job in a process group of its own (its pid), stdin from ``/dev/null``, stdout and
   stderr inherited (the caller's capped pipes);
3. waits for the job, the time limit, or the end of its stdin (the caller closed it or died);
4. past the limit: SIGTERM to the job's group and to every descendant, ``--grace`` seconds, then
   on; when the job has ended (or the caller is gone): SIGKILL to the group and to every
   descendant found in ``/proc``, reaping them, again until none is left;
5. writes one line on ``--status``, ``exit <returncode> <timed_out 0|1> <wall_s>`` (or
   ``error <message>`` when the job cannot start), and exits.

Elsewhere than Linux there is no subreaper and no ``/proc``: only the job's process group is
killed, and a daemonizing child that left it escapes, as it does without this supervisor.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Sequence

PR_SET_CHILD_SUBREAPER = 36
_KILL_ROUNDS_S = 5.0  # at most this long killing: a process in uninterruptible sleep may linger
_REAP_POLL_S = 0.5  # wake up this often even without a signal, to reap and look at the clock


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; False where that is impossible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (from ``/proc/*/stat``); [] without it."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal(pids: Sequence[int], pgid: int, sig: int) -> None:
    for target in (-pgid, *pids):
        try:
            os.kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Supervisor:
    """One job, its process group, and everything below this process."""

    def __init__(self, argv: Sequence[str], status_fd: int) -> None:
        self.argv = list(argv)
        self.status_fd = status_fd
        self.job_pid = 0
        self.job_status: int | None = None  # the raw wait status
        self.started = 0.0

    def start(self) -> str:
        """Start the job; "" or why it could not start."""
        self.started = time.monotonic()
        # posix_spawn, not subprocess.Popen: a Popen object collects its child's exit status
        # when it is garbage collected, which would take the job's from reap(); and subprocess
        # costs this short-lived interpreter several milliseconds of imports.
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            self.job_pid = os.posix_spawnp(
                self.argv[0],
                self.argv,
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0)],
                setpgroup=0,  # a process group of its own, the job's pid
            )
        except OSError as exc:
            return (
                f"cannot start {exc.filename or self.argv[0]}: {exc.strerror or type(exc).__name__}"
            )
        finally:
            os.close(devnull)
        return ""

    def reap(self) -> None:
        """Collect every child that has exited (the job, and orphans re-parented here)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.job_pid:
                self.job_status = status

    def wait(self, wakeup: int, control: int, until: float) -> bool:
        """Sleep until a child exits, ``until`` (monotonic), or the caller goes; False if it went."""
        timeout = max(0.0, min(until - time.monotonic(), _REAP_POLL_S))
        try:
            ready, _, _ = select.select([wakeup, control], [], [], timeout)
        except InterruptedError:
            ready = []
        if wakeup in ready:
            try:
                os.read(wakeup, 4096)
            except BlockingIOError:
                pass
        if control in ready:
            try:
                data = os.read(control, 4096)
            except OSError:
                data = b""
            if not data:
                return False
        return True

    def kill_all(self) -> None:
        """SIGKILL the job's group and every descendant, reaping them, until none is left."""
        end = time.monotonic() + _KILL_ROUNDS_S
        while True:
            left = descendants(os.getpid())
            _signal(left, self.job_pid, signal.SIGKILL)
            self.reap()
            if not left or time.monotonic() > end:
                return
            time.sleep(0.005)

    def run(self, timeout_s: float, grace_s: float) -> tuple[int | None, bool, float]:
        """Run the job to its end or its limit; (returncode, timed_out, wall_s)."""
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        os.set_blocking(rfd, False)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
        # The caller kills the job's group on a timeout of its own; a SIGTERM that reaches this
        # process (its session) must not end it before it has killed what is below it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        deadline, kill_at = self.started + timeout_s, float("inf")
        timed_out = False
        while True:
            self.reap()
            if self.job_status is not None:
                break
            now = time.monotonic()
            if now >= kill_at:
                break
            if now >= deadline and not timed_out:
                timed_out = True
                _signal(descendants(os.getpid()), self.job_pid, signal.SIGTERM)
                kill_at = now + grace_s
                continue
            if not self.wait(rfd, 0, min(deadline, kill_at)):
                break  # the caller closed our stdin or died: end it all now
        wall_s = time.monotonic() - self.started
        self.kill_all()
        status = self.job_status
        if status is None:
            return (None, timed_out, wall_s)
        return (os.waitstatus_to_exitcode(status), timed_out, wall_s)


def main(args: Sequence[str]) -> int:
    """Entry point; see the module docstring for the arguments and the status line."""
    # By hand, not argparse: its import alone is a third of this interpreter's start.
    options: dict[str, str] = {}
    rest = list(args)
    while rest and rest[0] != "--":
        name, value, *rest = rest
        options[name] = value
    argv = rest[1:]
    status_fd = int(options["--status"])
    os.set_inheritable(status_fd, False)  # for us alone: the job must not hold it open
    become_subreaper()
    supervisor = Supervisor(argv, status_fd)
    error = supervisor.start() if argv else "cannot start: no command"
    if error:
        line = "error " + error.replace("\n", " ")
    else:
        os.write(status_fd, f"started {supervisor.job_pid}\n".encode())
        code, timed_out, wall_s = supervisor.run(
            float(options["--timeout"]), float(options["--grace"])
        )
        line = f"exit {'none' if code is None else code} {int(timed_out)} {wall_s:.6f}"
    try:
        os.write(status_fd, (line + "\n").encode())
    except OSError:  # the caller is gone: nobody to tell
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
