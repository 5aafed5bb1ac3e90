"""Fault injection: kill drivers and workers, run drivers side by side, and count what the study kept.

Every scenario runs the real ``fusiontune tune`` command line (``--no-progress``) on a small search
space (the 4x4 ``mindspore_custom_op`` network, each measurement stretched to a few tens of ms so
that a sweep lasts seconds), and every figure is read back afterwards from the study's storage with
plain optuna and from the files under ``results/<study>/``; nothing is assumed.

Scenarios:

- ``kill -9 driver``: SIGKILL the driver at random points of its sweep (a seeded random delay after
  the run's first new trial appears in the storage), resume with the same command after each kill,
  then kill it once more during the confirmation (after it printed that the sweep stopped on its
  budget), and resume it to the end.
- ``kill -9 Ray worker``: ``--workers 2``; SIGKILL one ``TuneWorker`` actor process (a descendant of
  the driver whose command line names it) in the middle of the sweep; the driver must go on.
- ``3 drivers, SQLite`` / ``3 drivers, PostgreSQL``: three drivers started at the same moment on one
  empty database, in one working directory (one ``results/<study>/``). PostgreSQL is a throwaway
  server started from the machine's binaries (``benchmarks/_postgres.py``) unless ``--postgres URL``
  names one (then the scenario uses a new study name in that database, which need not be empty).

Columns: ``finished`` (COMPLETE + FAIL + PRUNED trials), ``lost`` (FAIL trials a fault caused: marked
``interrupted``, or whose result says the worker died / nothing recorded), ``≤ in flight`` (the most
trials a fault can take: the batch of the driver, one per worker, times the faults), ``duplicated``
(finished trials beyond the budget, plus every baseline role enqueued more than once), ``crashes``
(exits other than the injected kills that are not 0, and any traceback on stderr), ``recs``
(distinct configurations among the recommended ``best_config.json`` in ``results/<study>/`` and the
one ``fusiontune report`` rebuilds from the storage into a fresh folder). PASS: finished equals the
budget, lost at most the trials in flight, nothing duplicated, no crash, no trial left RUNNING and
one recommendation.

    .venv/bin/python benchmarks/fault_injection.py [--quick] [--seed S] [--kills N]
        [--postgres URL] [--only NAME[,NAME]] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).parent / "fusiontune"
FUSIONTUNE = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "fusiontune"]
FAULT_STATUSES = ("worker died", "not recorded")
SCENARIOS = ("kill", "worker", "sqlite", "postgres")

SPACE = """\
# fault_injection.py: the 4x4 custom-op network, each measurement stretched to ~{ms} ms x {repeat}.
[workload]
name = "mindspore_custom_op"

[passes]
search = ["TbeEltwiseFusionPass", "CompositeOpsFusionPass", "TbeMultiOutputFusionPass", "TbeEltwiseSplitFusionPass"]

[split_points]
"TbeEltwiseSplitFusionPass.cut" = [0, 1, 2, 3]

[accuracy]
metric = "max_rel"
bound = 1e-6

[measure]
warmup = 0
repeat = {repeat}
min_repeat_ms = {ms}

[search]
sampler = "tpe"
trials = 40
seed = 0
top_k = 2
workers = 0
"""


# ---- processes ----------------------------------------------------------------------------------
@dataclass
class Proc:
    """One ``fusiontune`` process of a scenario, and how it ended."""

    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def kill(self) -> bool:
        """SIGKILL (``kill -9``); False when it had exited already."""
        if self.popen.poll() is not None:
            return False
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self.killed = True
        return True

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            with self.err.open("a") as f:
                f.write(f"\n[fault_injection] killed: still running after {timeout_s:.0f} s\n")
            return self.popen.returncode


class Launcher:
    """Starts ``fusiontune tune`` processes in one working directory, output to numbered logs."""

    def __init__(self, workdir: Path, argv: Sequence[str]) -> None:
        self.workdir = workdir
        self.argv = list(argv)
        self.procs: list[Proc] = []

    def start(self) -> Proc:
        n = len(self.procs)
        out, err = self.workdir / f"driver{n}.out", self.workdir / f"driver{n}.err"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with out.open("wb") as o, err.open("wb") as e:
            popen = subprocess.Popen(
                [*FUSIONTUNE, *self.argv], cwd=self.workdir, env=env, stdout=o, stderr=e
            )
        proc = Proc(popen, out, err)
        self.procs.append(proc)
        return proc


def tune_argv(study: str, budget: int, workers: int, storage: str | None) -> list[str]:
    argv = ["tune", "space.toml", "--study", study, "--trials", str(budget)]
    argv += ["--workers", str(workers), "--no-progress"]
    return argv + (["--storage", storage] if storage else [])


# ---- reading the storage ------------------------------------------------------------------------
def trial_count(url: str) -> int:
    """Trials in the storage (any state, any study), 0 while it does not exist yet."""
    import sqlalchemy

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return 0
    try:
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as c:
                return int(c.exec_driver_sql("SELECT COUNT(*) FROM trials").scalar() or 0)
        finally:
            engine.dispose()
    except Exception:  # no tables yet, or locked for a moment
        return 0


def wait_for(predicate: Callable[[], bool], timeout_s: float, proc: Proc | None = None) -> bool:
    """Poll ``predicate`` every 50 ms; False on timeout or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.popen.poll() is not None:
            return False
        time.sleep(0.05)
    return False


# ---- the audit ----------------------------------------------------------------------------------
@dataclass
class Row:
    """One scenario's figures, all read back from the storage and the files."""

    scenario: str
    budget: int
    finished: int = 0
    lost: int = 0
    in_flight: int = 0
    duplicated: int = 0
    crashes: int = 0
    recommendations: int = 0
    running: int = 0
    faults: str = ""
    notes: list[str] = field(default_factory=list)
    skipped: str = ""
    over_batch: int = 0  # killed drivers that lost more than their batch, or losses of live ones

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "SKIP"
        ok = (
            self.finished == self.budget
            and self.lost <= self.in_flight
            and self.over_batch == 0
            and self.duplicated == 0
            and self.crashes == 0
            and self.running == 0
            and self.recommendations == 1
        )
        return "PASS" if ok else "FAIL"


def is_lost(trial: object) -> bool:
    """A FAIL trial that a fault took: interrupted, or a worker that died, or never recorded."""
    from optuna.trial import TrialState

    if trial.state != TrialState.FAIL:  # type: ignore[attr-defined]
        return False
    attrs = trial.user_attrs  # type: ignore[attr-defined]
    if "interrupted" in attrs:
        return True
    result = attrs.get("result") if isinstance(attrs.get("result"), dict) else {}
    status = str(result.get("status", ""))
    return status in FAULT_STATUSES or str(result.get("error_msg", "")).startswith("worker died")


def audit(
    row: Row,
    url: str,
    study_name: str,
    workdir: Path,
    procs: Sequence[Proc],
    in_flight: int,
    per_killed_driver: int | None = None,
) -> Row:
    """Fill ``row`` from the storage at ``url``, the processes' exits and ``results/<study>/``.

    Args:
        in_flight: the most trials the injected faults can have taken, all together.
        per_killed_driver: the most one killed driver can lose (its batch); checked per driver
            from the identity each trial is stamped with, when given.
    """
    import optuna
    from optuna.trial import TrialState

    row.in_flight = in_flight
    for p in procs:
        err = p.stderr()
        code = p.popen.returncode
        if (not p.killed and code != 0) or "Traceback" in err:
            row.crashes += 1
            last = [line for line in err.strip().splitlines() if line.strip()][-1:] or [
                "(no stderr)"
            ]
            row.notes.append(f"driver pid {p.pid} exit {code}: {last[0][:300]}")
    try:
        study = optuna.load_study(study_name=study_name, storage=url)
        trials = study.get_trials(deepcopy=False)
    except Exception as e:
        row.notes.append(f"the study cannot be loaded: {type(e).__name__}: {e}"[:300])
        return row
    states = Counter(t.state for t in trials)
    row.finished = states[TrialState.COMPLETE] + states[TrialState.FAIL] + states[TrialState.PRUNED]
    row.running = states[TrialState.RUNNING]
    lost = [t.number for t in trials if is_lost(t)]
    row.lost = len(lost)
    roles = Counter(t.user_attrs.get("role") for t in trials if t.user_attrs.get("role"))
    extra_roles = sum(n - 1 for n in roles.values() if n > 1)
    row.duplicated = max(0, row.finished - row.budget) + extra_roles
    if lost:
        row.notes.append(f"lost trials {lost}")
    if per_killed_driver is not None:
        row.over_batch = over_batch(trials, procs, per_killed_driver, row.notes)
    if extra_roles or len(roles) < 2:
        row.notes.append(f"baseline roles {dict(roles)}")
    if row.running:
        row.notes.append(
            f"RUNNING left: {[t.number for t in trials if t.state == TrialState.RUNNING]}"
        )
    other_fail = states[TrialState.FAIL] - row.lost
    if other_fail:
        row.notes.append(f"{other_fail} other FAIL trial(s) (configurations that failed)")
    row.recommendations = count_recommendations(row, url, study_name, workdir)
    return row


def over_batch(
    trials: Sequence[object], procs: Sequence[Proc], batch: int, notes: list[str]
) -> int:
    """Drivers whose lost trials break the bound: a killed one losing more than ``batch``, or a
    live one (never killed) losing any. A lost trial is attributed to the driver that stamped it."""
    from fusiontune.tune._storage import DRIVER_ATTR

    killed = {p.pid for p in procs if p.killed}
    by_pid: Counter[int | None] = Counter()
    for t in trials:
        if is_lost(t):
            stamp = t.system_attrs.get(DRIVER_ATTR)  # type: ignore[attr-defined]
            by_pid[stamp.get("pid") if isinstance(stamp, dict) else None] += 1
    bad = {
        pid: n
        for pid, n in by_pid.items()
        if pid is not None and (n > batch if pid in killed else True)
    }
    if by_pid and killed:
        most = max([n for pid, n in by_pid.items() if pid in killed] or [0])
        notes.append(
            f"lost per killed driver: at most {most} (batch {batch});"
            f" not stamped (killed between ask and stamp): {by_pid.get(None, 0)}"
        )
    if bad:
        notes.append(f"drivers over the bound (pid: lost): {bad}")
    return len(bad)


def count_recommendations(row: Row, url: str, study_name: str, workdir: Path) -> int:
    """Distinct configurations among the folder's ``best_config.json`` and a rebuilt one."""
    written = workdir / "results" / study_name / "best_config.json"
    configs: set[str] = set()
    if written.is_file():
        try:
            configs.add(json.dumps(json.loads(written.read_text()), sort_keys=True))
        except ValueError as e:
            row.notes.append(f"{written.name} is not JSON: {e}")
            return 0
    else:
        row.notes.append(f"no {written.relative_to(workdir)} written")
        return 0
    rebuilt = workdir / "rebuilt"
    shutil.rmtree(rebuilt, ignore_errors=True)
    rebuilt.mkdir()
    proc = subprocess.run(
        [*FUSIONTUNE, "report", str(rebuilt), "--storage", url, "--study", study_name],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 or not (rebuilt / "best_config.json").is_file():
        tail = (proc.stderr.strip().splitlines() or ["no best_config.json"])[-1]
        row.notes.append(f"fusiontune report from the storage failed: {tail[:200]}")
    else:
        configs.add(
            json.dumps(json.loads((rebuilt / "best_config.json").read_text()), sort_keys=True)
        )
    if len(configs) > 1:
        row.notes.append(
            "results/<study>/best_config.json differs from the storage's recommendation"
        )
    return len(configs)


# ---- scenarios ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    quick: bool
    seed: int
    kills: int
    root: Path
    postgres: str | None

    def space(self, workdir: Path, ms: float = 30.0, repeat: int = 4) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "space.toml").write_text(SPACE.format(ms=ms, repeat=repeat))


def scenario_kills(s: Settings) -> Row:
    """SIGKILL the driver at ``s.kills`` random points of the sweep, then once in confirmation.

    The points are trial counts drawn without replacement (seeded) over the budget, at least
    3 (``--quick``; else 4) apart: the driver is killed a random 0-150 ms after the storage holds that many
    trials (or its run's first new one, when the resumed study already holds more), so the kills
    spread over the whole sweep whatever the speed of the machine, and land in a measurement, a
    reuse or the bookkeeping between them. The spacing leaves room for the trials a run finishes
    between reaching its point and the kill, and for the one it loses.
    """
    rng = random.Random(s.seed)
    spacing = 3 if s.quick else 4
    budget = spacing * (2 * s.kills)  # 60 for 10 kills (--quick), 80 otherwise
    workdir, study = s.root / "kill", "fi_kill"
    s.space(workdir)
    url = f"sqlite:///{workdir / 'results' / study / 'study.db'}"
    launcher = Launcher(workdir, tune_argv(study, budget, 0, None))  # the default storage
    row = Row(f"kill -9 driver x{s.kills} + 1 in confirmation", budget)
    points = sorted(spacing * n for n in rng.sample(range(1, 2 * s.kills - 1), s.kills))
    kills = 0
    at: list[int] = []
    for point in points:
        before = trial_count(url)
        proc = launcher.start()
        target = max(point, before + 1)
        if not wait_for(lambda n=target: trial_count(url) >= n, 120, proc):
            proc.wait(120)
            row.notes.append(
                f"the sweep ended before kill {kills + 1} (exit {proc.popen.returncode})"
            )
            break
        time.sleep(rng.uniform(0.0, 0.15))
        if proc.kill():
            kills += 1
            at.append(target)
    row.notes.append(f"sweep kills at trial counts {at}")
    confirm_kills = 0
    # The last run: let the sweep reach its budget, kill it while it confirms, then resume.
    proc = launcher.start()
    stopped = re.compile(r"stopped on ")
    if wait_for(lambda: bool(stopped.search(proc.stdout())), 300, proc):
        time.sleep(rng.uniform(0.05, 0.6))
        out = proc.stdout()
        if proc.kill():
            confirm_kills = 1
            phase = (
                "after the confirmation" if "confirmation:" in out else "during the confirmation"
            )
            row.notes.append(f"confirmation kill landed {phase}")
    else:
        proc.wait(300)
        row.notes.append("no 'stopped on' line: the confirmation kill was not injected")
    final = launcher.start()
    final.wait(600)
    row.faults = f"{kills}+{confirm_kills} kills"
    # --workers 0: the driver measures one trial at a time; after the sweep, none is in flight.
    return audit(row, url, study, workdir, launcher.procs, in_flight=kills, per_killed_driver=1)


def scenario_worker(s: Settings) -> Row:
    """``--workers 2``: SIGKILL one Ray ``TuneWorker`` process in the middle of the sweep."""
    import psutil

    rng = random.Random(s.seed + 1)
    budget, workers = (16, 2) if s.quick else (30, 2)
    workdir, study = s.root / "worker", "fi_worker"
    s.space(workdir, ms=60.0)
    url = f"sqlite:///{workdir / 'results' / study / 'study.db'}"
    launcher = Launcher(workdir, tune_argv(study, budget, workers, None))
    row = Row("kill -9 Ray worker (--workers 2)", budget)
    proc = launcher.start()
    killed = 0
    if wait_for(lambda: trial_count(url) >= 4, 300, proc):
        time.sleep(rng.uniform(0.0, 0.5))
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        actors = [p for p in tree if _cmdline_has(p, "TuneWorker")]
        if actors:
            victim = rng.choice(actors)
            try:
                victim.send_signal(signal.SIGKILL)
                killed = 1
                row.notes.append(f"killed worker pid {victim.pid} of {len(actors)} TuneWorker(s)")
            except psutil.NoSuchProcess:
                row.notes.append("the chosen worker exited before the kill")
        else:
            row.notes.append("no TuneWorker process among the driver's descendants")
    else:
        row.notes.append("the sweep did not start (or ended) before the worker kill")
    proc.wait(600)
    row.faults = f"{killed} worker kill"
    # Each actor measures one request of a batch at a time: a dead worker takes at most one.
    return audit(row, url, study, workdir, launcher.procs, in_flight=killed)


def _cmdline_has(p: object, text: str) -> bool:
    try:
        return text in " ".join(p.cmdline())  # type: ignore[attr-defined]
    except Exception:
        return False


def scenario_concurrent(s: Settings, backend: str, url: str, study: str) -> Row:
    """Three drivers started at once on one study, in one working directory."""
    budget = 12 if s.quick else 30
    workdir = s.root / f"concurrent-{backend}"
    s.space(workdir)
    launcher = Launcher(workdir, tune_argv(study, budget, 0, url))
    row = Row(f"3 drivers, {backend}", budget)
    procs = [launcher.start() for _ in range(3)]
    for p in procs:
        p.wait(600)
    row.faults = "none"
    return audit(row, url, study, workdir, procs, in_flight=0, per_killed_driver=0)


def scenario_postgres(s: Settings) -> tuple[Row, Callable[[], None]]:
    """3 drivers on PostgreSQL: on ``--postgres URL``, else on a throwaway server of our own."""
    if s.postgres:
        study = f"fi_concurrent_{int(time.time())}"
        return scenario_concurrent(s, "PostgreSQL", s.postgres, study), lambda: None
    from _postgres import PostgresServer, ServerUnavailable

    try:
        import psycopg  # noqa: F401

        server = PostgresServer.start()
    except (ImportError, ServerUnavailable) as e:
        row = Row("3 drivers, PostgreSQL", 0, skipped=f"no PostgreSQL server: {e}")
        return row, lambda: None
    url = server.create_database("fault_injection")  # empty: the drivers create the schema
    return scenario_concurrent(s, "PostgreSQL", url, "fi_concurrent"), server.stop


# ---- the table ----------------------------------------------------------------------------------
HEADERS = (
    "scenario",
    "faults",
    "budget",
    "finished",
    "lost",
    "≤ in flight",
    "duplicated",
    "crashes",
    "recs",
    "running",
    "verdict",
)


def format_rows(rows: Sequence[Row]) -> str:
    cells = [
        [
            r.scenario,
            r.faults,
            str(r.budget),
            str(r.finished),
            str(r.lost),
            str(r.in_flight),
            str(r.duplicated),
            str(r.crashes),
            str(r.recommendations),
            str(r.running),
            r.verdict,
        ]
        for r in rows
    ]
    widths = [max(len(c) for c in col) for col in zip(HEADERS, *cells, strict=True)]

    def line(cs: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cs, widths, strict=True)).rstrip()

    out = [line(HEADERS), line(["-" * w for w in widths])] + [line(c) for c in cells]
    for r in rows:
        for note in ([r.skipped] if r.skipped else []) + r.notes:
            out.append(f"  {r.scenario}: {note}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets (a few minutes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    parser.add_argument("--kills", type=int, default=10, help="driver kills during the sweep")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL database to use")
    parser.add_argument("--only", help=f"comma-separated scenarios of {', '.join(SCENARIOS)}")
    parser.add_argument("--keep", type=Path, help="keep the working folders here")
    args = parser.parse_args(argv)
    only = set((args.only or ",".join(SCENARIOS)).split(","))
    if only - set(SCENARIOS):
        parser.error(f"--only: unknown {sorted(only - set(SCENARIOS))} (known: {SCENARIOS})")
    root = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="fusiontune-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    s = Settings(args.quick, args.seed, args.kills, root, args.postgres)
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        for name in SCENARIOS:
            if name not in only:
                continue
            t0 = time.perf_counter()
            if name == "kill":
                rows.append(scenario_kills(s))
            elif name == "worker":
                rows.append(scenario_worker(s))
            elif name == "sqlite":
                url = f"sqlite:///{root / 'concurrent-sqlite.db'}"
                rows.append(scenario_concurrent(s, "SQLite", url, "fi_concurrent"))
            else:
                row, stop = scenario_postgres(s)
                try:
                    rows.append(row)
                finally:
                    stop()
            print(
                f"[{rows[-1].scenario}: {rows[-1].verdict}, {time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(format_rows(rows))
    print(
        f"\n{time.perf_counter() - started:.0f} s in all"
        + (f"; folders kept in {root}" if args.keep else "")
    )
    return 0 if all(r.verdict != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
