"""Windows and their baselines: a speedup is against the defaults measured in the same window.

A window is one ``run_tune`` call over a study (the sweep, or its resumption). The window that
measured a trial is established here without the trial's ``baseline`` attr: from the driver
stamp optuna keeps with the trial (``fusiontune:driver``: the pid of the process that asked it)
and from the trial's completion time against the moment the first driver was killed. A trial
that took another trial's measurement (``reused_from``, same program) was measured where that
trial was.

The first test runs real competing processes (CPU burners, several per core) beside a real driver
process, kills that driver with SIGKILL mid-sweep, stops the burners and resumes in this process
on the quiet machine; its workload (``mlp``, ~1.7 ms for the defaults when quiet) is large enough
for the load to show in its timings. The others run the same space in process, two samples a
measurement (the space's kernels are shared with the first test through the kernel cache).
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
import pytest

from fusiontune.report.tables import pass_effect, searched_params, study_frame
from fusiontune.tune._storage import DRIVER_ATTR
from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.store import Baseline, StudyStore, TrialRecord
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import SearchSpace, load_space

# Dense layers on (256, 512), ~1.7 ms for the defaults on a quiet machine, its kernels parallel
# (so a competitor on any core delays them); its MatMul epilogue passes and row split give nearly
# every sampled configuration a program of its own, so every window measures programs afresh
# (the seed 4 x 4 network has 4 programs: a resumed window would only reuse measurements).
SPACE = """\
[workload]
name = "mlp"
sizes = { batch = 256, hidden = 512 }

[passes]
search = "ALL"

[split_points]
"MatMulRowSplitFusionPass.row_block" = { low = 0, high = 128, step = 32 }
"ConvOutputSplitFusionPass.rows" = 0
"ConvOutputSplitFusionPass.algo" = 0
"ConvOutputSplitFusionPass.orient" = 0

[accuracy]
metric = "max_rel"
bound = 1e-3

[measure]
warmup = {warmup}
repeat = {repeat}
number = 1
min_repeat_ms = {min_repeat_ms}
retries = 0

[search]
sampler = "random"
trials = 12
seed = 0
top_k = 2
workers = 0
"""
# Busy-looping processes per core. With one per core, the medians of the same kernels ranged from
# not slowed at all to 13x slower from one measurement to the next; with three, 8x to 30x slower
# every time.
BURNERS_PER_CORE = 3
# The driver is killed when it starts measuring this trial: trials 0-6 are the enqueued defaults,
# all-off and only:<Pass> trials, so the busy window has measured two sampled trials by then.
KILL_AT_TRIAL = 9
# Trials in the study once resumed: the busy window's, then 6 more (the random sampler starts its
# sequence again in the resumed window, so its first two take the busy window's measurements).
RESUMED_TOTAL = 16


def write_space(
    tmp_path: Path, warmup: int = 0, repeat: int = 2, min_repeat_ms: float = 0.0
) -> SearchSpace:
    path = tmp_path / "space.toml"
    text = SPACE.replace("{warmup}", str(warmup)).replace("{repeat}", str(repeat))
    path.write_text(text.replace("{min_repeat_ms}", repr(min_repeat_ms)))
    return load_space(path)


def load(url: str) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=url)


def measuring_trial(t: TrialRecord) -> int:
    """The trial whose measurement ``t`` carries: itself, or the one it reused."""
    return t.reused_from if t.reused_from is not None else t.number


def driver_pid(study: optuna.Study, number: int) -> int:
    stamp = study.trials[number].system_attrs[DRIVER_ATTR]
    return int(stamp["pid"])


def latest_before(baselines: Sequence[Baseline], window: str, node: str, when: float) -> Baseline:
    """The baseline of ``window`` on ``node`` measured last before ``when``: what a measurement
    taken at ``when`` must be compared with (computed here from the records alone)."""
    pool = [b for b in baselines if b.window == window and b.node == node and b.time <= when]
    assert pool, f"no baseline of window {window} on {node!r} before {when}"
    return max(pool, key=lambda b: b.time)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


# ---- a sweep killed under load, resumed quiet ----------------------------------------------------
class Lines:
    """The lines a process writes to stdout, read by a thread, so a wait can time out."""

    def __init__(self, proc: subprocess.Popen[str], err: Path) -> None:
        self.err = err
        self.queue: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.queue.put(line.strip())
        self.queue.put("")  # EOF

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"the driver said nothing matching in {timeout_s:.0f} s{self._said()}"
                )
            line = self.queue.get(timeout=left)
            if line == "":
                raise AssertionError(
                    f"the driver exited before the trial to kill it at{self._said()}"
                )
            if predicate(line):
                return line

    def _said(self) -> str:
        return "; its stderr ends:\n" + "\n".join(self.err.read_text().splitlines()[-20:])


def burn_cpus() -> list[subprocess.Popen[bytes]]:
    """Busy-looping processes, several per core: real competition for every core."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(BURNERS_PER_CORE * (os.cpu_count() or 1))
    ]


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


@pytest.mark.slow
def test_a_sweep_killed_under_load_and_resumed_quiet_never_mixes_windows(tmp_path):
    # Samples of 20 ms or more span several scheduler slices: a 2 ms call alone may fit in one
    # slice and never see the burners.
    space = write_space(tmp_path, warmup=1, repeat=5, min_repeat_ms=20.0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        from fusiontune.tune.evaluator import LocalEvaluator
        from fusiontune.tune.study import run_tune
        from fusiontune.workloads import make_workload
        from fusiontune.workloads.space import load_space

        space = load_space({space.path!r})
        inner = LocalEvaluator(make_workload(space.workload, **space.sizes), space.measure)

        class Announces:
            def evaluate(self, requests):
                for r in requests:
                    print("measuring", r.trial, flush=True)
                return inner.evaluate(requests)

            def close(self):
                pass

        run_tune(space, Announces(), {url!r}, "s", 100, progress=False)
    """)
    )
    burners = burn_cpus()
    driver: subprocess.Popen[str] | None = None
    try:
        with open(tmp_path / "driver.err", "w") as err:  # what it says, kept for a failure
            driver = subprocess.Popen(
                [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True
            )
        lines = Lines(driver, tmp_path / "driver.err")
        lines.wait_for(lambda line: int(line.removeprefix("measuring ")) >= KILL_AT_TRIAL, 240)
        driver.send_signal(signal.SIGKILL)  # mid-measurement: no handler runs
        driver.wait()
        killed_at = time.time()
    finally:
        stop(burners)
        if driver is not None:
            stop([driver])
    busy_pid = driver.pid
    in_flight = [t.number for t in load(url).get_trials(states=(optuna.trial.TrialState.RUNNING,))]
    assert in_flight, "the driver was not killed mid-measurement"

    time.sleep(1.0)  # the burners' cores settle
    workload = make_workload(space.workload, **space.sizes)
    result = run_tune(
        space, LocalEvaluator(workload, space.measure), url, "s", RESUMED_TOTAL, progress=False
    )
    resumed_at = time.time()

    study = load(url)
    store = StudyStore(study)
    baselines = store.baselines()
    by_id = {b.id: b for b in baselines}
    trials = store.trials()
    quiet = result.window

    # (c) Two windows: the killed one, measured before the kill, and the resumed one, after it.
    windows = {b.window for b in baselines}
    assert quiet in windows and len(windows) == 2, windows
    (busy,) = windows - {quiet}
    assert all(b.time < killed_at for b in baselines if b.window == busy)
    assert all(killed_at < b.time < resumed_at for b in baselines if b.window == quiet)
    for number in in_flight:
        assert trials[number].state == "FAIL" and trials[number].interrupted

    # Which window measured each trial: its driver's pid, checked against its completion time.
    window_of_pid = {busy_pid: busy, os.getpid(): quiet}
    measured = [t for t in trials if t.measured]
    measured_in: dict[int, str] = {}
    for t in measured:
        source = trials[measuring_trial(t)]
        assert source.measured and source.reused_from is None
        pid = driver_pid(study, source.number)
        assert pid in window_of_pid, f"trial {t.number} was asked by an unknown process {pid}"
        window = window_of_pid[pid]
        done = source.datetime_complete
        assert done is not None
        assert (done.timestamp() < killed_at) == (window == busy), f"trial {source.number}'s time"
        measured_in[t.number] = window
    assert {measured_in[t.number] for t in measured if t.reused_from is None} == {busy, quiet}

    # What mixing the windows would have done: the busy defaults against the quiet measurements.
    busy_d = statistics.median(b.defaults_s for b in baselines if b.window == busy)
    quiet_d = statistics.median(b.defaults_s for b in baselines if b.window == quiet)
    quiet_trials = [t for t in measured if measured_in[t.number] == quiet]
    right = statistics.median(quiet_d / t.median_s for t in quiet_trials)
    mixed = statistics.median(busy_d / t.median_s for t in quiet_trials)
    asked_in = {t.number: window_of_pid[driver_pid(study, t.number)] for t in measured}
    carried = [
        t.number for t in measured if asked_in[t.number] == quiet and measured_in[t.number] == busy
    ]
    print(
        f"\nbusy window {busy}: defaults {ms(busy_d)}; quiet window {quiet}: defaults {ms(quiet_d)}"
        f" ({busy_d / quiet_d:.1f}x slower under load)"
        f"\nmedian speedup vs defaults of the {len(quiet_trials)} trials measured quiet:"
        f" {right:.2f}x against their own baseline, {mixed:.2f}x against the busy one"
        f"\n{len(measured) - len(quiet_trials)} trials measured busy, killed in flight: {in_flight};"
        f" asked by the resumed window but reusing a busy measurement (so against the busy"
        f" baseline): {carried}"
    )
    # Whether the load showed only changes what mixing would have cost (the figures above): the
    # checks below hold either way, since windows are told apart by driver and time, not speed.
    # On a shared 2-core machine the scheduler sometimes spares the driver; say so, go on.
    if not busy_d > 1.5 * quiet_d:
        warnings.warn(
            f"the competing load did not show this time: busy defaults {ms(busy_d)}, quiet {ms(quiet_d)}",
            stacklevel=1,
        )

    # (a), (b) Each measured trial names a recorded baseline of the window and node that measured it.
    for t in measured:
        assert t.baseline in by_id, f"trial {t.number}: baseline {t.baseline!r} is not recorded"
        base = by_id[t.baseline]
        assert base.window == measured_in[t.number], (
            f"trial {t.number}, measured in window {measured_in[t.number]}, is compared with"
            f" baseline {base.id} of window {base.window}"
        )
        assert t.result is not None and base.node == t.result.node

    # (d) The table's speedups, recomputed from the Baseline records alone.
    own: dict[int, Baseline] = {}
    for t in measured:
        source = trials[measuring_trial(t)]
        assert source.datetime_complete is not None and t.result is not None
        own[t.number] = latest_before(
            baselines, measured_in[t.number], t.result.node, source.datetime_complete.timestamp()
        )
    frame = study_frame(study).set_index("number")
    for t in trials:
        row = frame.loc[t.number]
        if not t.measured:
            assert math.isnan(row["speedup_vs_defaults"]) and math.isnan(row["speedup_vs_all_off"])
            continue
        base = own[t.number]
        assert row["baseline"] == base.id
        assert row["speedup_vs_defaults"] == pytest.approx(
            base.defaults.median_s / t.median_s, rel=1e-12
        )
        assert row["speedup_vs_all_off"] == pytest.approx(
            base.all_off.median_s / t.median_s, rel=1e-12
        )
        assert row["baseline_defaults_s"] == pytest.approx(base.defaults.median_s, rel=1e-12)
    # The per-pass table is built from those speedups: the same, recomputed.
    effect = pass_effect(frame.reset_index(), searched_params(study)).set_index("pass")
    for name, row in effect.iterrows():
        col = f"pass.{name}"
        speed = {
            state: [
                own[t.number].defaults.median_s / t.median_s
                for t in measured
                if frame.loc[t.number, col] == state
            ]
            for state in ("on", "off")
        }
        assert row["on"] == pytest.approx(statistics.median(speed["on"]), rel=1e-12)
        assert row["off"] == pytest.approx(statistics.median(speed["off"]), rel=1e-12)


# ---- baselines at the start of every window, and at intervals ------------------------------------
@pytest.fixture(scope="module")
def workload():
    return make_workload("mlp", batch=256, hidden=512)


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    return write_space(tmp_path)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_a_resumed_study_measures_its_baselines_again_and_its_trials_point_to_them(
    space, workload, url
):
    first = run_tune(space, LocalEvaluator(workload, space.measure), url, "s", 4, progress=False)
    between = time.time()
    second = run_tune(space, LocalEvaluator(workload, space.measure), url, "s", 8, progress=False)
    store = StudyStore(load(url))
    baselines = store.baselines()
    assert first.window != second.window
    assert {b.window for b in baselines} == {first.window, second.window}
    # The resumed window measured its own at its start, before its first trial.
    resumed = [b for b in baselines if b.window == second.window]
    assert resumed and all(b.time > between and b.finished == 4 for b in resumed)
    trials = store.trials()
    assert len(trials) == 8
    fresh_in: dict[str, int] = {first.window: 0, second.window: 0}
    for t in trials:
        if not t.measured:
            continue
        source = trials[measuring_trial(t)]
        assert source.datetime_complete is not None
        window = first.window if source.datetime_complete.timestamp() < between else second.window
        assert (source.number < 4) == (window == first.window)
        assert by_window(baselines, t.baseline) == window, f"trial {t.number}"
        fresh_in[window] += t.reused_from is None
    assert all(fresh_in.values()), f"measurements per window: {fresh_in}"


def by_window(baselines: Sequence[Baseline], baseline_id: str) -> str:
    found = [b.window for b in baselines if b.id == baseline_id]
    assert len(found) == 1, f"baseline {baseline_id!r} recorded {len(found)} times"
    return found[0]


def test_baselines_are_measured_again_every_baseline_every_trials(space, workload, url):
    every = 3
    spaced = dataclasses.replace(space, baseline_every=every, baseline_minutes=0.0)
    total = 12
    result = run_tune(
        spaced,
        LocalEvaluator(workload, spaced.measure),
        url,
        "s",
        total,
        batch_size=1,
        progress=False,
    )
    store = StudyStore(load(url))
    baselines = store.baselines()
    # One driver, one trial per batch: at its start, then before every every-th trial told.
    assert [b.finished for b in baselines] == list(range(0, total, every))
    assert {b.window for b in baselines} == {result.window}
    trials = store.trials()
    assert len(trials) == total
    for t in trials:
        if not t.measured:
            continue
        source = trials[measuring_trial(t)]
        assert source.datetime_complete is not None and t.result is not None
        expected = latest_before(
            baselines, result.window, t.result.node, source.datetime_complete.timestamp()
        )
        assert t.baseline == expected.id, f"trial {t.number} (measured by trial {source.number})"
        # The same baseline by count: the last one taken with at most its number finished.
        assert expected.finished == max(
            b.finished for b in baselines if b.finished <= source.number
        )
    assert {t.baseline for t in trials if t.measured} == {b.id for b in baselines}


def test_without_baseline_every_a_window_measures_its_baselines_once(space, workload, url):
    spaced = dataclasses.replace(space, baseline_every=0, baseline_minutes=0.0)
    result = run_tune(
        spaced, LocalEvaluator(workload, spaced.measure), url, "s", 6, batch_size=1, progress=False
    )
    baselines = StudyStore(load(url)).baselines()
    assert (
        len(baselines) == 1 and baselines[0].window == result.window and baselines[0].finished == 0
    )
    assert {t.baseline for t in StudyStore(load(url)).trials() if t.measured} == {baselines[0].id}
