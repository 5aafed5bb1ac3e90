"""Sampler benchmark: how close each sampler gets to the exact optimum, and in how many trials.

Two kinds of job, both driven by the real tuning loop (``run_tune``: the enqueued defaults and
all-off baselines, the accuracy constraint, answers reused for a configuration already measured),
so every sampler runs exactly as ``fusiontune tune --sampler NAME`` would:

1. Planted stand-in jobs (default; ``benchmarks/_planted.py``): a family of 8 to 24 switches
   (some with split points) whose runtime is a planted formula (additive gains, pairwise and
   three-way interactions, 1-5% lognormal noise, one or two accuracy culprits), answered by a
   ``PlantedEvaluator``. The exact feasible optimum is known by enumeration.
2. ``--replays``: recorded grids of built-in workloads (``REPLAYS``: seven passes of a small
   ``transformer_block`` and the NormSplit statistics cut, 256 points; seven passes of a small
   ``llama_block``, its attention's key/value block and a MatMul row cut, 1024 points;
   ``--workloads`` picks; ``--quick``: 16 points of a small ``mlp``), each measured once in
   process and recorded to a SQLite study (default ``results/bench_samplers/``; ``--fresh``
   measures again), replayed by a ``ReplayEvaluator``.
   The optimum is the fastest recorded feasible configuration. Record the grid on a quiet
   machine: numba's thread pools slow down by orders of magnitude under competing load.

For every (sampler, job, seed) one run of ``--trials`` trials (default 80) is made; the figures
at 20 and 40 trials are read from its prefix (optuna's samplers do not look ahead, so the prefix
is what a 20- or 40-trial run would have done). "At n trials" counts the study's first n
finished trials, the two baselines included, as ``fusiontune tune --trials n`` does.

What is scored is the recommendation, in two forms: the feasible trial with the best *measured*
median (the sweep's rank 1), and the runtime model's pick, the feasible trial of best posterior
mean (:meth:`FusionSampler.predicted`, fitted to the first n trials; the confirmation shortlists
it); each by its *true*, noise-free runtime (a replay has no noise: the recorded median) against
the optimum. Per sampler, job and recommendation:

- within 1% / within 2%: the share of seeds whose recommendation at 20, 40, 80 trials is within
  1% / 2% of the optimum; exact: the share whose recommendation at the end is an optimum;
- trials to 2%: the first n at which the recommendation is within 2%, median and IQR (nearest
  rank) over the seeds; a seed that never gets there counts as ``trials + 1`` and a median
  among those reads ``>trials``;
- vs random: that median over random's (``<=x`` when random's is censored). Random seldom
  gets within 2% in 80 trials; ``--random-trials N`` runs random N trials (its shares are still
  read at ``--trials``; its model's pick is scored at the checkpoints only, so its trials to 2%
  by the model's pick read as censored), so that its median is known, or censored at N: the
  ratio's bound is then N / 80 times tighter.

``--floor`` adds the noise's limit per planted job: how often a search told the exact terms and
feasible points gets within 1% / 2% from 40 random runs by least squares (an indication of what
one run per trial allows, not a bound on adaptive designs).

Goals (issue 15): within 1% at 40 trials in at least 19 of 20 seeds on every stand-in job with
up to 16 switches; trials to 2% at most 0.35x random's; on the replays never worse than TPE.
A benchmark, not a test: nothing is gated; the goal lines say met / missed.

    .venv/bin/python benchmarks/bench_samplers.py [--quick] [--seeds 20] [--trials 80]
        [--jobs issue12,add8] [--samplers tpe,random] [--random-trials 400] [--jobs-parallel 2]
        [--markdown]
        [--cache FILE] [--replays [--workloads W,...] [--record PATH] [--fresh]]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import optuna
from scipy.stats import binom, norm

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _planted  # noqa: E402
from _planted import PlantedEvaluator, PlantedJob  # noqa: E402

from fusiontune.tune import study as _study  # noqa: E402
from fusiontune.tune.fusion_sampler import FusionSampler  # noqa: E402
from fusiontune.tune.samplers import SAMPLERS  # noqa: E402
from fusiontune.tune.store import TrialRecord  # noqa: E402
from fusiontune.tune.study import run_tune  # noqa: E402
from fusiontune.workloads.space import SearchSpace, grid_size, loads_space  # noqa: E402

TOLERANCES = (0.01, 0.02)
CHECKPOINTS = (20, 40, 80)
REACH = 0.02
GOAL_MET, GOAL_OF = 19, 20  # within 1% at 40 trials in at least 19 of 20 seeds
GOAL_SEEDS = GOAL_MET / GOAL_OF
GOAL_SWITCHES = 16
GOAL_RATIO = 0.35
DEFAULT_EXCLUDED = ("grid", "nsga2")
_EPS = 1e-9

# A trial's trace, in trial-number order: (feasible, measured median_s, true runtime_s, and the
# true runtime_s of the model's pick after this trial: NaN before it has one).
Trace = list[tuple[bool, float, float, float]]
PICKS = ("measured", "model")  # the recommendation: the fastest measurement, the model's pick


# ---- one run --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    """One (sampler, job, seed) run. ``job`` is a PlantedJob, or a replay's record path."""

    sampler: str
    job: PlantedJob | ReplayJob
    seed: int
    trials: int
    model_at: tuple[int, ...] = ()  # the model's pick is scored after these trials only (): all

    @property
    def key(self) -> str:
        at = f"|m{','.join(map(str, self.model_at))}" if self.model_at else ""
        return f"{self.job.name}|{self.sampler}|{self.seed}|{self.trials}{at}"


@dataclasses.dataclass(frozen=True)
class ReplayJob:
    """A recorded grid of a built-in workload, replayed."""

    name: str
    space_toml: str
    record: str
    optimum_s: float
    points: int
    switches: tuple[str, ...]
    noise: float = 0.0

    def space(self) -> SearchSpace:
        return loads_space(self.space_toml, f"<bench_samplers:{self.name}>")


def _key_hash(graph: Any, config: Any, deny: Any = (), train: Any = None) -> str:
    """A stand-in job has no program: its configuration's key stands for it (as for a command)."""
    return str(config.key())


def run_task(task: Task, tmp: str) -> Trace:
    """Run the real tuning loop for one task and read back its trace."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job = task.job
    space = job.space()
    url = f"sqlite:///{Path(tmp) / f'{os.getpid()}_{abs(hash(task.key))}.db'}"
    kwargs: dict[str, Any] = {"sampler": task.sampler, "seed": task.seed, "progress": False}
    try:
        with open(os.devnull, "w") as quiet, mock.patch.object(sys, "stderr", quiet):
            if isinstance(job, ReplayJob):
                from fusiontune.tune.replay import ReplayEvaluator

                evaluator: Any = ReplayEvaluator.from_study(f"sqlite:///{job.record}", job.name)
                run_tune(space, evaluator, url, job.name, task.trials, **kwargs)
            elif job.is_command:
                run_tune(
                    space, PlantedEvaluator(job, task.seed), url, job.name, task.trials, **kwargs
                )
            else:
                with mock.patch.object(_study, "program_hash", _key_hash):
                    evaluator = PlantedEvaluator(job, task.seed)
                    # never read: program_hash is the key
                    workload: Any = SimpleNamespace(graph=None, train=None)
                    run_tune(
                        space, evaluator, url, job.name, task.trials, workload=workload, **kwargs
                    )
        study = optuna.load_study(study_name=job.name, storage=url)
        trace: Trace = []
        trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        records = [TrialRecord.from_trial(t) for t in trials]
        true = [
            (job.true_runtime(t.params) if r.measured else math.nan)
            if isinstance(job, PlantedJob)
            else r.median_s
            for t, r in zip(trials, records, strict=True)
        ]
        model = FusionSampler.for_space(space, seed=0)
        for n, r in enumerate(records, start=1):
            scored = not task.model_at or n in task.model_at
            pick = model_pick(model, trials[:n], records, true) if scored else math.nan
            trace.append((r.feasible, r.median_s, true[n - 1], pick))
        if len(trace) != task.trials:  # a SIGTERM stops run_tune early: not a finished run
            raise RuntimeError(
                f"{task.key}: the study holds {len(trace)} trials, not {task.trials}"
            )
        return trace
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(url[len("sqlite:///") :] + suffix).unlink(missing_ok=True)


def model_pick(
    model: FusionSampler,
    trials: Sequence[Any],
    records: Sequence[TrialRecord],
    true: Sequence[float],
) -> float:
    """The true runtime of the feasible trial with the best posterior mean among ``trials`` (the
    first of :func:`fusiontune.tune.confirm.model_order`), NaN when the model has none."""
    mean = model.predicted(trials)
    feasible = [t.number for t in trials if records[t.number].feasible and t.number in mean]
    if not feasible:
        return math.nan
    return true[min(feasible, key=lambda n: (mean[n], n))]


def _run_task_tmp(task: Task) -> tuple[Task, Trace, float]:
    t0 = time.perf_counter()
    tmp = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench_samplers_") as d:
        return task, run_task(task, d), time.perf_counter() - t0


def run_tasks(tasks: Sequence[Task], parallel: int, cache: Path | None) -> dict[str, Trace]:
    """Every task's trace, from the cache when it holds the task, else run (in parallel)."""
    traces: dict[str, Trace] = {}
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                finished = len(row["trace"]) == int(row["key"].split("|")[3])
                if finished and all(len(step) == 4 for step in row["trace"]):
                    traces[row["key"]] = [
                        (bool(f), _float(m), _float(t), _float(p)) for f, m, t, p in row["trace"]
                    ]
    todo = [t for t in tasks if t.key not in traces]
    # Seed by seed (a cache cut short holds whole seeds of every job), the largest spaces first.
    todo.sort(key=lambda t: (t.seed, -len(t.job.switches), t.sampler))
    if todo:
        print(f"running {len(todo)} of {len(tasks)} runs on {parallel} processes", file=sys.stderr)
    out = cache.open("a") if cache is not None else None
    t0 = time.perf_counter()
    try:
        results: Iterable[tuple[Task, Trace, float]]
        if parallel > 1 and len(todo) > 1:
            import multiprocessing

            pool = multiprocessing.get_context("fork").Pool(parallel)
            results = pool.imap_unordered(_run_task_tmp, todo, chunksize=1)
        else:
            pool = None
            results = map(_run_task_tmp, todo)
        for i, (task, trace, seconds) in enumerate(results, start=1):
            traces[task.key] = trace
            if out is not None:
                row = {
                    "key": task.key,
                    "trace": [[f, _num(m), _num(t), _num(p)] for f, m, t, p in trace],
                }
                out.write(json.dumps(row) + "\n")
                out.flush()
            if i % 20 == 0 or i == len(todo):
                print(
                    f"  {i}/{len(todo)} runs, {time.perf_counter() - t0:.0f} s"
                    f" (last: {task.key}, {seconds:.1f} s)",
                    file=sys.stderr,
                )
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        if out is not None:
            out.close()
    return traces


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _float(x: float | None) -> float:
    return math.nan if x is None else float(x)


# ---- scoring --------------------------------------------------------------------------------
def recommendation_ratios(trace: Trace, optimum_s: float, pick: str = "measured") -> list[float]:
    """After each trial, the true runtime of the recommendation over the optimum: the
    best-measured feasible trial (``measured``), or the model's pick (``model``)."""
    if pick == "model":
        return [p / optimum_s if math.isfinite(p) else math.inf for *_, p in trace]
    out, best = [], (math.inf, math.inf)
    for feasible, measured, true_s, _ in trace:
        if feasible and measured < best[0]:
            best = (measured, true_s)
        out.append(best[1] / optimum_s)
    return out


@dataclasses.dataclass(frozen=True)
class Score:
    """One sampler on one job, over its seeds."""

    seeds: int
    trials: int
    within: dict[tuple[float, int], int]  # (tolerance, checkpoint) -> seeds within
    exact: int
    reach: list[int | None]  # trials to within REACH, per seed
    horizon: int = 0  # the runs' length, when longer than ``trials`` (--random-trials)

    @property
    def censor(self) -> int:
        """A seed that never reaches 2% counts as this many trials."""
        return max(self.trials, self.horizon) + 1

    def reach_median(self) -> float:
        return statistics.median([r if r is not None else self.censor for r in self.reach])

    def reach_iqr(self) -> tuple[float, float]:
        values = sorted(r if r is not None else self.censor for r in self.reach)
        n = len(values)
        return values[max(0, math.ceil(0.25 * n) - 1)], values[max(0, math.ceil(0.75 * n) - 1)]


def score(traces: Sequence[Trace], optimum_s: float, trials: int, pick: str = "measured") -> Score:
    """Shares within 1% / 2% at the checkpoints up to ``trials`` and exact at ``trials``, read from
    each trace's prefix; trials to 2% over the whole trace (random's runs may be longer:
    ``--random-trials``; the model's pick only over ``trials``, where it was scored)."""
    within: dict[tuple[float, int], int] = {}
    reach: list[int | None] = []
    exact = 0
    horizon = trials
    for trace in traces:
        ratios = recommendation_ratios(trace, optimum_s, pick)
        if pick == "model":
            ratios = ratios[:trials]
        horizon = max(horizon, len(ratios))
        for tol in TOLERANCES:
            for n in _checkpoints(trials):
                ok = len(ratios) >= n and ratios[n - 1] <= 1 + tol + _EPS
                within[(tol, n)] = within.get((tol, n), 0) + ok
        exact += bool(ratios) and ratios[:trials][-1] <= 1 + _EPS
        reach.append(next((i for i, r in enumerate(ratios, 1) if r <= 1 + REACH + _EPS), None))
    return Score(len(traces), trials, within, exact, reach, horizon)


def _checkpoints(trials: int) -> list[int]:
    return sorted({n for n in CHECKPOINTS if n < trials} | {trials})


# ---- the noise's limit ----------------------------------------------------------------------
FLOOR_SWITCHES = 16


def noise_floor(job: PlantedJob, runs: int, reps: int = 200) -> tuple[float, float] | None:
    """What the noise alone allows: the shares of ``reps`` draws within 1% / 2% of the optimum
    for a search told the job's exact terms (which switches, pairs, triples and split values
    matter) and its feasible points, that measures ``runs`` random points once each, fits the
    terms by least squares and recommends the feasible point of least predicted runtime. None
    above 16 switches (the enumeration)."""
    n = len(job.switches)
    if n > FLOOR_SWITCHES:
        return None
    codes = np.arange(1 << n, dtype=np.int64)
    bits = ((codes[:, None] >> np.arange(n)) & 1).astype(np.float64)
    combos = list(itertools.product(*(range(len(v)) for _, _, v in job.splits)))
    rows, feats, true, feas = [], [], [], []
    for combo in combos:
        values = [v[i] for (_, _, v), i in zip(job.splits, combo, strict=True)]
        cols = [np.ones(len(bits)), *bits.T]
        cols += [bits[:, i] * bits[:, j] for (i, j), _ in job.pairwise]
        cols += [bits[:, i] * bits[:, j] * bits[:, k] for (i, j, k), _ in job.threeway]
        for (p, _, vals), i in zip(job.splits, combo, strict=True):
            cols += [bits[:, p] * (i == m) for m in range(1, len(vals))]
        feats.append(np.stack(cols, 1))
        true.append(_planted.T0_S * np.exp(-job.gain(bits, values)))
        feas.append(job.feasible(bits))
        rows.append(len(bits))
    f_all, t_all, ok = np.vstack(feats), np.concatenate(true), np.concatenate(feas)
    optimum = t_all[ok].min()
    rng = np.random.default_rng(zlib.crc32(job.name.encode()))
    within = np.zeros(2)
    ok_idx = np.flatnonzero(ok)
    for _ in range(reps):
        idx = rng.choice(len(t_all), runs, replace=False)
        y = np.log(t_all[idx]) + job.noise * rng.standard_normal(runs)
        beta, *_ = np.linalg.lstsq(f_all[idx], y, rcond=None)
        ratio = t_all[ok_idx[np.argmin(f_all[ok_idx] @ beta)]] / optimum
        within += [ratio <= 1.01 + _EPS, ratio <= 1.02 + _EPS]
    return float(within[0] / reps), float(within[1] / reps)


def two_point_bound(job: PlantedJob, runs: int) -> tuple[float, str] | None:
    """What no sampler can beat with ``runs`` single runs: the largest chance of a wrong call on
    one decisive switch, by the two-point (Le Cam) bound.

    A switch is decisive when every point within 1% of the optimum sets it as the optimum does
    and flipping it alone keeps the bound: a pick within 1% must call it right. Its flip costs
    ``d`` (log runtime) at the optimum. Against the job with that flip's effect mirrored (the
    same otherwise), any design and estimator, adaptive or not, learns ``d`` with variance at
    least ``4 sigma^2 / runs`` (the intercept is unknown, each run has noise ``sigma``), so it
    calls the sign wrong with probability at least ``Phi(-d sqrt(runs) / (2 sigma))`` on one of
    the two jobs. None above 16 switches (the enumeration) or when no switch is decisive.

    Returns:
        (that probability, ``"switch k, flip d%"``) for the switch where it is largest.
    """
    n = len(job.switches)
    if n > FLOOR_SWITCHES:
        return None
    codes = np.arange(1 << n, dtype=np.int64)
    bits = ((codes[:, None] >> np.arange(n)) & 1).astype(np.float64)
    limit = job.optimum_s * 1.01 * (1 + _EPS) / _planted.T0_S
    near = []
    for values in itertools.product(*(v for _, _, v in job.splits)):
        ok = job.feasible(bits) & (np.exp(-job.gain(bits, values)) <= limit)
        near.append(bits[ok])
    within = np.vstack(near)
    best_bits, best_values = job.point(job.optimum)
    g0 = float(job.gain(best_bits[None, :], best_values)[0])
    worst: tuple[float, str] | None = None
    for k in range(n):
        flip = best_bits.copy()
        flip[k] = 1.0 - flip[k]
        if not np.all(within[:, k] == best_bits[k]) or not job.feasible(flip[None, :])[0]:
            continue
        d = g0 - float(job.gain(flip[None, :], best_values)[0])
        p = float(norm.cdf(-d * math.sqrt(runs) / (2 * job.noise)))
        if worst is None or p > worst[0]:
            worst = (p, f"{job.switches[k]}, flip {d:.2%}")
    return worst


def floor_table(
    floors: dict[str, tuple[float, float]],
    markdown: bool,
    bounds: dict[str, tuple[float, str] | None] | None = None,
) -> str:
    bounds = bounds or {}
    rows = []
    for name, (a, b) in floors.items():
        bound = bounds.get(name)
        if bound is None:
            rows.append([name, f"{a:.0%}", f"{b:.0%}", "-", "-", "-"])
            continue
        p, what = bound
        at_most = float(binom.sf(GOAL_MET - 1, GOAL_OF, 1.0 - p))  # P(at least GOAL_MET)
        rows.append([name, f"{a:.0%}", f"{b:.0%}", what, f"{p:.1%}", f"{at_most:.2f}"])
    head = (
        "the noise's limit (exact terms and feasibility known, 40 random runs, least squares);"
        " the two-point bound (any sampler, 40 runs: the most likely wrong call on a switch every"
        " point within 1% sets alike) and the chance of the goal's 19 of 20 it leaves at most"
    )
    header = ["job", "within 1%", "within 2%", "decisive switch", "wrong call >=", "P(19 of 20) <="]
    return head + ":\n\n" + table(header, rows, markdown)


# ---- output ---------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _median_text(value: float, trials: int) -> str:
    return f">{trials}" if value > trials else f"{value:g}"


def job_table(jobs: Sequence[PlantedJob | ReplayJob], markdown: bool) -> str:
    rows = []
    for j in jobs:
        if isinstance(j, PlantedJob):
            splits = ", ".join(
                f"{k.split('.')[0][:-10]}.{k.split('.')[1]} {list(v)}" for _, k, v in j.splits
            )
            rows.append([
                j.name, str(len(j.switches)), splits or "-", j.structure, f"{j.noise:.0%}",
                ", ".join(j.culprit_names()), str(j.points), f"{j.optimum_s * 1e6:.1f} us",
                f"{sum(v == 'on' for k, v in j.optimum.items() if k.startswith('pass.'))} on",
            ])  # fmt: skip
        else:
            rows.append([j.name, str(len(j.switches)), "recorded", "replay", "-", "-", str(j.points),
                         f"{j.optimum_s * 1e6:.1f} us", "-"])  # fmt: skip
    header = ["job", "switches", "split points", "structure", "noise", "culprits", "points",
              "optimum", "optimum has"]  # fmt: skip
    return table(header, rows, markdown)


def results_table(
    scores: dict[tuple[str, str], Score], jobs: Sequence[str], samplers: Sequence[str],
    trials: int, markdown: bool,
) -> str:  # fmt: skip
    checks = _checkpoints(trials)
    header = ["job", "sampler"]
    header += [f"1% @{n}" for n in checks] + [f"2% @{n}" for n in checks]
    header += [f"exact @{trials}", "trials to 2%: median", "IQR", "vs random"]
    rows = []
    for job in jobs:
        for s in samplers:
            sc = scores[(job, s)]
            row = [job, s]
            row += [f"{sc.within[(tol, n)]}/{sc.seeds}" for tol in TOLERANCES for n in checks]
            q1, q3 = sc.reach_iqr()
            last = sc.censor - 1
            row += [f"{sc.exact}/{sc.seeds}", _median_text(sc.reach_median(), last),
                    f"{_median_text(q1, last)}-{_median_text(q3, last)}"]  # fmt: skip
            row.append(_ratio_text(sc, scores.get((job, "random")), trials))
            rows.append(row)
    return table(header, rows, markdown)


def _ratio_text(sc: Score, random: Score | None, trials: int) -> str:
    if random is None:
        return "-"
    ratio = sc.reach_median() / random.reach_median()
    return f"<={ratio:.2f}" if random.reach_median() >= random.censor else f"{ratio:.2f}"


def goal_lines(
    scores: dict[tuple[str, str], Score], jobs: Sequence[PlantedJob | ReplayJob],
    samplers: Sequence[str], trials: int,
) -> list[str]:  # fmt: skip
    lines = []
    small = [j for j in jobs if isinstance(j, PlantedJob) and len(j.switches) <= GOAL_SWITCHES]
    at = 40 if 40 <= trials else trials
    for s in samplers:
        if small:
            missed = [
                f"{j.name} {scores[(j.name, s)].within[(0.01, at)]}/{scores[(j.name, s)].seeds}"
                for j in small
                if scores[(j.name, s)].within[(0.01, at)] < GOAL_SEEDS * scores[(j.name, s)].seeds
            ]
            verdict = "met" if not missed else "missed: " + ", ".join(missed)
            lines.append(
                f"{s}: within 1% at {at} trials in >= 19/20 seeds on jobs <= 16 switches: {verdict}"
            )
        if s != "random" and all((j.name, "random") in scores for j in jobs):
            ratios = [
                scores[(j.name, s)].reach_median() / scores[(j.name, "random")].reach_median()
                for j in jobs
            ]
            worst = max(ratios)
            verdict = "met" if worst <= GOAL_RATIO else "missed"
            lines.append(
                f"{s}: trials to 2% vs random, worst job {worst:.2f} (goal <= {GOAL_RATIO}: {verdict};"
                " a censored random median makes this an upper bound)"
            )
    replays = [j for j in jobs if isinstance(j, ReplayJob)]
    for j in replays:
        if (j.name, "tpe") not in scores:
            continue
        tpe = scores[(j.name, "tpe")]
        for s in samplers:
            if s in ("tpe", "random"):
                continue
            sc = scores[(j.name, s)]
            worse = (
                sc.reach_median() > tpe.reach_median()
                or sc.within[(0.02, trials)] < tpe.within[(0.02, trials)]
            )
            lines.append(
                f"{s} on replay {j.name}: {'worse than' if worse else 'not worse than'} TPE"
            )
    return lines


# ---- the replays ----------------------------------------------------------------------------
_SPACE = """\
name = "bench_samplers_{workload}{suffix}"

[workload]
name = "{workload}"
sizes = {sizes}

[passes]
search = {passes}

[split_points]
{splits}

[accuracy]
metric = "max_rel"
bound = 1e-3

[measure]
warmup = 1
repeat = 5
number = 1
min_repeat_ms = 2.0

[search]
sampler = "grid"
seed = 0
workers = 0
"""

REPLAYS = {
    # seven passes of a small transformer block and NormSplit's statistics cut: 256 points
    "transformer_block": {
        "suffix": "",
        "workload": "transformer_block",
        "sizes": "{ batch = 1, seq = 64, hidden = 64, heads = 2, ffn = 256 }",
        "passes": '["SoftmaxFusionPass", "LayerNormFusionPass", "AddLayerNormFusionPass",'
        ' "GeluFusionPass", "MatmulElemBiasaddFusionPass", "MatmulElemGeluFusionPass",'
        ' "CompositeOpsFusionPass"]',
        "splits": '"NormSplitFusionPass.stats" = [0, 1]',
    },
    # the seven passes that match a small llama block (CompositeOps takes what the others
    # leave), the attention's key/value block and a MatMul row cut: 1024 points
    "llama_block": {
        "suffix": "",
        "workload": "llama_block",
        "sizes": "{ batch = 1, seq = 64, hidden = 64, heads = 2, ffn = 192 }",
        "passes": '["SoftmaxFusionPass", "FlashAttentionFusionPass", "RmsNormFusionPass",'
        ' "AddRmsNormFusionPass", "SwiGluFusionPass", "MatmulElemAddFusionPass",'
        ' "CompositeOpsFusionPass"]',
        "splits": '"MatMulRowSplitFusionPass.row_block" = [0, 32]\n'
        '"FlashAttentionFusionPass.kv_block" = [0, 32, 64, 128]',
    },
}
QUICK = {
    "suffix": "_quick",
    "workload": "mlp",
    "sizes": "{ batch = 32, hidden = 64 }",
    "passes": '["MatmulElemBiasaddFusionPass", "MatmulElemReluFusionPass", "CompositeOpsFusionPass"]',
    "splits": '"MatMulRowSplitFusionPass.row_block" = [0, 16]',
}


def replay_space_toml(quick: bool, workload: str = "transformer_block") -> str:
    fields = QUICK if quick else REPLAYS[workload]
    text = _SPACE
    for key, value in fields.items():
        text = text.replace("{" + key + "}", value)
    return text


def record_replay(
    quick: bool, record: Path | None, fresh: bool, workload: str = "transformer_block"
) -> ReplayJob | None:
    """Measure every grid point once (unless recorded) and return the replayed job."""
    from optuna.trial import TrialState

    from fusiontune.tune.evaluator import LocalEvaluator
    from fusiontune.tune.store import StudyStore
    from fusiontune.workloads import make_workload

    text = replay_space_toml(quick, workload)
    space = loads_space(text, "<bench_samplers>")
    path = record or Path("results") / "bench_samplers" / f"{space.name}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    if fresh and path.exists():
        path.unlink()
    url = f"sqlite:///{path}"
    workload_ = make_workload(space.workload, **dict(space.sizes))
    t0 = time.perf_counter()
    result = run_tune(
        space, LocalEvaluator(workload_, space.measure), url, space.name, grid_size(space) + 2,
        sampler="grid", progress=sys.stderr.isatty(),
    )  # fmt: skip
    print(f"grid: {result.n_finished} trials recorded in {time.perf_counter() - t0:.0f} s ({url})",
          file=sys.stderr)  # fmt: skip
    grid = optuna.load_study(study_name=space.name, storage=url)
    complete = StudyStore(grid).trials((TrialState.COMPLETE,))
    feasible = [t.median_s for t in complete if t.feasible]
    if not feasible:
        print(
            f"{space.name}: no feasible configuration in the grid: nothing to find", file=sys.stderr
        )
        return None
    return ReplayJob(space.name, text, str(path), min(feasible), grid_size(space), space.searched)


def _record_alone(quick: bool, record: Path | None, fresh: bool, workload: str) -> ReplayJob | None:
    """:func:`record_replay` in a child process of its own. Recorded after another grid in one
    process, a grid's programs ran 1.6x to 1.8x slower than alone (the llama_block grid's defaults
    at 186 us against 101) except a few, measured at the speed of a program alone: those became
    the optimum, 1.5x ahead of the rest, and no sampler but a lucky one could find it."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(record_replay, (quick, record, fresh, workload))  # type: ignore[no-any-return]


# ---- main -----------------------------------------------------------------------------------
def default_samplers() -> list[str]:
    """Every sampler of the name table except grid and nsga2 (a new one is included by itself)."""
    return [s for s in SAMPLERS if s not in DEFAULT_EXCLUDED]


def _names(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"3 seeds, 40 trials, jobs {','.join(_planted.QUICK_JOBS)}; a 16-point replay")  # fmt: skip
    parser.add_argument("--seeds", type=int, help="seeds per sampler and job (default 20)")
    parser.add_argument(
        "--trials", type=int, help="trials per run, baselines included (default 80)"
    )
    parser.add_argument("--jobs", help="planted jobs, comma-separated (default: all)")
    parser.add_argument("--random-trials", type=int,
                        help="run random this long (its shares are still read at --trials), so"
                        " that its trials to 2%% are known rather than censored")  # fmt: skip
    parser.add_argument("--samplers", help="comma-separated (default: all but grid and nsga2)")
    parser.add_argument("--jobs-parallel", type=int, default=os.cpu_count() or 1,
                        help="runs in parallel processes (default: the CPU count)")  # fmt: skip
    parser.add_argument("--markdown", action="store_true", help="markdown tables")
    parser.add_argument("--cache", type=Path,
                        help="JSON-lines file of run traces, reused by (job, sampler, seed, trials);"
                        " delete it when a sampler changes")  # fmt: skip
    parser.add_argument("--replays", action="store_true",
                        help="the recorded built-in grid replays instead of the planted jobs")  # fmt: skip
    parser.add_argument("--workloads",
                        help=f"with --replays: comma-separated (default: {','.join(REPLAYS)})")  # fmt: skip
    parser.add_argument("--record", type=Path,
                        help="with --replays of one workload: SQLite file of the grid")  # fmt: skip
    parser.add_argument(
        "--fresh", action="store_true", help="with --replays: measure the grid again"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="per planted job up to 16 switches: how often a search that knows the job's exact"
        " terms and feasibility gets within 1%% / 2%% from 40 random runs (the noise's limit)",
    )
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = args.seeds or (3 if args.quick else 20)
    trials = args.trials or (40 if args.quick else 80)
    samplers = _names(args.samplers) or default_samplers()
    unknown = [s for s in samplers if s not in SAMPLERS]
    if unknown:
        parser.error(f"unknown sampler(s) {', '.join(unknown)} (known: {', '.join(SAMPLERS)})")
    t0 = time.perf_counter()
    jobs: list[PlantedJob | ReplayJob]
    if args.replays:
        workloads = ["mlp"] if args.quick else (_names(args.workloads) or list(REPLAYS))
        if not args.quick and any(w not in REPLAYS for w in workloads):
            parser.error(f"unknown replay workload (known: {', '.join(REPLAYS)})")
        if args.record is not None and len(workloads) > 1:
            parser.error("--record names the grid of one workload: give --workloads too")
        replays = [_record_alone(args.quick, args.record, args.fresh, w) for w in workloads]
        jobs = [r for r in replays if r is not None]
    else:
        names = _names(args.jobs) or (list(_planted.QUICK_JOBS) if args.quick else None)
        try:
            jobs = list(_planted.planted_jobs(names))
        except KeyError as e:
            known = ", ".join(s.name for s in _planted.SPECS)
            parser.error(f"unknown job {e.args[0]!r} (known: {known})")
    random_trials = max(trials, args.random_trials or 0)

    def task(s: str, j: PlantedJob | ReplayJob, seed: int) -> Task:
        if s == "random" and random_trials > trials:  # longer: its trials to 2%, uncensored
            # (its model's pick, which no one uses, is scored at the checkpoints only: a
            # refit after every trial would cost more than the run)
            return Task(s, j, seed, random_trials, model_at=tuple(_checkpoints(trials)))
        return Task(s, j, seed, trials)

    tasks = [task(s, j, seed) for j in jobs for s in samplers for seed in range(seeds)]
    traces = run_tasks(tasks, max(1, args.jobs_parallel), args.cache)
    scores = {
        pick: {
            (j.name, s): score(
                [traces[task(s, j, seed).key] for seed in range(seeds)],
                j.optimum_s,
                trials,
                pick,
            )
            for j in jobs
            for s in samplers
        }
        for pick in PICKS
    }
    wall = time.perf_counter() - t0
    print(job_table(jobs, args.markdown))
    floors, bounds = {}, {}
    if args.floor:
        floors = {j.name: noise_floor(j, 40) for j in jobs if isinstance(j, PlantedJob)}
        floors = {k: v for k, v in floors.items() if v is not None}
        bounds = {name: two_point_bound(j, 40) for j in jobs if (name := j.name) in floors}
        print()
        print(floor_table(floors, args.markdown, bounds))
    for pick in PICKS:
        what = {
            "measured": "the feasible trial of fastest measurement (the sweep's rank 1)",
            "model": "the feasible trial of best posterior mean (the runtime model's pick, first"
            " of the confirmation's model shortlist)",
        }[pick]
        print()
        print(
            f"{seeds} seeds x {trials} trials per sampler and job (the 2 baselines included);"
            f" recommendation: {what}; shares of seeds whose recommendation is, noise-free,"
            " within 1% / 2% of the optimum:"
        )
        print()
        print(results_table(scores[pick], [j.name for j in jobs], samplers, trials, args.markdown))
        print()
        for line in goal_lines(scores[pick], jobs, samplers, trials):
            print(("- " if args.markdown else "") + f"[{pick}] " + line)
    print(f"\nwall time {wall:.0f} s ({len(tasks)} runs, {args.jobs_parallel} processes)")
    figures: dict[str, Any] = {
        "seeds": seeds,
        "trials": trials,
        "samplers": samplers,
        "wall_s": wall,
        "floor": floors,
        "two_point_bound": bounds,
        "jobs": {
            j.name: {
                "optimum_s": j.optimum_s,
                "switches": len(j.switches),
                "samplers": {
                    pick: {
                        s: {
                            "within": {
                                f"{tol:g}@{n}": scores[pick][(j.name, s)].within[(tol, n)]
                                for tol in TOLERANCES
                                for n in _checkpoints(trials)
                            },  # fmt: skip
                            "exact": scores[pick][(j.name, s)].exact,
                            "reach": scores[pick][(j.name, s)].reach,
                            "reach_median": scores[pick][(j.name, s)].reach_median(),
                        }
                        for s in samplers
                    }
                    for pick in PICKS
                },
            }
            for j in jobs
        },
    }
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
    raise SystemExit(0)
