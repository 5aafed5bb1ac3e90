"""Console helpers of the tuning loop: stop on SIGINT / SIGTERM, the progress bar (or lines without
a terminal), time units."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO


def format_seconds(seconds: float) -> str:
    """``12.3 us``, ``4.56 ms``, ``1.23 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


class StopSignal:
    """SIGINT / SIGTERM ask the loop to stop after the batch in flight; a second one aborts."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.requested = False
        self._echo = echo
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        # Python delivers signals to the main thread only; elsewhere there is nothing to catch.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = signal.Signals(signum).name
        self._echo(f"{name}: stopping after the trials in flight are recorded (again to abort)")


# Without a terminal (a log file, nohup, CI) the bar becomes a line every PROGRESS_EVERY_TRIALS
# trials or PROGRESS_EVERY_S seconds, whichever comes first: an overnight sweep of 2-3 minute
# trials prints one per trial, a quick one of sub-second trials one per 10.
PROGRESS_EVERY_TRIALS = 10
PROGRESS_EVERY_S = 60.0


def format_elapsed(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``2h07m``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _NoBar:
    """``--no-progress``: nothing is shown; messages still go to stderr."""

    disable = True

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None

    def told(self, ok: bool) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr)


class ProgressLines:
    """The progress of a sweep as plain lines, for a stderr that is not a terminal.

    One line at the start, then one when :data:`PROGRESS_EVERY_TRIALS` trials were told since the
    last line or when a trial is told :data:`PROGRESS_EVERY_S` seconds or more after it, and one at
    the end: ``progress mlp: 20/40 trials finished, best feasible 1.23 ms (trial 17), 1 failed,
    3m05s elapsed``. ``failed`` counts the failed trials of this run.
    """

    disable = False

    def __init__(
        self,
        total: int,
        initial: int,
        name: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_trials: int = PROGRESS_EVERY_TRIALS,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.total = total
        self.finished = initial
        self.name = name
        self.failed = 0
        self.best = "no feasible trial yet"
        self._stream = stream
        self._clock = clock
        self._every_trials = every_trials
        self._every_s = every_s
        self._start = clock()
        self._last_at = self._start
        self._since_last = 0

    def __enter__(self) -> ProgressLines:
        self._print(
            f"progress {self.name}: {self.finished}/{self.total} trials finished at the start;"
            f" a line every {self._every_trials} trials or {self._every_s:.0f} s"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._since_last:
            self._line()

    def update(self, n: int = 1) -> None:
        self.finished += n
        self._since_last += n
        now = self._clock()
        if self._since_last >= self._every_trials or now - self._last_at >= self._every_s:
            self._line()

    def told(self, ok: bool) -> None:
        """One trial was told: failed unless ``ok``."""
        self.failed += not ok
        self.update(1)

    def set_postfix_str(self, text: str) -> None:
        self.best = text

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or self._stream or sys.stderr, flush=True)

    def line(self) -> str:
        elapsed = format_elapsed(self._clock() - self._start)
        return (
            f"progress {self.name}: {self.finished}/{self.total} trials finished, {self.best},"
            f" {self.failed} failed, {elapsed} elapsed"
        )

    def _line(self) -> None:
        self._print(self.line())
        self._last_at = self._clock()
        self._since_last = 0

    def _print(self, text: str) -> None:
        print(text, file=self._stream or sys.stderr, flush=True)


class _Bar:
    """tqdm's bar on a terminal, its postfix the best feasible trial and the failures."""

    disable = False

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self.best = ""
        self.failed = 0

    def __enter__(self) -> _Bar:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def told(self, ok: bool) -> None:
        if not ok:
            self.failed += 1
            self._postfix()
        self._bar.update(1)

    def set_postfix_str(self, text: str) -> None:
        self.best = text
        self._postfix()

    def write(self, text: str, file: Any = None) -> None:
        self._bar.write(text, file=file)

    def _postfix(self) -> None:
        failed = f"{self.failed} failed" if self.failed else ""
        self._bar.set_postfix_str(", ".join(p for p in (self.best, failed) if p))


def progress_bar(progress: bool, total: int, initial: int, name: str) -> Any:
    """The sweep's progress: a tqdm bar on a terminal, :class:`ProgressLines` elsewhere.

    Args:
        progress: False (``--no-progress``) shows nothing.
        total: the study's trial budget.
        initial: trials already finished when this run starts.
        name: the study.

    Returns:
        A context manager with ``told(ok)``, ``update(n)``, ``set_postfix_str(text)`` and
        ``write(text, file)``.
    """
    if not progress:
        return _NoBar()
    if not sys.stderr.isatty():
        return ProgressLines(total, initial, name)
    from tqdm import tqdm

    return _Bar(
        tqdm(
            total=total,
            initial=min(initial, total),
            desc=name,
            unit="trial",
            file=sys.stderr,
            dynamic_ncols=True,
        )
    )
