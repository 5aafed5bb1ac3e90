"""The watchdog of a local Ray instance: when its driver is gone, no process of that instance stays.

A driver killed with SIGKILL takes Ray's GCS and raylet with it (they share its fate), but not
every process they started: Ray's dashboard and runtime-env agents notice the raylet's death and
then wait about a minute for the dead GCS before they exit. So a driver that starts Ray locally
(:func:`fusiontune.tune._ray_cluster.start_ray`) also starts this process, in a session of its own,
as ``python -I -S _ray_watchdog.py NAME=VALUE DRIVER_PID`` (a file: only the standard library is
imported), its stdin a pipe the driver holds.

Which processes are the instance's: the driver sets the environment variable ``NAME=VALUE``
(unique per driver) only while ``ray.init`` starts the instance, so the processes ray.init starts
(the GCS, the raylet, Ray's monitors) carry it, and so does everything they start (agents,
workers, the jobs of Ray tasks). But Ray's agents overwrite their ``/proc/<pid>/environ`` with
their process title, and once their raylet is dead they hang from init: so the watchdog records,
while the driver lives, the driver's children that carry the tag and everything below them,
every second and whenever the driver writes a byte on the pipe (after ``ray.init``), each with
its start time (a pid used again by another process is left alone). At the end it kills what it
recorded, what still shows the tag, and what those started. Nothing else is touched: not another
Ray cluster on the machine, not the driver's other children.

At the end of its stdin (the driver closed the pipe after ``ray.shutdown()``, or died), it sends
SIGKILL to those processes and to whatever they started, again until none is left, and exits.
SIGKILL at once: the driver is gone, and Ray's own processes die the same way when their raylet
does. Linux only (``/proc``); elsewhere it exits and Ray's agents time out by themselves.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

_ROUNDS_S = 10.0  # at most this long killing: a process in uninterruptible sleep may linger
_RECORD_EVERY_S = 1.0


def _table() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (ppid, start time in clock ticks), from ``/proc/*/stat``."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 19 and fields[0] != b"Z":
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def below(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    """The processes of ``table`` below any of ``roots`` in the process tree."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def tagged(tag: bytes, pids: set[int] | None = None) -> set[int]:
    """The processes (of ``pids``, or all) whose environment holds ``tag`` (``NAME=VALUE``)."""
    found: set[int] = set()
    if pids is None:
        try:
            pids = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        except OSError:
            return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's: not ours
            continue
        if tag in environ.split(b"\0"):
            found.add(pid)
    return found


class Record:
    """The instance's processes as last seen: pid -> start time.

    The roots are the driver's children that carry the tag (what ``ray.init`` started: the GCS,
    the raylet, Ray's monitors), then everything below them; the driver's other children (a
    database server a test started, this watchdog) are not the instance's.
    """

    def __init__(self, tag: bytes, driver: int) -> None:
        self.tag = tag
        self.driver = driver
        self.seen: dict[int, int] = {}

    def alive(self, table: dict[int, tuple[int, int]]) -> set[int]:
        """The recorded processes still running (the same start time: not a pid used again)."""
        return {pid for pid, start in self.seen.items() if table.get(pid, (0, -1))[1] == start}

    def update(self) -> None:
        table = _table()
        children = {pid for pid, (ppid, _) in table.items() if ppid == self.driver}
        roots = tagged(self.tag, children - set(self.seen)) | self.alive(table)
        for pid in roots | below(roots, table):
            self.seen[pid] = table[pid][1]

    def kill(self) -> int:
        """SIGKILL what was recorded, what is tagged, and what those started, until none is left."""
        killed: set[int] = set()
        end = time.monotonic() + _ROUNDS_S
        me = os.getpid()
        while time.monotonic() < end:
            table = _table()
            ours = self.alive(table)
            ours |= tagged(self.tag, set(table) - ours)
            ours |= below(ours, table)
            ours.discard(me)
            for pid in ours:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            if not ours:
                break
            time.sleep(0.02)  # a killed process keeps its /proc entry until its parent reaps it
        return len(killed)


def main(args: list[str]) -> int:
    """Record the driver's descendants until the end of stdin, then kill them (see above)."""
    tag, driver = args[0].encode(), int(args[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver is not for us
    if not sys.platform.startswith("linux"):
        while os.read(0, 4096):
            pass
        return 0
    record = Record(tag, driver)
    while True:
        ready, _, _ = select.select([0], [], [], _RECORD_EVERY_S)
        if ready and not os.read(0, 4096):
            break  # EOF: the driver is done with Ray, or dead
        record.update()
    record.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
