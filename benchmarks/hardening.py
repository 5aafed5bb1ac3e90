"""Issue 14's acceptance tables: corrupted caches, misbehaving jobs and bad input, against the CLI.

Every scenario runs the real command line, ``[sys.executable, "-m", "fusiontune", ...]``, in a
subprocess; ``--checkout DIR`` puts ``DIR`` on the subprocesses' ``PYTHONPATH`` (so one script
measures any checkout, an old one included) and links ``DIR/search_spaces`` into a temporary
working folder, where ``results/<study>/`` is written. The kernel cache is a temporary
``FUSIONTUNE_CACHE_DIR``. Nothing is left in the checkout; the bad-input table says whether a
scenario wrote anything outside its temporary folder.

Tables (each row: exit code and the first line of stderr, or ``Traceback: <last line>``):

1. ``corruption``: the kernel cache warmed with ``fusiontune run mlp``, then ONE file of one kind
   damaged (the module ``k_<key>.py``: garbage, truncated, one float literal of the kernel body
   changed; numba's index ``.nbi`` and machine code ``.nbc``: truncated, garbage). The same
   ``run mlp --json`` twice: the first run and the next (max_rel from its JSON when it exits 0),
   then, on a fresh copy with the same damage, a sweep ``tune mlp.toml --workers 0 --trials 6``.
2. ``jobs``: a command target whose job prints a negative runtime, ``Infinity``, a negative error,
   the error as a JSON string, for one configuration of four (the fastest): how the trial was
   recorded and whether it became the recommendation; a job that daemonizes a grandchild past a
   2 s trial timeout (how long the grandchild outlived the trial); a driver with Ray workers killed
   with SIGKILL (how long its Ray processes outlived it).
3. ``inputs``: path-escaping study names, out-of-range numbers, a deeply nested config, ``report``
   on an empty and on a foreign SQLite file, ``--version`` and ``run --help``.

    .venv/bin/python benchmarks/hardening.py [--checkout DIR] [--only corruption|jobs|inputs]
        [--markdown]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 180.0


# ---- running the CLI -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One finished (or timed-out) command: exit code, output, wall seconds."""

    rc: int | str
    stdout: str
    stderr: str
    seconds: float

    @property
    def line(self) -> str:
        """The first line of stderr, or ``Traceback: <last exception line>``."""
        return first_line(self.stderr)


def first_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "(empty)"
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        top = [ln for ln in lines if not ln[:1].isspace() and not ln.startswith("Traceback")]
        return "Traceback: " + short(top[-1] if top else lines[-1])
    return short(lines[0])


def short(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Harness:
    """Runs ``python -m fusiontune`` against one checkout, in temporary folders."""

    def __init__(self, checkout: Path, root: Path) -> None:
        self.checkout = checkout
        self.root = root  # every scenario's temporary files live under it
        self.cache = root / "cache"
        self.work = root / "a" / "b" / "work"  # deep enough that ../../../x stays under root
        self.work.mkdir(parents=True)
        (self.work / "search_spaces").symlink_to(checkout / "search_spaces")

    def env(self, cache: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.checkout)
        env["FUSIONTUNE_CACHE_DIR"] = str(cache or self.cache)
        env.pop("FUSIONTUNE_DEBUG", None)
        return env

    def cli(
        self,
        args: Sequence[str],
        *,
        cwd: Path | None = None,
        cache: Path | None = None,
        timeout: float = RUN_TIMEOUT_S,
    ) -> Outcome:
        cmd = [sys.executable, "-m", "fusiontune", *args]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd or self.work,
            env=self.env(cache),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            out, err = proc.communicate()
            rc = f"timeout {timeout:.0f}s"
        return Outcome(rc, out, err, time.monotonic() - start)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def log(message: str) -> None:
    print(f"[hardening] {message}", file=sys.stderr, flush=True)


def fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def run_json(outcome: Outcome) -> dict | None:
    if outcome.rc != 0:
        return None
    text = outcome.stdout
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None


def max_rel(outcome: Outcome) -> str:
    data = run_json(outcome)
    if data is None:
        return "-"
    value = (data.get("error") or {}).get("max_rel")
    return fmt(value) if isinstance(value, (int, float)) else str(value)


def trials_summary(results: Path) -> tuple[int, int, str]:
    """(failed, finished, first error_msg) from ``results/<study>/trials.csv``; WAITING rows skipped."""
    import csv

    path = results / "trials.csv"
    if not path.exists():
        return -1, -1, "no trials.csv"
    rows = [r for r in csv.DictReader(path.open()) if r.get("state") not in ("WAITING", "RUNNING")]
    failed = [r for r in rows if r.get("state") == "FAIL" or r.get("status", "ok") != "ok"]
    msg = next((r.get("error_msg") or r.get("status") or "" for r in failed), "")
    return len(failed), len(rows), short(msg, 70)


def _recommended_error(results: Path) -> str:
    import csv

    path = results / "trials.csv"
    if not path.exists():
        return "-"
    for row in csv.DictReader(path.open()):
        if (row.get("ranked_by") or "").startswith("recommended"):
            return (
                f"{row.get('number')} ({row.get('role') or 'sampled'}, {row.get('error') or '-'})"
            )
    return "none"


# ---- 1. corruption ---------------------------------------------------------------------------------
FLOAT = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.])")


def kernels_dir(cache: Path) -> Path:
    found = sorted(p for p in cache.glob("kernels-numba*/*") if p.is_dir())
    if not found:
        raise RuntimeError(f"no kernels-numba*/<target> folder under {cache}")
    return found[0]


def pick_kernel(kdir: Path, need_literal: bool = False) -> Path:
    """The largest kernel module (by size, then name); with a float literal in its body if asked."""
    mods = sorted(kdir.glob("k_*.py"), key=lambda p: (-p.stat().st_size, p.name))
    for mod in mods:
        if not need_literal or _body_literal(mod.read_text()) is not None:
            return mod
    raise RuntimeError("no kernel module with a float literal in its body")


def _body_literal(text: str) -> re.Match[str] | None:
    body = text.find("\ndef ")
    if body < 0:
        return None
    return FLOAT.search(text, body)


def _change_literal(path: Path) -> str:
    text = path.read_text()
    m = _body_literal(text)
    assert m is not None
    old = m.group(1)
    new = str(float(old) + 1.0)
    path.write_text(text[: m.start(1)] + new + text[m.end(1) :])
    return f"{old} -> {new}"


def _truncate(path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return f"{len(data)} -> {len(data) // 2} B"


def _garbage(path: Path) -> str:
    n = path.stat().st_size
    path.write_bytes(random.Random(14).randbytes(n))
    return f"{n} random B"


CORRUPTIONS: list[tuple[str, str, Callable[[Path], str]]] = [
    ("k_<key>.py garbage", "py", _garbage),
    ("k_<key>.py truncated", "py", _truncate),
    ("k_<key>.py float literal changed", "literal", _change_literal),
    (".nbi truncated", "nbi", _truncate),
    (".nbi garbage", "nbi", _garbage),
    (".nbc truncated", "nbc", _truncate),
    (".nbc garbage", "nbc", _garbage),
]


def corrupt(cache: Path, kind: str, damage: Callable[[Path], str]) -> tuple[Path, str]:
    kdir = kernels_dir(cache)
    mod = pick_kernel(kdir, need_literal=kind == "literal")
    if kind in ("py", "literal"):
        target = mod
    else:
        found = sorted((kdir / "__pycache__").glob(f"{mod.stem}.*.{kind}"))
        if not found:
            raise RuntimeError(f"no .{kind} file for {mod.name}")
        target = found[0]
    return target, damage(target)


def table_corruption(h: Harness) -> tuple[list[str], list[list[str]], list[str]]:
    notes: list[str] = []
    base = h.root / "cache_warm"
    log("corruption: warming the kernel cache with `run mlp`")
    warm = h.cli(["run", "mlp", "--json", "--out", str(h.root / "out_warm")], cache=base)
    if warm.rc != 0:
        raise RuntimeError(f"warming failed: rc {warm.rc}: {warm.line}")
    notes.append(
        f"warm run: rc 0, max_rel {max_rel(warm)}, {warm.seconds:.1f} s; "
        f"{len(list(kernels_dir(base).glob('k_*.py')))} kernel modules cached"
    )
    headers = [
        "corruption",
        "file (damage)",
        "first run: rc",
        "first run: stderr",
        "first: max_rel",
        "next run: rc",
        "next run: stderr",
        "next: max_rel",
        "sweep (6 trials): rc",
        "sweep: failed / finished",
        "sweep: stderr / first failure",
        "sweep: recommended trial (error)",
    ]
    rows: list[list[str]] = []
    for i, (label, kind, damage) in enumerate(CORRUPTIONS):
        log(f"corruption: {label}")
        cache = h.root / f"cache_{i}"
        shutil.copytree(base, cache, symlinks=True)
        try:
            target, what = corrupt(cache, kind, damage)
        except (RuntimeError, AssertionError, OSError) as e:
            rows.append([label, f"not measured: {e}", *["-"] * 10])
            continue
        first = h.cli(["run", "mlp", "--json", "--out", str(h.root / f"out_{i}a")], cache=cache)
        nxt = h.cli(["run", "mlp", "--json", "--out", str(h.root / f"out_{i}b")], cache=cache)
        # The sweep starts from the same damage, on a fresh copy of the warm cache.
        sweep_cache = h.root / f"cache_{i}_sweep"
        shutil.copytree(base, sweep_cache, symlinks=True)
        corrupt(sweep_cache, kind, damage)
        study = f"corrupt{i}"
        sweep = h.cli(
            [
                "tune",
                "search_spaces/mlp.toml",
                "--workers",
                "0",
                "--trials",
                "6",
                "--study",
                study,
                "--no-confirm",
                "--no-progress",
            ],
            cache=sweep_cache,
            timeout=300,
        )
        failed, finished, msg = trials_summary(h.work / "results" / study)
        sweep_cell = f"{failed} / {finished}" if finished >= 0 else "no trials.csv"
        rows.append(
            [
                label,
                f"{target.name} ({what})",
                str(first.rc),
                first.line,
                max_rel(first),
                str(nxt.rc),
                nxt.line,
                max_rel(nxt),
                str(sweep.rc),
                sweep_cell,
                sweep.line if sweep.rc != 0 or not msg else msg,
                _recommended_error(h.work / "results" / study),
            ]
        )
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(sweep_cache, ignore_errors=True)
    notes.append(
        "damaged file: the largest kernel module (or its numba index / machine code); the literal"
        " change is the first float literal in the kernel body. Sweeps: --no-confirm --no-progress."
    )
    return headers, rows, notes


# ---- 2. misbehaving jobs ---------------------------------------------------------------------------
JOB = r"""
import json, os, sys, time

mode = sys.argv[1]
switch_file = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--fusion_switch_file="))
trial_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--output_dir="))
text = open(switch_file).read()
try:
    groups = json.loads(text)["Switch"]
    flat = {}
    for group in groups.values():
        flat.update(group)
    on = lambda name: flat.get(name, flat.get("ALL", "on")) == "on"
except ValueError:  # the line form, PassName:off
    off = {ln.split(":")[0].strip() for ln in text.splitlines() if ln.strip().endswith("off")}
    on = lambda name: name not in off

if mode == "daemon":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.environ["HARDENING_PIDS"], "a") as f:
                f.write(f"{os.getpid()}\n")
            for fd in (0, 1, 2):
                os.close(fd)
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    time.sleep(30)  # past the trial timeout: the job is killed, the grandchild is in its own session
    sys.exit(0)

# The fastest configuration (PassA off, PassB on) is the one that prints the bad value.
bad = (not on("PassA")) and on("PassB")
runtime = 0.02 - 0.001 * on("PassA") - 0.002 * on("PassB")
error = 1e-4
if bad:
    open(os.path.join(trial_dir, "BAD"), "w").close()
    runtime = 0.005
    if mode == "neg_runtime":
        runtime = -0.01
    elif mode == "inf_runtime":
        runtime = float("inf")
    elif mode == "neg_error":
        error = -1.0
    elif mode == "str_error":
        error = "0.1"
print(json.dumps({"runtime_s": runtime, "error": error}))
"""

SPACE = """\
[target]
kind = "command"
command = ["{{python}}", "{job}", "{mode}", "--fusion_switch_file={{switch_file}}", "--output_dir={{trial_dir}}"]
env = {{ HARDENING_PIDS = "{pids}" }}
workdir = "{workdir}"
timeout_s = {timeout}
repeats = 1

[target.metrics]
runtime = "runtime_s"
error = "error"

[passes]
GraphFusion = ["PassA", "PassB"]

[accuracy]
bound = 1e-3

[search]
sampler = "grid"
trials = 6
seed = 0
top_k = 2
workers = 0
"""

BAD_JOBS = [
    ("negative runtime (-0.01)", "neg_runtime"),
    ("runtime Infinity", "inf_runtime"),
    ("negative error (-1.0)", "neg_error"),
    ('error as a JSON string ("0.1")', "str_error"),
]


def _write_space(h: Harness, mode: str, timeout: float) -> tuple[Path, Path]:
    job = h.root / "job.py"
    job.write_text(JOB)
    pids = h.root / f"pids_{mode}.txt"
    space = h.root / "spaces" / f"{mode}.toml"
    space.parent.mkdir(exist_ok=True)
    space.write_text(SPACE.format(job=job, mode=mode, pids=pids, workdir=h.root, timeout=timeout))
    return space, pids


def _bad_trial(results: Path) -> dict[str, str] | None:
    import csv

    bad = {p.parent.name for p in (results / "trials").glob("*/BAD")}
    path = results / "trials.csv"
    if not path.exists():
        return None
    for row in csv.DictReader(path.open()):
        if row.get("number") in bad:
            return row
    return None


def _recommended(results: Path) -> str | None:
    import csv

    path = results / "trials.csv"
    if not path.exists():
        return None
    for row in csv.DictReader(path.open()):
        if (row.get("ranked_by") or "").startswith("recommended"):
            return row.get("number")
    return None


def _proc_table() -> dict[int, tuple[int, str, str, str]]:
    """pid -> (ppid, state, starttime, cmdline) for every process /proc shows."""
    table: dict[int, tuple[int, str, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), fields[0], fields[19], cmd.strip())
    return table


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie nobody reaps is dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        return False


def _descendants(root: int, table: dict[int, tuple[int, str, str, str]]) -> set[int]:
    found: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, *_rest) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _daemon_row(h: Harness) -> list[str]:
    log("jobs: a job that daemonizes a grandchild, trial timeout 2 s")
    space, pids_file = _write_space(h, "daemon", timeout=2)
    out = h.cli(
        ["tune", str(space), "--trials", "1", "--study", "daemon", "--no-confirm", "--no-progress"],
        timeout=240,
    )
    ended = time.monotonic()
    failed, finished, msg = trials_summary(h.work / "results" / "daemon")
    pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
    if not pids:
        return [
            "daemonizing job, timeout 2 s",
            str(out.rc),
            out.line,
            f"{failed} failed of {finished}: {msg}",
            "-",
            "no grandchild pid written",
        ]
    outlived: dict[int, float | None] = dict.fromkeys(pids)
    deadline = ended + 60
    while time.monotonic() < deadline and any(v is None for v in outlived.values()):
        for pid, v in outlived.items():
            if v is None and not _alive(pid):
                outlived[pid] = time.monotonic() - ended
        time.sleep(0.25)
    for pid, v in outlived.items():
        if v is None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    worst = max((60.0 if v is None else v) for v in outlived.values())
    text = (
        ">= 60 s (still alive, killed)"
        if any(v is None for v in outlived.values())
        else f"{worst:.1f} s"
    )
    return [
        "daemonizing job, timeout 2 s",
        str(out.rc),
        out.line,
        f"{failed} failed of {finished}: {msg}",
        "-",
        f"{len(pids)} grandchild(ren); outlived the tune command by {text}",
    ]


def _killed_driver_row(h: Harness) -> list[str]:
    log("jobs: SIGKILL a driver with Ray workers")
    label = "driver SIGKILLed (--workers 2)"
    cmd = [
        sys.executable,
        "-m",
        "fusiontune",
        "tune",
        "search_spaces/mlp.toml",
        "--workers",
        "2",
        "--trials",
        "50",
        "--study",
        "leftovers",
        "--no-progress",
    ]
    err_path = h.root / "leftovers.err"
    with err_path.open("w") as err:
        driver = subprocess.Popen(
            cmd,
            cwd=h.work,
            env=h.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    up_since = time.monotonic()
    tracked: dict[int, str] = {}  # pid -> starttime, every descendant seen while the driver lived
    sessions: set[str] = set()
    ray_up = False
    while time.monotonic() - up_since < 60 and driver.poll() is None:
        table = _proc_table()
        for pid in _descendants(driver.pid, table):
            tracked[pid] = table[pid][2]
            sessions.update(re.findall(r"/tmp/ray/session_[\w.-]+", table[pid][3]))
            if "raylet" in table[pid][3]:
                ray_up = True
        if ray_up and sessions:
            break
        time.sleep(0.5)
    if not ray_up:
        _killpg(driver.pid)
        driver.wait()
        return [
            label,
            "-",
            first_line(err_path.read_text()),
            "-",
            "-",
            "not measured: no raylet child within 60 s",
        ]
    time.sleep(2)  # let the workers start too
    table = _proc_table()
    for pid in _descendants(driver.pid, table):
        tracked[pid] = table[pid][2]
        sessions.update(re.findall(r"/tmp/ray/session_[\w.-]+", table[pid][3]))
    waited = time.monotonic() - up_since
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    killed = time.monotonic()

    def remaining() -> set[int]:
        table = _proc_table()
        left = {p for p, st in tracked.items() if p in table and table[p][2] == st and _alive(p)}
        for pid, (_pp, state, _st, cmdline) in table.items():
            if state != "Z" and any(s in cmdline for s in sessions):
                left.add(pid)
        left.discard(os.getpid())
        return left

    left = remaining()
    at_kill = len(left)
    gone_after: float | None = None
    while time.monotonic() - killed < 120:
        left = remaining()
        if not left:
            gone_after = time.monotonic() - killed
            break
        time.sleep(0.5)
    names = sorted(
        {_proc_table().get(p, (0, "", "", "?"))[3].split(" ")[0].rsplit("/", 1)[-1] for p in left}
    )
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _killpg(driver.pid)
    what = (
        f"{at_kill} Ray process(es) at the kill; all gone after {gone_after:.1f} s"
        if gone_after is not None
        else f"{at_kill} at the kill; {len(left)} still alive after 120 s ({', '.join(names)}), killed"
    )
    return [
        label,
        "-9",
        first_line(err_path.read_text()),
        "-",
        "-",
        f"{what} (Ray up {waited:.0f} s after start)",
    ]


def table_jobs(h: Harness) -> tuple[list[str], list[list[str]], list[str]]:
    headers = [
        "job",
        "tune rc",
        "tune stderr",
        "bad trial: state / status / error_msg",
        "bad trial recommended?",
        "measured",
    ]
    rows: list[list[str]] = []
    for label, mode in BAD_JOBS:
        log(f"jobs: {label}")
        space, _pids = _write_space(h, mode, timeout=60)
        study = f"job_{mode}"
        out = h.cli(["tune", str(space), "--study", study, "--no-progress"], timeout=240)
        results = h.work / "results" / study
        bad = _bad_trial(results)
        rec = _recommended(results)
        if bad is None:
            rows.append([label, str(out.rc), out.line, "bad configuration never ran", "-", "-"])
            continue
        recorded = " / ".join(
            short(bad.get(k) or "-", 60) for k in ("state", "status", "error_msg")
        )
        runtime = bad.get("median_s") or "-"
        rows.append(
            [
                label,
                str(out.rc),
                out.line,
                recorded,
                "yes"
                if rec == bad.get("number")
                else f"no (trial {rec})"
                if rec
                else "no recommendation",
                f"trial {bad.get('number')}: median_s {runtime}, error {bad.get('error') or '-'},"
                f" feasible {bad.get('feasible') or '-'}, rank {bad.get('rank') or '-'}",
            ]
        )
    rows.append(_daemon_row(h))
    rows.append(_killed_driver_row(h))
    notes = [
        "The job space has two passes (PassA, PassB) and the grid sampler; the bad value is printed"
        " only by the fastest configuration (PassA off, PassB on), so accepting it makes it the"
        " recommendation. Recommendation: the trials.csv row ranked `recommended`.",
    ]
    return headers, rows, notes


# ---- 3. bad input ----------------------------------------------------------------------------------
SKIP_DIRS = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
}


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int]]:
    files: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and (skip is None or Path(dirpath, d) != skip)
        ]
        for name in filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            files[p] = (st.st_mtime_ns, st.st_size)
    return files


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_inputs(h: Harness) -> tuple[list[str], list[list[str]], list[str]]:
    tag = f"{os.getpid()}"
    abs1 = Path(tempfile.gettempdir()) / f"hardening_abs_{tag}"
    abs2 = Path(tempfile.gettempdir()) / f"hardening_abs2_{tag}"
    escape = h.root / "a" / "x"  # where results/../../../x lands from the work folder
    deep = h.work / "deep.cfg"
    deep.write_text("[" * 100000)
    empty = h.work / "empty.db"
    empty.write_bytes(b"")
    empty_dir = h.work / "empty_results"
    empty_dir.mkdir()
    (empty_dir / "study.db").write_bytes(b"")
    foreign_dir = h.work / "foreign"
    foreign_dir.mkdir()
    foreign = foreign_dir / "study.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('ada'), ('grace')")
    con.commit()
    con.close()
    foreign_hash = _digest(foreign)
    mlp = "search_spaces/mlp.toml"
    bert = "search_spaces/models/bert_encoder.onnx"
    scenarios: list[tuple[str, list[str], list[Path]]] = [
        (
            "tune --study ../../../x",
            [
                "tune",
                mlp,
                "--study",
                "../../../x",
                "--trials",
                "2",
                "--workers",
                "0",
                "--no-confirm",
                "--no-progress",
            ],
            [escape],
        ),
        (
            "tune --study /tmp/abs",
            [
                "tune",
                mlp,
                "--study",
                str(abs1),
                "--trials",
                "2",
                "--workers",
                "0",
                "--no-confirm",
                "--no-progress",
            ],
            [abs1],
        ),
        ("bisect --name /tmp/abs2", ["bisect", mlp, "--name", str(abs2)], [abs2]),
        ("run mlp --repeat -3", ["run", "mlp", "--repeat", "-3"], []),
        ("run mlp --repeat 0", ["run", "mlp", "--repeat", "0"], []),
        ("run mlp --size batch=100000000", ["run", "mlp", "--size", "batch=100000000"], []),
        ("run mlp --size batch=0", ["run", "mlp", "--size", "batch=0"], []),
        ("run bert_encoder.onnx --dim batch=0", ["run", bert, "--dim", "batch=0"], []),
        ("run mlp --config deep.cfg ('['*100000)", ["run", "mlp", "--config", "deep.cfg"], []),
        (
            "tune --trials -1",
            [
                "tune",
                mlp,
                "--trials",
                "-1",
                "--workers",
                "0",
                "--study",
                "neg_trials",
                "--no-confirm",
                "--no-progress",
            ],
            [],
        ),
        (
            "tune --workers -2",
            [
                "tune",
                mlp,
                "--workers",
                "-2",
                "--trials",
                "2",
                "--study",
                "neg_workers",
                "--no-confirm",
                "--no-progress",
            ],
            [],
        ),
        ("bisect --bound -1", ["bisect", mlp, "--bound", "-1", "--name", "neg_bound"], []),
        ("report <empty file>", ["report", str(empty)], []),
        ("report <dir with empty study.db>", ["report", str(empty_dir)], []),
        ("report <dir with foreign SQLite study.db>", ["report", str(foreign_dir)], []),
        ("fusiontune --version", ["--version"], []),
        ("fusiontune run --help", ["run", "--help"], []),
    ]
    headers = [
        "input",
        "rc",
        "stderr (first line or traceback)",
        "seconds",
        "written outside temp dir",
        "note",
    ]
    rows: list[list[str]] = []
    for label, args, watch in scenarios:
        log(f"inputs: {label}")
        before_checkout = snapshot(h.checkout)
        before_tmp = snapshot(h.root, skip=h.work)
        out = h.cli(args, timeout=240)
        after_checkout = snapshot(h.checkout)
        after_tmp = snapshot(h.root, skip=h.work)
        changed = sorted(
            {
                p
                for p in set(before_checkout) | set(after_checkout)
                if before_checkout.get(p) != after_checkout.get(p)
            }
        )
        outside = [f"checkout: {os.path.relpath(p, h.checkout)}" for p in changed[:3]]
        if len(changed) > 3:
            outside.append(f"... {len(changed)} files in the checkout")
        escaped = sorted(
            p
            for p in set(before_tmp) | set(after_tmp)
            if before_tmp.get(p) != after_tmp.get(p)
            and not p.startswith(str(h.cache))
            and "cache_" not in p
        )
        if escaped:
            outside.append(
                f"{os.path.relpath(escaped[0], h.work)} (+{len(escaped) - 1} files),"
                " outside the work folder"
            )
        for path in watch:
            if path.exists() and not str(path).startswith(str(h.root)):
                outside.append(f"{path} created")
        note = ""
        if label.startswith("fusiontune --version"):
            lines = (out.stdout + out.stderr).strip().splitlines()
            note = f"output: {short(lines[0], 60)}" if lines else ""
        elif label.startswith("fusiontune run --help"):
            names = (
                "mindspore_basic",
                "mindspore_composite",
                "transformer_block",
                "llama_block",
                "resnet_cnn",
            )
            listed = [n for n in names if n in out.stdout]
            note = f"lists workloads: {'yes' if len(listed) >= 2 else 'no'}"
        elif "empty study.db" in label:
            size = (empty_dir / "study.db").stat().st_size
            note = (
                f"empty study.db bytes changed: {'yes (now ' + str(size) + ' B)' if size else 'no'}"
            )
        elif "foreign" in label:
            note = (
                f"foreign db bytes changed: {'yes' if _digest(foreign) != foreign_hash else 'no'}"
            )
        elif out.rc == 0 and args[0] == "run":
            note = (
                f"max_rel {max_rel(out)}"
                if "--json" in args
                else short(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "", 60)
            )
        elif out.rc == 0 and args[0] == "tune":
            note = short(out.stdout.strip().splitlines()[0] if out.stdout.strip() else "", 70)
        rows.append(
            [
                label,
                str(out.rc),
                out.line,
                f"{out.seconds:.1f}",
                "; ".join(outside) if outside else "no",
                note,
            ]
        )
        for path in watch:
            if path.exists() and not str(path).startswith(str(h.root)):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    for p in (abs1, abs2):
        if p.exists():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    notes = [
        "/tmp/abs and /tmp/abs2 are spelled /tmp/hardening_abs_<pid> and /tmp/hardening_abs2_<pid>"
        " (removed afterwards). The checkout is compared file by file (mtime, size; __pycache__,"
        " .git, .venv skipped) before and after each command.",
    ]
    return headers, rows, notes


# ---- output ----------------------------------------------------------------------------------------
def render(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:

        def cell(x: str) -> str:
            return str(x).replace("|", "\\|").replace("\n", " ")

        lines = [
            "| " + " | ".join(cell(c) for c in headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
        ]
        lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]
    fmt_row = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt_row(headers), fmt_row(["-" * w for w in widths]), *map(fmt_row, rows)])


TABLES = {
    "corruption": ("1. Corrupted kernel cache", table_corruption),
    "jobs": ("2. Misbehaving jobs and drivers", table_jobs),
    "inputs": ("3. Bad input", table_inputs),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkout", type=Path, default=REPO, help="the checkout to measure (default: this one)"
    )
    parser.add_argument("--only", choices=sorted(TABLES), help="one table only")
    parser.add_argument("--markdown", action="store_true", help="markdown tables")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / "fusiontune" / "__main__.py").exists():
        parser.error(f"{checkout}: not a fusiontune checkout")
    root = Path(tempfile.mkdtemp(prefix="hardening_"))
    start = time.monotonic()
    rev = (
        subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        or "?"
    )
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    out: list[str] = []
    heading = "## " if args.markdown else ""
    out.append(
        f"{heading}fusiontune hardening: {checkout} at {rev}{' (modified)' if dirty else ''}"
    )
    try:
        for name, (title, build) in TABLES.items():
            if args.only and name != args.only:
                continue
            h = Harness(checkout, root / name)
            t0 = time.monotonic()
            try:
                headers, rows, notes = build(h)
            except Exception as e:  # a table that cannot run says so and the others still run
                headers, rows, notes = ["table"], [[f"not measured: {type(e).__name__}: {e}"]], []
            out.append("")
            out.append(f"{'### ' if args.markdown else ''}{title} ({time.monotonic() - t0:.0f} s)")
            out.append("")
            out.append(render(headers, rows, args.markdown))
            for note in notes:
                out.append("")
                out.append(f"_{note}_" if args.markdown else note)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            log(f"kept {root}")
    out.append("")
    out.append(f"total {time.monotonic() - start:.0f} s")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
