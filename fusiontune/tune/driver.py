"""Tune a search space from start to finish: sweep, confirm the best, write the report.

:func:`tune_command` (``fusiontune tune SPACE``) loads and validates the space, opens the study's
storage (before any worker starts, so a bad URL costs nothing), asks
:func:`fusiontune.tune.factory.create_evaluator` for the evaluator (in process, Ray actors, a
replayed study, or the user's job for a command target, each request in
``results/<study>/trials/<n>/``), runs the optuna loop, measures the top k again against the
defaults, rebuilds the report from the database, and prints the ranked top 10, every path it
wrote, and the peak resident memory of the whole run.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusiontune.errors import UserError

if TYPE_CHECKING:
    from fusiontune.workloads import Workload
    from fusiontune.workloads.space import SearchSpace

MEMORY_GOAL_BYTES = 4 * 10**9
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class TuneOptions:
    """What a tuning run is asked to do; None means the space's own setting.

    Attributes:
        space: the search space file (``search_spaces/*.toml``).
        trials: total finished trials to reach (>= 1).
        timeout_s: wall-time budget in seconds (> 0).
        runs: a budget of job runs for this call (a command target, >= 1): with racing, the
            runs a raced-out trial saves pay for new trials (set ``trials`` above what the runs
            pay for without racing); the sweep stops at whichever budget comes first.
        workers: 0 evaluates in this process; K >= 1 uses K Ray workers.
        ray_address: join this running Ray cluster instead of starting one.
        storage: the study's SQLAlchemy URL (default ``sqlite:///results/<study>/study.db``).
        study: the study name, which is also the folder ``results/<study>/``.
        sampler: tpe, fusion, random, grid or nsga2.
        seed: the sampler's seed (>= 0).
        top_k: configurations measured again at the end (>= 0).
        confirm: measure the top k again (False skips the confirmation).
        replay: answer from a recorded ``study.db`` (or URL) instead of measuring.
        progress: show a progress bar.
    """

    space: Path
    trials: int | None = None
    timeout_s: float | None = None
    runs: int | None = None
    workers: int | None = None
    ray_address: str | None = None
    storage: str | None = None
    study: str | None = None
    sampler: str | None = None
    seed: int | None = None
    top_k: int | None = None
    confirm: bool = True
    replay: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        from fusiontune.workloads.space import STUDY_NAME_RULE, is_study_name

        for name, low in (("trials", 1), ("runs", 1), ("workers", 0), ("seed", 0), ("top_k", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise UserError(f"{name} must be >= {low}, got {value}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UserError(f"timeout must be a positive duration, got {self.timeout_s} s")
        if self.study is not None and not is_study_name(self.study):
            raise UserError(f"study {self.study!r}: not a study name ({STUDY_NAME_RULE})")


def tune_command(options: TuneOptions) -> int:
    """Sweep, confirm and report one search space.

    Args:
        options: the run's options (see :class:`TuneOptions`).

    Returns:
        The exit code: 0, or 130 when stopped by a signal (the study is kept; the same call
        continues it).

    Raises:
        UserError: a bad space, option, storage URL or sampler (before any worker starts).
    """
    from fusiontune.tune._storage import quiet_optuna
    from fusiontune.tune.samplers import SAMPLERS
    from fusiontune.tune.study import default_storage_url
    from fusiontune.workloads.space import load_space

    quiet_optuna()
    space = load_space(options.space)
    if options.runs is not None and space.target is None:
        raise UserError(
            f"{options.space}: runs budgets job runs of a command target; this space measures"
            f" the built-in workload {space.workload!r} (use trials or timeout)"
        )
    n_trials = space.trials if options.trials is None else options.trials
    if n_trials < 1:
        raise UserError(f"trials must be at least 1, got {n_trials}")
    timeout_s = space.timeout_s if options.timeout_s is None else options.timeout_s
    workers = space.workers if options.workers is None else options.workers
    if workers < 0:
        raise UserError(f"workers must be 0 (in process) or more, got {workers}")
    if options.sampler is not None and options.sampler not in SAMPLERS:
        raise UserError(f"sampler {options.sampler}: unknown (known: {', '.join(SAMPLERS)})")
    study_name = options.study or space.name
    results_dir = Path("results") / study_name
    storage_url = options.storage or default_storage_url(study_name)
    top_k = space.top_k if options.top_k is None else options.top_k
    memory = PeakMemory()
    memory.start()
    try:
        return _tune(
            options,
            space,
            n_trials,
            timeout_s,
            workers,
            study_name,
            results_dir,
            storage_url,
            top_k,
            memory,
        )
    finally:
        memory.stop()  # idempotent: the sampler thread never outlives the command


def _tune(
    options: TuneOptions,
    space: SearchSpace,
    n_trials: int,
    timeout_s: float | None,
    workers: int,
    study_name: str,
    results_dir: Path,
    storage_url: str,
    top_k: int,
    memory: PeakMemory,
) -> int:
    from fusiontune.tune._storage import open_storage
    from fusiontune.tune.factory import create_evaluator
    from fusiontune.tune.samplers import make_sampler
    from fusiontune.tune.study import STOP_INTERRUPTED, run_tune, trial_constraint

    # Everything that can be refused is checked before any worker starts.
    seed = space.seed if options.seed is None else options.seed
    sampler_name = options.sampler or space.sampler
    make_sampler(sampler_name, space, seed, n_trials, trial_constraint)
    if sampler_name == "fusion":  # its prior knowledge, said once (the factory reads the file)
        from fusiontune.tune.fusion_sampler import space_culprits

        culprits = space_culprits(space)
        if culprits:
            print(
                f"fusion sampler: {', '.join(culprits)} (the culprits of"
                f" results/{space.name}/bisect.json) are taken to break the bound"
            )
    open_storage(storage_url)
    created = create_evaluator(
        space,
        workers=workers,
        ray_address=options.ray_address,
        replay=options.replay,
        base_dir=results_dir / "trials",
    )
    evaluator, workload = created.evaluator, created.workload
    started = time.perf_counter()
    try:
        result = run_tune(
            space,
            evaluator,
            storage_url,
            study_name,
            n_trials,
            timeout_s=timeout_s,
            sampler=options.sampler,
            seed=seed,
            batch_size=max(1, workers) if not options.replay else 1,
            progress=options.progress,
            max_runs=options.runs,
        )
    except KeyboardInterrupt:
        print(
            "aborted: the trials in flight were marked failed; run the same command to continue",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        evaluator.close()  # frees the workers' cores for the confirmation
    print(
        f"study {result.study_name}: {result.n_finished} trials finished ({result.n_new} in this"
        f" run, {time.perf_counter() - started:.0f} s), stopped on {result.stopped_reason};"
        f" storage {result.storage_url}"
    )
    interrupted = result.stopped_reason == STOP_INTERRUPTED
    try:
        # One writer of results/<study>/ at a time: drivers sharing the study take turns, and
        # the later ones reuse a confirmation that already covers every finished trial.
        with results_lock(results_dir):
            if interrupted:
                print(f"interrupted: run the same command again to continue to {n_trials} trials")
            elif not options.confirm:
                print("confirmation skipped (--no-confirm)")
            elif options.replay:
                print("confirmation skipped: replayed results are not measurements")
            elif not _confirmation_is_current(storage_url, study_name):
                _confirm(space, storage_url, study_name, workload, top_k, results_dir)
            # The recommended configuration's kernels are timed where its confirmation was:
            # in this process, on a built-in workload or ONNX model (a job has no kernels).
            profile = not interrupted and options.confirm and not options.replay
            paths = _report(results_dir, storage_url, study_name, profile and space.target is None)
    except KeyboardInterrupt:
        print(
            "aborted during the confirmation or the report; `fusiontune report` rebuilds it",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print("wrote:")
    for path in paths:
        print(f"  {path}")
    peak, processes, scope = memory.stop()
    goal = "within" if peak < MEMORY_GOAL_BYTES else "ABOVE"
    print(
        f"peak resident memory: {peak / 2**30:.2f} GiB ({scope}, {processes} process(es));"
        f" {goal} the 4 GB goal"
    )
    return EXIT_INTERRUPTED if interrupted else 0


@contextmanager
def results_lock(results_dir: Path) -> Iterator[None]:
    """Hold ``results/<study>/.lock`` (an ``flock``, released if the process dies) while writing."""
    from fusiontune.tune._storage import file_lock

    with file_lock(results_dir / ".lock"):
        yield


def _confirmation_is_current(storage_url: str, study_name: str) -> bool:
    """Another driver already confirmed every finished trial of the study: say so, reuse it."""
    import optuna

    from fusiontune.tune.confirm import format_confirmation
    from fusiontune.tune.store import StudyStore

    store = StudyStore(optuna.load_study(study_name=study_name, storage=storage_url))
    confirmation = store.confirmation()
    if confirmation is None or confirmation.finished != store.count_finished():
        return False
    print(
        f"confirmation of all {confirmation.finished} trials already recorded (by another driver): reused"
    )
    print(format_confirmation(confirmation))
    return True


def _confirm(
    space: SearchSpace,
    storage_url: str,
    study_name: str,
    workload: Workload | None,
    top_k: int,
    results_dir: Path,
) -> None:
    import optuna

    from fusiontune.tune.confirm import confirm
    from fusiontune.workloads.onnx_model import space_workload

    study = optuna.load_study(study_name=study_name, storage=storage_url)
    if space.target is not None:  # the user's job: run it again, here
        from fusiontune.tune.command_confirm import confirm_command

        confirm_command(study, space, results_dir / "confirm", top_k=top_k)
        return
    if workload is None:
        workload = space_workload(space)
    confirm(study, workload, space, top_k=top_k)


def _report(
    results_dir: Path, storage_url: str, study_name: str, profile: bool = False
) -> list[Path]:
    from fusiontune.report import format_top, load_study_frame
    from fusiontune.report.build import write_report

    try:
        built = write_report(
            results_dir, storage_url=storage_url, study_name=study_name, profile=profile
        )
    except UserError as e:
        if not profile:
            raise
        # The profile is an extra: the sweep's report is written without it (nothing is lost).
        print(f"no kernel profile in the report: {e}")
        built = write_report(results_dir, storage_url=storage_url, study_name=study_name)
    frame = load_study_frame(storage_url, study_name)
    print(format_top(frame, n=10))
    for line in built.apply_lines:
        print(line)
    db = _sqlite_path(storage_url)
    return ([db] if db is not None and db not in built.paths else []) + list(built.paths)


def _sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


class PeakMemory:
    """The peak of the summed resident memory of this process and all its descendants.

    A thread samples every ``interval_s``: the driver, and every process it started directly or
    not (a local Ray cluster's raylet, GCS and workers included). Workers of a cluster joined
    with ``--ray-address`` run elsewhere and are not counted. RSS counts shared pages once per
    process, so the sum is an upper bound. Without psutil, the kernel's per-process peaks
    (``getrusage``) of the driver and of its largest finished child are added instead.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import psutil

            self._me: Any = psutil.Process(os.getpid())
        except ImportError:
            self._me = None

    def start(self) -> None:
        if self._me is None:
            return
        self._thread = threading.Thread(target=self._run, name="fusiontune-memory", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        total = self._me.memory_info().rss
        for child in self._me.children(recursive=True):
            try:
                total += child.memory_info().rss
                self.pids.add(child.pid)
            except Exception:  # it exited between the listing and the reading
                continue
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while True:
            try:
                self._sample()
            except Exception:
                pass
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> tuple[int, int, str]:
        """(peak bytes, processes counted, what was counted)."""
        self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if self._me is None:
            children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
            return (
                self_peak + children,
                1 + (children > 0),
                "driver peak + largest child peak (getrusage)",
            )
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return (
            max(self.peak, self_peak),
            1 + len(self.pids),
            "driver and every process it started, summed RSS",
        )
