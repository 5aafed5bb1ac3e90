"""Approximate math benchmark: fused kernels under the default math vs ``schedule["math"] = "approx"``.

numba from PyPI has no SVML, so a loop that calls libm's ``expf`` / ``tanhf`` / ``erff`` stays
scalar. The default math calls fusiontune/codegen/numerics.py's float64-inside functions
(``exp_f32``, ``tanh_f32``, ``erf_f32``: float32 results as exact as libm's, vectorized); with
``math="approx"`` the kernel calls the float32 polynomial approximations there, cheaper again. For each case (a softmax over
the last axis, the erf and tanh GELUs and SiLU, float32 operands of >= 16 MiB) this prints:

* the kernel time of each variant (median and IQR over interleaved rounds A B A B ..., so that load
  from other processes hits both alike), and default / approx;
* each variant's worst relative error against the float64 interpreter, with a floor of
  ``1e-3 * max |reference|`` under the denominator (``fusiontune.measure.compare``).

This is a benchmark, not a test: nothing is gated on time. Run it on a quiet machine
(``cat /proc/loadavg`` below ~1).

    .venv/bin/python benchmarks/bench_approx.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import interleaved  # noqa: E402  (a sibling script, not a package)

from fusiontune.ir.builder import GraphBuilder, Tensor  # noqa: E402
from fusiontune.ir.graph import Graph  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.measure import compare, machine_info  # noqa: E402
from fusiontune.passes.fused_graph import FusedGraph, Group  # noqa: E402
from fusiontune.runtime.program import Program, build_program  # noqa: E402

MIB = 1 << 20

CASES: dict[str, tuple[str, Callable[[GraphBuilder, Tensor], Tensor]]] = {
    "softmax": ("softmax(x) over the last axis", lambda g, x: g.softmax(x)),
    "gelu_erf": ("0.5 x (1 + erf(x / sqrt 2))", lambda g, x: g.gelu(x)),
    "gelu_tanh": ("GELU, tanh form", lambda g, x: g.gelu(x, approximate="tanh")),
    "silu": ("x / (1 + exp(-x))", lambda g, x: g.silu(x)),
}


def case_graph(name: str, rows: int, cols: int) -> Graph:
    """One op over a float32 (rows, cols) input; the whole graph is one kernel."""
    g = GraphBuilder(name)
    g.output(CASES[name][1](g, g.input("x", (rows, cols))))
    return g.build()


def program(graph: Graph, schedule: dict[str, str]) -> Program:
    """All of ``graph`` as one group under ``schedule``, compiled."""
    group = Group("all", tuple(n.name for n in graph.nodes), schedule=schedule)
    prog = build_program(FusedGraph.singletons(graph).with_groups([group]))
    assert prog.kernel_count == 1
    return prog


def bench_case(name: str, rows: int, cols: int, rounds: int) -> dict[str, Any]:
    """default vs approx for one case; prints its table and returns its figures."""
    graph = case_graph(name, rows, cols)
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32) * np.float32(3.0)
    inputs = {"x": x}
    ref = run_graph(graph, inputs, dtype="float64")
    variants = {"default": program(graph, {}), "approx": program(graph, {"math": "approx"})}
    errors = {}
    for label, prog in variants.items():
        out = {k: np.array(v, copy=True) for k, v in prog.run(inputs).items()}
        errors[label] = compare(out, ref).max_rel
        prog.bind(inputs)
    t = interleaved({label: prog.execute for label, prog in variants.items()}, rounds, 2)
    ratio = t["default"].median_s / t["approx"].median_s
    print(f"\n== {name}: {CASES[name][0]}, x {rows}x{cols} float32 ({x.nbytes / MIB:.0f} MiB), {rounds} interleaved rounds")
    print(f"  {'variant':<10}{'median ms':>12}{'IQR ms':>10}{'max rel err':>14}")
    for label, timing in t.items():
        print(f"  {label:<10}{timing.median_s * 1e3:>12.3f}{timing.iqr_s * 1e3:>10.3f}{errors[label]:>14.2e}")
    print(f"  default/approx = {ratio:.2f}x")
    return {
        "shape": [rows, cols],
        "timings": {
            k: {"median_s": v.median_s, "iqr_s": v.iqr_s, "samples_s": list(v.samples_s)} for k, v in t.items()
        },
        "max_rel_error": errors,
        "default_over_approx": ratio,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables, and return (and optionally write) the figures.

    Args:
        argv: command-line arguments (``--quick``, ``--json PATH``, ``--rounds N``); ``sys.argv``
            when None.

    Returns:
        Every printed figure, as written by ``--json``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 MiB operands, fewer rounds: a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    parser.add_argument("--rounds", type=int, help="interleaved timing rounds (15; quick 5)")
    args = parser.parse_args(argv)
    rows, cols = (1024, 1024) if args.quick else (4096, 1024)
    rounds = args.rounds or (5 if args.quick else 15)
    info = machine_info()
    print("fusiontune approximate-math benchmark")
    print(f"  cpu        {info['cpu_model']} ({info['cpu_count']} logical, {info['cpus_usable']} usable)")
    print(f"  threads    numba {info['numba_threads']}")
    print(f"  versions   python {info['python']}, numpy {info['numpy']}, numba {info['numba']}")
    print(f"  loadavg    {' '.join(f'{v:.2f}' for v in os.getloadavg())} (rerun if above ~1)")
    figures: dict[str, Any] = {
        "machine": info,
        "quick": args.quick,
        "loadavg_start": list(os.getloadavg()),
        "cases": {},
    }
    for name in CASES:
        figures["cases"][name] = bench_case(name, rows, cols, rounds)
    figures["loadavg_end"] = list(os.getloadavg())
    print(f"\n  loadavg at end {' '.join(f'{v:.2f}' for v in figures['loadavg_end'])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
        print(f"  wrote {args.json}")
    return figures


if __name__ == "__main__":
    main()
