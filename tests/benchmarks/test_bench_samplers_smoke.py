"""Smoke run of benchmarks/bench_samplers.py and checks of its planted stand-in jobs.

The planted jobs' optimum and evaluator are checked fast (no tuning loop); one quick run of the
benchmark through the real loop is marked ``bench`` (CI never runs it; nothing here depends on
how well any sampler does). Run with ``pytest -m bench tests/benchmarks``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their string annotations through it
    spec.loader.exec_module(module)
    return module


def test_planted_optimum_is_the_best_feasible_point_by_brute_force() -> None:
    planted = _load("_planted")
    job = planted.planted_jobs(["split10"])[0]
    best = math.inf
    names = [planted.PASS_PARAM + s for s in job.switches]
    for bits in itertools.product(("off", "on"), repeat=len(job.switches)):
        for values in itertools.product(*(v for _, _, v in job.splits)):
            params = dict(zip(names, bits, strict=True))
            params.update(
                {
                    planted.SPLIT_PARAM + k: v
                    for (_, k, _), v in zip(job.splits, values, strict=True)
                }
            )
            x, _ = job.point(params)
            if job.feasible(x)[0]:
                best = min(best, job.true_runtime(params))
    assert job.optimum_s == pytest.approx(best, rel=1e-12)
    assert job.true_runtime(job.optimum) == pytest.approx(job.optimum_s, rel=1e-12)


def test_planted_defaults_are_infeasible_and_all_off_feasible() -> None:
    planted = _load("_planted")
    for job in planted.planted_jobs(list(planted.QUICK_JOBS)):
        n = len(job.switches)
        assert not job.feasible([1.0] * n)[0], job.name  # every culprit is on by default
        assert job.feasible([0.0] * n)[0], job.name
        assert job.error(__import__("numpy").zeros(n)) < planted.BOUND


def test_planted_evaluator_noise_is_deterministic_per_seed_and_trial() -> None:
    planted = _load("_planted")
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.tune.records import EvalRequest

    job = planted.planted_jobs(["issue12"])[0]
    space = job.space()
    config = FusionConfig.defaults(space.passes)
    a = planted.PlantedEvaluator(job, 3).evaluate([EvalRequest(5, config), EvalRequest(6, config)])
    b = planted.PlantedEvaluator(job, 3).evaluate([EvalRequest(5, config)])
    assert a[0].median_s == b[0].median_s != a[1].median_s
    assert a[0].error("error") > planted.BOUND  # the defaults switch the culprit on


def test_recommendation_ratio_follows_the_best_measured_feasible_trial() -> None:
    bench = _load("bench_samplers")
    nan = math.nan
    trace = [(False, 0.5, 0.5, nan), (True, 1.0, 1.1, 1.1), (True, 0.9, 1.2, 1.1), (True, 0.95, 1.0, 1.0)]
    assert bench.recommendation_ratios(trace, 1.0) == [math.inf, 1.1, 1.2, 1.2]
    sc = bench.score([trace], 1.0, 4)
    assert sc.reach == [None] and sc.reach_median() == 5
    # the model's pick: its own column, NaN (no pick yet) counts as not there
    assert bench.recommendation_ratios(trace, 1.0, "model") == [math.inf, 1.1, 1.1, 1.0]
    assert bench.score([trace], 1.0, 4, "model").reach == [4]


def test_bench_samplers_scores_every_sampler_and_job(tmp_path: Path) -> None:
    # Small enough for every CI run (seconds): a benchmark nobody runs breaks unseen, as the
    # split-point jobs once did when run_tune's arguments changed.
    bench = _load("bench_samplers")
    out = tmp_path / "bench.json"
    figures = bench.main(
        ["--seeds", "1", "--trials", "16", "--random-trials", "24", "--samplers", "fusion,random",
         "--jobs", "issue12,split10", "--jobs-parallel", "1", "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    for job in ("issue12", "split10"):
        for pick in ("measured", "model"):
            for sampler in ("fusion", "random"):
                row = figures["jobs"][job]["samplers"][pick][sampler]
                assert set(row["within"]) == {"0.01@16", "0.02@16"}
                assert len(row["reach"]) == 1
        random = figures["jobs"][job]["samplers"]["measured"]["random"]["reach"]
        assert all(r is None or r <= 24 for r in random)  # random ran 24 trials, scored at 16


@pytest.mark.bench
def test_bench_samplers_quick_scores_every_sampler_and_job(tmp_path: Path) -> None:
    bench = _load("bench_samplers")
    out = tmp_path / "bench.json"
    figures = bench.main(
        ["--quick", "--seeds", "2", "--trials", "24", "--samplers", "tpe,random",
         "--jobs", "issue12,split10", "--jobs-parallel", "1", "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    for job in ("issue12", "split10"):
        for sampler in ("tpe", "random"):
            row = figures["jobs"][job]["samplers"]["measured"][sampler]
            assert set(row["within"]) == {"0.01@20", "0.01@24", "0.02@20", "0.02@24"}
            assert len(row["reach"]) == 2


def test_two_point_bound_names_a_switch_every_near_optimal_point_sets_alike() -> None:
    """The bound's switch, checked by brute force on issue12 (4096 points): flipping it alone
    from the optimum keeps the bound and costs the flip it names, every feasible point within 1%
    of the optimum sets it as the optimum does, and the chance is Phi(-d sqrt(runs) / 2 sigma)."""
    from scipy.stats import norm

    planted = _load("_planted")
    bench = _load("bench_samplers")
    job = planted.planted_jobs(["issue12"])[0]
    p, what = bench.two_point_bound(job, 40)
    name = what.split(",")[0]
    flip = dict(job.optimum)
    key = planted.PASS_PARAM + name
    flip[key] = "off" if flip[key] == "on" else "on"
    d = math.log(job.true_runtime(flip) / job.optimum_s)
    assert job.feasible(job.point(flip)[0])[0]
    assert what == f"{name}, flip {d:.2%}"
    assert p == pytest.approx(norm.cdf(-d * math.sqrt(40) / (2 * job.noise)), rel=1e-9)
    names = [planted.PASS_PARAM + s for s in job.switches]
    for bits in itertools.product(("off", "on"), repeat=len(job.switches)):
        params = dict(zip(names, bits, strict=True))
        near = job.true_runtime(params) <= 1.01 * job.optimum_s
        if near and job.feasible(job.point(params)[0])[0]:
            assert params[key] == job.optimum[key]
    assert bench.two_point_bound(job, 160)[0] < p  # more runs, a smaller chance of a wrong call
