"""Core benchmark: fused kernels vs numpy and vs all-off, at memory-bound sizes; kernel compile time.

Prints, for people:

1. A fused elementwise chain and a fused Add + LayerNorm on >= 64 MiB float32 operands: the median
   time (and IQR) of the fused program, of the all-off program (every op its own kernel) and of
   plain numpy, timed in interleaved rounds (A B C A B C ...) so that load from other processes
   hits every variant alike; the fused kernels' achieved bandwidth as a share of the measured copy
   bandwidth (goal >= 60%).
2. The time to obtain the kernels of a moderate graph in a fresh process, with a cold and then a
   warm disk cache (goal: warm >= 10x faster), medians over several cold/warm pairs.

This is a benchmark, not a test: nothing is gated on time. Run it on a quiet machine
(``cat /proc/loadavg`` below ~0.5): numba's threads degrade badly under competing load.

    .venv/bin/python benchmarks/bench_core.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.graph import Graph
from fusiontune.measure import (
    MeasureConfig,
    Timing,
    machine_info,
    measure_copy_bandwidth,
    time_interleaved,
)
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime.program import Program, build_program

BANDWIDTH_GOAL = 0.60
WARM_SPEEDUP_GOAL = 10.0
EPS = 1e-5
MIB = 1 << 20
F32 = np.float32

# Runs in a fresh interpreter; only build_program is timed (not start-up, imports, the pipeline).
_COMPILE_SCRIPT = """
import json, time
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime.program import build_program
from fusiontune.runtime.threads import single_threaded_blas
from fusiontune.workloads import make_workload
fused = run_pipeline(make_workload("transformer_block").graph, FusionConfig.defaults()).fused
single_threaded_blas()  # imports scipy's BLAS: a start-up cost, kept out of the figure
t0 = time.perf_counter()
p = build_program(fused)
build_s = time.perf_counter() - t0
kernels = [dict(key=k.key, compile_s=k.compile_s, cache=k.cache) for k in p.kernels]
print(json.dumps(dict(build_s=build_s, compile_s=p.compile_s, kernels=kernels)))
"""


@dataclass(frozen=True)
class Case:
    """One fused pattern: its graph, inputs, and the same math as a plain numpy expression."""

    name: str
    title: str
    graph: Graph
    inputs: dict[str, np.ndarray]
    numpy_fn: Callable[[], np.ndarray]


def chain_case(rows: int, cols: int, rng: np.random.Generator) -> Case:
    """``relu((x*1.5 + 0.5)*x - 0.25)``: five elementwise ops, one kernel when fused."""
    g = GraphBuilder("chain")
    x = g.input("x", (rows, cols))
    g.output(g.relu(g.sub(g.mul(g.add(g.mul(x, 1.5), 0.5), x), 0.25)))
    xv = rng.standard_normal((rows, cols), dtype=F32)

    def numpy_fn() -> np.ndarray:
        return np.maximum((xv * F32(1.5) + F32(0.5)) * xv - F32(0.25), F32(0.0))

    return Case("chain", "relu((x*1.5+0.5)*x-0.25)", g.build(), {"x": xv}, numpy_fn)


def add_layernorm_case(rows: int, cols: int, rng: np.random.Generator) -> Case:
    """``layer_norm(x + r)`` over the last axis, decomposed; the defaults fuse it to AddLayerNorm."""
    g = GraphBuilder("add_layernorm")
    x, r = g.input("x", (rows, cols)), g.input("r", (rows, cols))
    gamma_v = (1.0 + 0.1 * rng.standard_normal(cols)).astype(F32)
    beta_v = (0.1 * rng.standard_normal(cols)).astype(F32)
    gamma, beta = g.const(gamma_v, name="gamma"), g.const(beta_v, name="beta")
    g.output(g.layer_norm_decomposed(g.add(x, r), gamma, beta, eps=EPS))
    xv = rng.standard_normal((rows, cols), dtype=F32)
    rv = rng.standard_normal((rows, cols), dtype=F32)

    def numpy_fn() -> np.ndarray:
        s = xv + rv
        d = s - s.mean(axis=-1, keepdims=True)
        var = (d * d).mean(axis=-1, keepdims=True)
        return d / np.sqrt(var + F32(EPS)) * gamma_v + beta_v

    return Case("add_layernorm", "layer_norm(x + r)", g.build(), {"x": xv, "r": rv}, numpy_fn)


def bound_program(case: Case, config: FusionConfig) -> Program:
    """Build the program of ``case`` under ``config``, bind its inputs and check it against numpy."""
    program = build_program(run_pipeline(case.graph, config).fused)
    out = program.run(case.inputs)[case.graph.outputs[0]]
    np.testing.assert_allclose(out, case.numpy_fn(), rtol=1e-3, atol=1e-3)
    return program


def interleaved(
    fns: dict[str, Callable[[], object]], rounds: int, warmup: int
) -> dict[str, Timing]:
    """Time every callable once per round, in turn, so drifting load hits all of them alike
    (``fusiontune.measure.time_interleaved``: one call per sample, too wide a spread retried)."""
    timings = time_interleaved(list(fns.values()), rounds, MeasureConfig(warmup=warmup), min_sample_s=0.0)
    return dict(zip(fns, timings, strict=True))


def bench_case(case: Case, rounds: int, copy_bw: float) -> dict[str, Any]:
    """Fused vs all-off vs numpy for one case; prints its table and returns its figures."""
    fused = bound_program(case, FusionConfig.defaults())
    all_off = bound_program(case, FusionConfig.all_off())
    t = interleaved(
        {"fused": fused.execute, "all-off": all_off.execute, "numpy": case.numpy_fn}, rounds, 2
    )
    moved = sum(k.bytes_moved for k in fused.kernels)
    achieved = moved / t["fused"].median_s
    x = case.inputs["x"]
    print(
        f"\n== {case.name}: {case.title}, x {x.shape[0]}x{x.shape[1]} float32 ({x.nbytes / MIB:.0f} MiB), "
        f"{rounds} interleaved rounds"
    )
    print(f"  {'variant':<10}{'kernels':>8}{'median ms':>12}{'IQR ms':>10}{'vs fused':>10}")
    counts = {"fused": fused.kernel_count, "all-off": all_off.kernel_count, "numpy": None}
    for name, timing in t.items():
        k = "-" if counts[name] is None else str(counts[name])
        ratio = timing.median_s / t["fused"].median_s
        print(
            f"  {name:<10}{k:>8}{timing.median_s * 1e3:>12.2f}{timing.iqr_s * 1e3:>10.2f}{ratio:>9.2f}x"
        )
    frac = achieved / copy_bw
    verdict = "met" if frac >= BANDWIDTH_GOAL else "NOT met"
    print(
        f"  fused kernel moves {moved / MIB:.0f} MiB -> {achieved / 1e9:.2f} GB/s = {100 * frac:.0f}% "
        f"of copy bandwidth (goal >= {100 * BANDWIDTH_GOAL:.0f}%: {verdict})"
    )
    print(
        f"  numpy/fused = {t['numpy'].median_s / t['fused'].median_s:.2f}x, "
        f"all-off/fused = {t['all-off'].median_s / t['fused'].median_s:.2f}x"
    )
    return {
        "shape": list(x.shape),
        "kernels": {"fused": fused.kernel_count, "all-off": all_off.kernel_count},
        "timings": {
            n: {"median_s": v.median_s, "iqr_s": v.iqr_s, "samples_s": list(v.samples_s)}
            for n, v in t.items()
        },
        "fused_bytes_moved": moved,
        "achieved_bytes_per_s": achieved,
        "fraction_of_copy_bandwidth": frac,
        "numpy_over_fused": t["numpy"].median_s / t["fused"].median_s,
        "all_off_over_fused": t["all-off"].median_s / t["fused"].median_s,
    }


def compile_in_fresh_process(cache_dir: str) -> dict[str, Any]:
    """Run :data:`_COMPILE_SCRIPT` in a new interpreter with ``FUSIONTUNE_CACHE_DIR=cache_dir``."""
    env = {**os.environ, "FUSIONTUNE_CACHE_DIR": cache_dir}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"compile subprocess failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _kernel_stats(run: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Median per-kernel seconds and seconds by key, over kernels not already in memory."""
    loaded = {k["key"]: k["compile_s"] for k in run["kernels"] if k["cache"] != "memory"}
    return statistics.median(loaded.values()), loaded


def _cache_labels(run: dict[str, Any]) -> Counter[str]:
    """How many kernels were compiled, loaded from disk, or already in memory."""
    return Counter(k["cache"] for k in run["kernels"])


def bench_compile(pairs: int) -> dict[str, Any]:
    """Cold then warm disk cache, each in a fresh process, ``pairs`` times; prints medians."""
    names = ("build_program", "program compile_s", "median kernel", "first kernel")
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    labels: list[tuple[Counter[str], Counter[str]]] = []
    for _ in range(pairs):
        with tempfile.TemporaryDirectory(prefix="fusiontune-bench-") as tmp:
            cold, warm = compile_in_fresh_process(tmp), compile_in_fresh_process(tmp)
        (cold_med, cold_by_key), (warm_med, warm_by_key) = _kernel_stats(cold), _kernel_stats(warm)
        first = cold["kernels"][0]["key"]  # carries numba's one-time set-up in either process
        rows["build_program"].append((cold["build_s"], warm["build_s"]))
        rows["program compile_s"].append((cold["compile_s"], warm["compile_s"]))
        rows["median kernel"].append((cold_med, warm_med))
        rows["first kernel"].append((cold_by_key[first], warm_by_key.get(first, float("nan"))))
        labels.append((_cache_labels(cold), _cache_labels(warm)))
    n_kernels = len(cold["kernels"])
    print(
        f"\n== compile time in a fresh process: transformer_block (defaults, {n_kernels} kernels), "
        f"disk cache cold then warm, median of {pairs} pair(s)"
    )
    print(f"  {'':<20}{'cold s':>10}{'warm s':>10}{'cold/warm':>11}")
    figures: dict[str, Any] = {"kernels": n_kernels, "pairs": pairs}
    for name, vals in rows.items():
        c, w = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
        print(f"  {name:<20}{c:>10.3f}{w:>10.3f}{c / w:>10.1f}x")
        figures[name.replace(" ", "_")] = {"cold_s": c, "warm_s": w, "ratio": c / w}
    cold_l, warm_l = labels[-1]
    print(f"  cache labels: cold {dict(cold_l)}, warm {dict(warm_l)}")
    if any(w["compiled"] for _, w in labels):
        print("  note: the warm process compiled kernels: their keys differ between processes")
    ratio = figures["program_compile_s"]["ratio"]
    verdict = "met" if ratio >= WARM_SPEEDUP_GOAL else "NOT met"
    print(
        f"  goal: warm >= {WARM_SPEEDUP_GOAL:.0f}x faster than cold (program compile_s): {ratio:.1f}x, {verdict}"
    )
    figures["cache_labels"] = {"cold": dict(cold_l), "warm": dict(warm_l)}
    return figures


def print_header(info: dict[str, Any], copy_bw: float, copy_nbytes: int) -> None:
    """Machine identity, load, and the copy bandwidth every fraction refers to."""
    print("fusiontune core benchmark")
    print(
        f"  cpu        {info['cpu_model']} ({info['cpu_count']} logical, {info['cpus_usable']} usable)"
    )
    print(f"  threads    numba {info['numba_threads']}")
    print(f"  versions   python {info['python']}, numpy {info['numpy']}, numba {info['numba']}")
    print(f"  loadavg    {' '.join(f'{v:.2f}' for v in os.getloadavg())} (rerun if above ~0.5)")
    print(
        f"  copy bw    {copy_bw / 1e9:.2f} GB/s (parallel numba copy of 2 x {copy_nbytes // MIB} MiB, "
        "read + write bytes)"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables, and return (and optionally write) the figures.

    Args:
        argv: command-line arguments (``--quick``, ``--json PATH``); ``sys.argv`` when None.

    Returns:
        Every printed figure, as written by ``--json``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="16 MiB operands, fewer rounds: a smoke run"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    parser.add_argument("--rounds", type=int, help="interleaved timing rounds (9; quick 3)")
    parser.add_argument("--pairs", type=int, help="cold/warm compile pairs (3; quick 1)")
    args = parser.parse_args(argv)
    side = 2048 if args.quick else 4096
    rounds = args.rounds or (3 if args.quick else 9)
    pairs = args.pairs or (1 if args.quick else 3)
    copy_nbytes = (64 if args.quick else 256) * MIB

    info = machine_info()
    copy_bw = measure_copy_bandwidth(copy_nbytes)
    print_header(info, copy_bw, copy_nbytes)
    rng = np.random.default_rng(0)
    figures: dict[str, Any] = {
        "machine": info,
        "quick": args.quick,
        "copy_bytes_per_s": copy_bw,
        "loadavg_start": list(os.getloadavg()),
        "cases": {},
    }
    for make in (chain_case, add_layernorm_case):
        case = make(side, side, rng)
        figures["cases"][case.name] = bench_case(case, rounds, copy_bw)
    figures["compile"] = bench_compile(pairs)
    figures["loadavg_end"] = list(os.getloadavg())
    print(f"\n  loadavg at end {' '.join(f'{v:.2f}' for v in figures['loadavg_end'])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
        print(f"  wrote {args.json}")
    return figures


if __name__ == "__main__":
    main()
