"""Attention benchmark: the fused flash-attention kernel vs the unfused fusiontune program vs numpy.

Each case is the attention subgraph as the built-in workloads write it: ``q @ transpose(k)``,
scaled, optionally plus a causal (Sq, Sk) mask constant, a decomposed softmax, ``@ v``; float32,
inputs q, k, v of shape (batch, heads, seq, head_dim). Variants:

* ``fused kv=N``: the registry defaults (FlashAttentionFusionPass on) with the split point
  ``FlashAttentionFusionPass.kv_block = N`` (0: all keys in one block): one kernel;
* ``fused approx``: the same with ``kv_block = 64`` and ApproxTranscendentalFusionPass on
  (``exp_approx``, inexact);
* ``unfused``: the defaults with FlashAttentionFusionPass off: MatMul, Softmax, MatMul kernels
  (and the Transpose of k), the scores written to memory between them;
* ``numpy``: the same math as numpy expressions (its BLAS limited to one thread, as in every
  fusiontune process, see runtime/threads.py).

Timing: every variant once per round, in turn, for ``--rounds`` rounds (bench_core.interleaved),
medians in ms; ``unfused/best`` and ``numpy/best`` divide by the fastest exact fused variant
(> 1: the fused kernel is faster). Every variant is checked against the float64 interpreter first
(max abs error printed). This is a benchmark, not a test: run it on a quiet machine
(``cat /proc/loadavg`` below ~1).

    .venv/bin/python benchmarks/bench_attention.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import interleaved  # noqa: E402  (a sibling script, not a package)

from fusiontune.config.fusion_config import FusionConfig  # noqa: E402
from fusiontune.ir.builder import GraphBuilder  # noqa: E402
from fusiontune.ir.graph import Graph  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.passes.pipeline import run_pipeline  # noqa: E402
from fusiontune.runtime.program import Program, build_program  # noqa: E402
from fusiontune.runtime.threads import single_threaded_blas  # noqa: E402

SHAPES = [  # (batch, heads, seq, head_dim)
    (2, 4, 64, 32),
    (2, 8, 128, 64),
    (2, 8, 256, 64),
    (2, 12, 512, 64),
]
QUICK = [(2, 4, 64, 32), (2, 8, 256, 64)]
KV_BLOCKS = (0, 64, 128)
PASS = "FlashAttentionFusionPass"


def attention_graph(b: int, h: int, s: int, d: int, causal: bool) -> Graph:
    """The attention subgraph of workloads/builtin.py's blocks, decomposed softmax included."""
    g = GraphBuilder(f"attention_{b}x{h}x{s}x{d}{'_causal' if causal else ''}")
    q, k, v = (g.input(n, (b, h, s, d)) for n in "qkv")
    scores = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 1.0 / math.sqrt(d))
    if causal:
        scores = g.add(scores, g.const(np.triu(np.full((s, s), -1e9, np.float32), k=1)))
    g.output(g.matmul(g.softmax_decomposed(scores), v))
    return g.build()


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def program(graph: Graph, config: FusionConfig, inputs: dict[str, np.ndarray]) -> tuple[Program, float]:
    """The bound program of ``graph`` under ``config`` and its max abs error against float64."""
    prog = build_program(run_pipeline(graph, config).fused)
    out = prog.run(inputs)[graph.outputs[0]]
    want = run_graph(graph, inputs, dtype="float64")[graph.outputs[0]]
    return prog, float(np.max(np.abs(out - want)))


def bench_case(shape: tuple[int, int, int, int], causal: bool, rounds: int) -> None:
    b, h, s, d = shape
    graph = attention_graph(b, h, s, d, causal)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((b, h, s, d)).astype(np.float32) for n in "qkv"}
    mask = np.triu(np.full((s, s), -1e9, np.float32), k=1) if causal else None
    variants: dict[str, tuple[Program, float]] = {}
    base = FusionConfig.defaults()
    for kv in KV_BLOCKS:
        variants[f"fused kv={kv}"] = program(graph, base.with_values(base.switches, {f"{PASS}.kv_block": kv}), inputs)
    approx = base.with_values({**base.switches, "ApproxTranscendentalFusionPass": True}, {f"{PASS}.kv_block": 64})
    variants["fused approx"] = program(graph, approx, inputs)
    variants["unfused"] = program(graph, base.with_switches(**{PASS: False}), inputs)
    fns = {name: prog.execute for name, (prog, _) in variants.items()}
    fns["numpy"] = lambda: numpy_attention(inputs["q"], inputs["k"], inputs["v"], mask)
    t = interleaved(fns, rounds, 2)
    med = {name: t[name].median_s * 1e3 for name in fns}
    best = min(med[f"fused kv={kv}"] for kv in KV_BLOCKS)
    print(
        f"{b}x{h}x{s}x{d:<4}{'causal' if causal else 'none':<8}"
        + "".join(f"{med[n]:>13.3f}" for n in fns)
        + f"{med['unfused'] / best:>10.2f}x{med['numpy'] / best:>9.2f}x"
        + f"   err {max(e for name, (_, e) in variants.items() if name != 'fused approx'):.1e}"
        + f" (approx {variants['fused approx'][1]:.1e})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, fewer rounds")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15, quick 5)")
    args = parser.parse_args()
    single_threaded_blas()
    rounds = args.rounds or (5 if args.quick else 15)
    print(f"# loadavg {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}, {rounds} interleaved rounds, float32, medians in ms")
    names = [f"fused kv={kv}" for kv in KV_BLOCKS] + ["fused approx", "unfused", "numpy"]
    print(f"{'BxHxSxD':<15}{'mask':<8}" + "".join(f"{n:>13}" for n in names) + f"{'unf/best':>11}{'np/best':>10}")
    for shape in QUICK if args.quick else SHAPES:
        for causal in (False, True):
            bench_case(shape, causal, rounds)


if __name__ == "__main__":
    main()
