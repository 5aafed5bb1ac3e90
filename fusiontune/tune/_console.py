"""Console helpers of the tuning loop: stop on SIGINT / SIGTERM, the progress bar, time units."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any


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


class _NoBar:
    disable = True

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr)


def progress_bar(progress: bool, total: int, initial: int, name: str) -> Any:
    if not (progress and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=min(initial, total),
        desc=name,
        unit="trial",
        file=sys.stderr,
        dynamic_ncols=True,
    )
