"""Sampler benchmark: how many trials each sampler needs to get within 2% of the best configuration.

1. Enumerate a small space once: a grid over seven passes of a small ``transformer_block`` and
   the NormSplit statistics cut (256 points; ``--quick``: 16 points of a small ``mlp``), measured
   in process (``LocalEvaluator``), recorded to a SQLite study (default
   ``results/bench_samplers/``, which git ignores; ``--fresh`` measures again). The exhaustive
   feasible optimum is the fastest recorded configuration within the accuracy bound.
2. For each sampler (TPE, random, NSGA-II) and each seed, run the real tuning loop (``run_tune``)
   against a ``ReplayEvaluator`` of that recording, and count the sampled trials (after the two
   enqueued baselines, which every sampler gets alike) until a feasible trial within 2% of the
   optimum appears. Replays are deterministic and take milliseconds per trial, so the comparison
   is of the search strategies alone, on one fixed set of measurements.

Prints, per sampler, the median number of trials over the seeds with its spread, the same for
measurements (trials not answered by an earlier trial's identical program), and the TPE / random
ratio (goal: TPE needs at most half of random's trials). A benchmark, not a test: nothing is
gated. Record the grid on a quiet machine (``cat /proc/loadavg`` well below the core count):
numba's thread pools slow down by orders of magnitude under competing load, and a grid measured
under load ranks configurations by the load, not by their programs.

    .venv/bin/python benchmarks/bench_samplers.py [--quick] [--seeds N] [--samplers tpe,random,nsga2]
        [--record PATH] [--fresh]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from fusiontune.tune.evaluator import LocalEvaluator
from fusiontune.tune.replay import ReplayEvaluator
from fusiontune.tune.store import StudyStore, TrialRecord
from fusiontune.tune.study import run_tune
from fusiontune.workloads import make_workload
from fusiontune.workloads.space import SearchSpace, grid_size, loads_space

TARGET = 1.02  # within 2% of the exhaustive optimum
RATIO_GOAL = 0.5
BASELINES = 2

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

FULL = {
    "suffix": "",
    "workload": "transformer_block",
    "sizes": "{ batch = 1, seq = 64, hidden = 64, heads = 2, ffn = 256 }",
    "passes": '["SoftmaxFusionPass", "LayerNormFusionPass", "AddLayerNormFusionPass", "GeluFusionPass",'
    ' "MatmulElemBiasaddFusionPass", "MatmulElemGeluFusionPass", "CompositeOpsFusionPass"]',
    "splits": '"NormSplitFusionPass.stats" = [0, 1]',
}
QUICK = {
    "suffix": "_quick",
    "workload": "mlp",
    "sizes": "{ batch = 32, hidden = 64 }",
    "passes": '["MatmulElemBiasaddFusionPass", "MatmulElemReluFusionPass", "CompositeOpsFusionPass"]',
    "splits": '"MatMulRowSplitFusionPass.row_block" = [0, 16]',
}


def make_space(quick: bool) -> SearchSpace:
    fields = QUICK if quick else FULL
    text = _SPACE
    for key, value in fields.items():
        text = text.replace("{" + key + "}", value)
    return loads_space(text, f"<bench_samplers{fields['suffix']}>")


def record_grid(space: SearchSpace, url: str) -> optuna.Study:
    """Measure every point of the space once (program-hash sharing makes this cheaper)."""
    workload = make_workload(space.workload, **dict(space.sizes))
    evaluator = LocalEvaluator(workload, space.measure)
    n = grid_size(space) + BASELINES
    t0 = time.perf_counter()
    result = run_tune(
        space, evaluator, url, space.name, n, sampler="grid", progress=sys.stderr.isatty()
    )
    print(f"grid: {result.n_finished} trials recorded in {time.perf_counter() - t0:.0f} s ({url})")
    return optuna.load_study(study_name=space.name, storage=url)


def cost_to_target(
    trials: list[optuna.trial.FrozenTrial], target_s: float
) -> tuple[int, int] | None:
    """(trials, measurements) after the baselines until a feasible trial within the target.

    Measurements count the trials that were measured, not answered from an earlier trial with the
    same program (those cost milliseconds, not a compile and a timing).
    """
    records = [TrialRecord.from_trial(t) for t in trials]
    sampled = sorted((t for t in records if not t.role), key=lambda t: t.number)
    measured = 0
    for i, t in enumerate(sampled, start=1):
        measured += t.reused_from is None
        if t.feasible and t.median_s <= target_s:
            return i, measured
    return None


def run_sampler(
    space: SearchSpace,
    table: ReplayEvaluator,
    sampler: str,
    seed: int,
    target_s: float,
    limit: int,
    tmp: Path,
) -> tuple[int, int] | None:
    """(trials, measurements) until the target: one sweep that stops when a trial reaches it."""
    url = f"sqlite:///{tmp / f'{sampler}_{seed}.db'}"

    def reached(t: optuna.trial.FrozenTrial) -> bool:
        record = TrialRecord.from_trial(t)
        return not record.role and record.feasible and record.median_s <= target_s

    run_tune(
        space,
        table,
        url,
        "replay",
        limit,
        sampler=sampler,
        seed=seed,
        progress=False,
        stop_when=reached,
    )
    study = optuna.load_study(study_name="replay", storage=url)
    return cost_to_target(study.get_trials(deepcopy=False), target_s)


def summarize(counts: list[int | None], limit: int) -> tuple[float, str]:
    """Median and spread; a seed that never reached the target counts as ``limit + 1``."""
    values = [c if c is not None else limit + 1 for c in counts]
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values), f"{q[0]:.0f}-{q[2]:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 16-point grid on a small mlp")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per sampler (at least 5)")
    parser.add_argument("--samplers", default="tpe,random,nsga2")
    parser.add_argument(
        "--record",
        type=Path,
        help="SQLite file of the measured grid (default results/bench_samplers/)",
    )
    parser.add_argument("--fresh", action="store_true", help="measure the grid again")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = make_space(args.quick)
    record = args.record or Path("results") / "bench_samplers" / f"{space.name}.db"
    if args.fresh and record.exists():
        record.unlink()
    grid = record_grid(space, f"sqlite:///{record}")
    complete = StudyStore(grid).trials((TrialState.COMPLETE,))
    feasible = [t for t in complete if t.feasible]
    if not feasible:
        print("no feasible configuration in the grid: nothing to find")
        return 1
    optimum = min(t.median_s for t in feasible)
    size = grid_size(space)
    target = optimum * TARGET
    hits = sum(t.median_s <= target for t in feasible if not t.role)
    baseline_hit = [t.role for t in feasible if t.role and t.median_s <= target]
    limit = size + BASELINES
    splits = ", ".join(f"{k} {list(v)}" for k, v in space.splits.items() if len(v) > 1)
    print(
        f"space: {space.workload} {dict(space.sizes)}, {len(space.searched)} passes x {splits}"
        f" = {size} points, {len({t.program_hash for t in complete})} distinct programs"
    )
    print(
        f"optimum {optimum * 1e6:.1f} us; target <= {target * 1e6:.1f} us ({hits} of {size} grid points within 2%)"
    )
    if baseline_hit:
        print(f"note: the {' and '.join(baseline_hit)} baseline is already within 2%")
    table = ReplayEvaluator.from_study(f"sqlite:///{record}", space.name)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sampler in [s.strip() for s in args.samplers.split(",") if s.strip()]:
            t0 = time.perf_counter()
            costs = [
                run_sampler(space, table, sampler, seed, target, limit, Path(tmp))
                for seed in range(args.seeds)
            ]
            trials, trials_iqr = summarize([c[0] if c else None for c in costs], limit)
            measured, measured_iqr = summarize([c[1] if c else None for c in costs], limit)
            missed = sum(c is None for c in costs)
            rows.append((sampler, trials, trials_iqr, measured, measured_iqr, missed))
            seconds = time.perf_counter() - t0
            print(f"  {sampler} ({seconds:.0f} s): (trials, measurements) {costs}", file=sys.stderr)
    print()
    print(
        f"to a feasible configuration within 2% of the optimum, after the 2 baselines"
        f" ({args.seeds} seeds; a seed that never gets there counts {limit + 1}):"
    )
    print(
        f"{'sampler':8}  {'trials':>6}  {'IQR':>7}  {'measured':>8}  {'IQR':>7}  {'not found':>9}"
    )
    for sampler, trials, t_iqr, measured, m_iqr, missed in rows:
        print(f"{sampler:8}  {trials:>6.1f}  {t_iqr:>7}  {measured:>8.1f}  {m_iqr:>7}  {missed:>9}")
    by_name = {r[0]: r for r in rows}
    if "tpe" in by_name and "random" in by_name:
        ratio = by_name["tpe"][1] / by_name["random"][1]
        verdict = "meets" if ratio <= RATIO_GOAL else "misses"
        measured_ratio = by_name["tpe"][3] / by_name["random"][3]
        print(
            f"TPE / random: {ratio:.2f} in trials ({verdict} the goal <= {RATIO_GOAL}),"
            f" {measured_ratio:.2f} in measurements"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
