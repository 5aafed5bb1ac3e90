"""The cost model both example jobs share: a deterministic runtime and error from the switches.

A stand-in for what a real job measures. Each pass has a speed effect (most help, a few hurt on
this model); one pair helps only together; one pass (the planted accuracy culprit) is the
fastest of all but breaks the accuracy bound. So the job has one known optimum within the bound:
every helpful pass on, both passes of the pair on, the harmful ones and the culprit off.

Test hooks (environment variables, a comma-separated list of pass names, or ``*`` for any
configuration): the job misbehaves when one of the named passes is on.

- ``FT_EXAMPLE_HANG``: starts a child process, then both sleep forever;
- ``FT_EXAMPLE_IGNORE_TERM=1``: the hanging job and its child ignore SIGTERM (only SIGKILL ends them);
- ``FT_EXAMPLE_CRASH``: dies of SIGSEGV after a line on stderr;
- ``FT_EXAMPLE_GARBAGE``: prints no JSON object, only noise;
- ``FT_EXAMPLE_FLOOD=N``: prints N bytes of log on stdout before the result.

Pure Python (no numpy): a run takes a few tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn


@dataclass(frozen=True)
class Model:
    """What the example job's switches do.

    Attributes:
        base_ms: the runtime with every modeled pass off.
        base_error: the error with every modeled pass off (the job's own floor).
        speed_ms: per pass, the runtime it adds when on (negative: it helps).
        error: per pass, the error it adds when on.
        pair: two passes whose benefit ``pair_ms`` appears only when both are on.
        pair_ms: that benefit (negative).
        patterns: per pass, ``(kind, pattern, matched_times)`` for the fusion statistics.
    """

    base_ms: float
    base_error: float
    speed_ms: Mapping[str, float]
    error: Mapping[str, float]
    pair: tuple[str, str]
    pair_ms: float
    patterns: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)

    def runtime_s(self, on: Mapping[str, bool]) -> float:
        ms = self.base_ms + sum(v for name, v in self.speed_ms.items() if on.get(name))
        if all(on.get(name) for name in self.pair):
            ms += self.pair_ms
        return round(ms / 1000.0, 9)

    def error_of(self, on: Mapping[str, bool]) -> float:
        return self.base_error + sum(v for name, v in self.error.items() if on.get(name))

    def fusion_counts(self, on: Mapping[str, bool]) -> dict[str, tuple[str, str, int, int]]:
        """Per pass that ran: (kind, pattern, matched_times, effected_times).

        A member of the pair matches but applies nothing without the other: there is nothing
        for it to fuse with.
        """
        out = {}
        for name, (kind, pattern, matched) in self.patterns.items():
            if not on.get(name):
                continue
            effected = matched
            if name in self.pair and not all(on.get(p) for p in self.pair):
                effected = 0
            out[name] = (kind, pattern, matched, effected)
        return out


def _hooked(variable: str, on: Mapping[str, bool]) -> bool:
    names = [n.strip() for n in os.environ.get(variable, "").split(",") if n.strip()]
    return any(n == "*" or on.get(n) for n in names)


def misbehave(on: Mapping[str, bool]) -> None:
    """Act out the test hooks (see the module docstring); returns when none applies."""
    if _hooked("FT_EXAMPLE_HANG", on):
        if os.environ.get("FT_EXAMPLE_IGNORE_TERM") == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"compiling the graph ... (worker pid {child.pid})", flush=True)
        while True:
            time.sleep(3600)
    if _hooked("FT_EXAMPLE_CRASH", on):
        print("Fatal error: segmentation fault in the fused kernel", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(1)
    if _hooked("FT_EXAMPLE_GARBAGE", on):
        print("runtime: fast\nerror: small\n{not json}", flush=True)
        sys.exit(0)
    flood = int(os.environ.get("FT_EXAMPLE_FLOOD", "0") or 0)
    if flood > 0:
        line = "x" * 99 + "\n"
        out = sys.stdout
        for _ in range(flood // 100):
            out.write(line)
        out.flush()


def timestamp() -> str:
    """CANN's log time stamp, ``2025-04-10-20:10:58.288.365``."""
    t = time.time()
    ms = int((t % 1) * 1e6)
    return time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(t)) + f".{ms // 1000:03d}.{ms % 1000:03d}"


def ge_log_line(
    kind: str, name: str, pattern: str, matched: int, effected: int, process: str = "atc.bin"
) -> str:
    """A GE ``RunOnePattern`` INFO line, as plog writes it (seed 002)."""
    pid = os.getpid()
    return (
        f"[INFO] GE({pid},{process}):{timestamp()} [pattern_fusion_base_pass.cc:259]{pid} "
        f"RunOnePattern:GraphId[0], {kind}Pass[{name}]: pattern={pattern}, "
        f"matched_times={matched}, effected_times={effected}."
    )


def fusion_result(counts: Mapping[str, tuple[str, str, int, int]]) -> list[dict[str, object]]:
    """CANN's ``fusion_result.json`` content (counts are strings, as CANN writes them)."""
    sections: dict[str, dict[str, dict[str, str]]] = {"graph_fusion": {}, "ub_fusion": {}}
    for name, (kind, _pattern, matched, effected) in counts.items():
        section = "graph_fusion" if kind == "GraphFusion" else "ub_fusion"
        sections[section][name] = {"match_times": str(matched), "effect_times": str(effected)}
    return [{"graphId": "0", "session_and_graph_id": "0_0", **sections}]


def report(model: Model, on: Mapping[str, bool], extra: Mapping[str, object] | None = None) -> None:
    """The job's last line: one JSON object with what it measured."""
    out = {"runtime_s": model.runtime_s(on), "error": model.error_of(on)}
    out.update(extra or {})
    print(json.dumps(out), flush=True)


def fail(message: str, code: int = 1) -> NoReturn:
    print(message, file=sys.stderr, flush=True)
    sys.exit(code)
