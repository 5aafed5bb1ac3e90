"""Register blocks of the packed conv, each forced in both layouts, against the rule's pick.

:func:`fusiontune.codegen.conv.plan_packed` picks a dense conv's layout (``rows`` or ``lanes``)
and register block from a cost model: padded work over the block's efficiency
(:func:`fusiontune.codegen.microkernel.efficiency`) times the layout's costs. This measures what
the model predicts. For each dense conv shape it builds the packed kernel with every register
block of :func:`fusiontune.codegen.microkernel.blocks` in each layout (the ``conv_orient`` and
``conv_block`` schedule hints: one compile per layout, the block is a runtime parameter), times
them all in interleaved rounds (``fusiontune.measure.time_interleaved``) and prints per shape the
fastest plan, the rule's pick and the pick's speed as a share of the fastest (best / pick); then
the geometric mean and the worst share over the shapes, the figure a refit of the rule moves.

The shapes: bench_conv.py's dense convs that the rule runs packed (batch 1), and with ``--models
DIR`` every distinct dense conv of those ONNX exports that the rule runs packed, at the export's
batch. Each is a lone Conv (its bias when the export has one) and a Relu epilogue. ``--json``
writes every time, for fitting the rule's constants.

This is a benchmark, not a test: nothing is gated on time. One thread, a quiet machine:

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/bench_blocks.py [--models search_spaces/models/real \\
        --match torchscript] [--rounds 7] [--json blocks.json] [--blocks 6x2,14x1]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from fusiontune.codegen import microkernel
from fusiontune.codegen._window import Window, window_of
from fusiontune.codegen.conv import choose_conv_algo, plan_packed
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import get_op
from fusiontune.measure import MeasureConfig, time_interleaved
from fusiontune.measure.roofline import machine_info
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime.program import build_program

F32 = np.float32


def conv_key(x: tuple[int, ...], w: tuple[int, ...], attrs: dict, bias: bool) -> tuple:
    """A dense conv's identity: input and weight shapes, strides, pads, dilations, bias."""
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
    dil = tuple(attrs.get("dilations", (1, 1)))
    return (tuple(x), tuple(w), strides, pads, dil, bias)


def label_of(key: tuple) -> str:
    x, w, strides, pads, dil, _ = key
    s = f" s{strides[0]}" if strides != (1, 1) else ""
    d = f" d{dil[0]}" if dil != (1, 1) else ""
    return f"{w[2]}x{w[3]}{s}{d} {x[1]}->{w[0]} @{x[2]}" + (f" n{x[0]}" if x[0] > 1 else "")


def conv_graph(key: tuple) -> Graph:
    x, w, strides, pads, dil, bias = key
    rng = np.random.default_rng(0)
    g = GraphBuilder("conv", dtype="float32")
    xin = g.input("x", x)
    wt = g.const((rng.standard_normal(w) / np.sqrt(np.prod(w[1:]))).astype(F32))
    ins = [xin, wt] + ([g.const(rng.standard_normal(w[0]).astype(F32))] if bias else [])
    y = g.op("Conv", *ins, strides=strides, pads=pads, dilations=dil, group=1)
    g.output(g.relu(y))
    return g.build()


def window(graph: Graph) -> Window:
    """The window of ``graph``'s conv, its output shape from the graph's shape inference."""
    conv = next(n for n in graph.nodes if n.op == "Conv")
    attrs = {**get_op("Conv").attrs, **conv.attrs}
    x, w, y = (graph.values[v].shape for v in (conv.inputs[0], conv.inputs[1], conv.outputs[0]))
    return window_of(attrs, x, w[2:], y)


def runs_packed(key: tuple, win: Window) -> bool:
    w = key[1]
    return choose_conv_algo(w[1], w[0], w[2], w[3], 1, win.oh * win.ow, strided=(win.sh, win.sw) != (1, 1),
                            padded=any((win.ph, win.pw, win.pe_h, win.pe_w))) == "packed"


def bench_shapes() -> list[tuple]:
    """bench_conv.py's dense shapes (batch 1, pad k // 2)."""
    from bench_conv import SHAPES

    keys = []
    for _label, c, h, m, k, s, grp in SHAPES:
        if grp == 1:
            p = k // 2
            keys.append(conv_key((1, c, h, h), (m, c, k, k), {"strides": (s, s), "pads": (p, p, p, p)}, False))
    return keys


def model_shapes(folder: Path, match: list[str]) -> list[tuple]:
    """Every distinct dense 2-D conv of the exports in ``folder`` (names holding one of ``match``)."""
    from fusiontune.ir.onnx_import import import_onnx

    keys: dict[tuple, None] = {}
    for path in sorted(folder.glob("*.onnx")):
        if match and not any(m in path.name for m in match):
            continue
        stem = path.name[: -len(".onnx")]
        arrays = next((f for f in (folder / f"{stem}.inputs.npz", folder / f"{stem}.npz") if f.exists()), None)
        shapes = None
        if arrays is not None:
            with np.load(arrays) as z:
                shapes = {k: z[k].shape for k in z.files}
        graph = import_onnx(path, shapes)
        for node in graph.nodes:
            if node.op != "Conv":
                continue
            attrs = {**get_op("Conv").attrs, **node.attrs}
            x, w = graph.values[node.inputs[0]].shape, graph.values[node.inputs[1]].shape
            if int(attrs.get("group", 1)) != 1 or len(x) != 4:
                continue
            keys[conv_key(x, w, attrs, len(node.inputs) == 3)] = None
    return list(keys)


def forced(fused: FusedGraph, orient: str, block: str) -> FusedGraph:
    """``fused`` (the defaults' program: the Relu in the conv's epilogue) with its conv group's
    layout and register block forced."""
    groups = list(fused.groups)
    conv = next(i for i, grp in enumerate(groups) if any(fused.graph.node(n).op == "Conv" for n in grp.nodes))
    sched = {**groups[conv].schedule, "conv_algo": "packed", "conv_orient": orient, "conv_block": block}
    groups[conv] = replace(groups[conv], schedule=sched)
    return fused.with_groups(groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", type=Path, help="also every dense conv of the .onnx exports in DIR")
    ap.add_argument("--match", action="append", default=[], help="with --models: only files whose name holds this")
    ap.add_argument("--no-bench-shapes", action="store_true", help="leave out bench_conv.py's shapes")
    ap.add_argument("--blocks", help="comma-separated register blocks to force (default: every one, microkernel.blocks())")
    ap.add_argument("--json", type=Path, help="write every time here")
    args = ap.parse_args()

    import numba

    blocks = [f"{m}x{v}" for m, v in microkernel.blocks()]
    if args.blocks:
        blocks = [b.strip() for b in args.blocks.split(",")]
    keys = [] if args.no_bench_shapes else bench_shapes()
    if args.models:
        keys += [k for k in model_shapes(args.models, args.match) if k not in keys]
    graphs = {k: conv_graph(k) for k in keys}
    wins = {k: window(g) for k, g in graphs.items()}
    keys = [k for k in keys if runs_packed(k, wins[k])]
    print(f"machine: {machine_info()['cpu_model']}, {microkernel.VECTOR_BITS}-bit vectors, "
          f"threads {numba.config.NUMBA_NUM_THREADS}; {len(keys)} dense packed convs, {len(blocks)} blocks x 2 layouts, "
          f"{args.rounds} interleaved rounds")
    print(f"{'shape':28s} {'best':>12s} {'us':>8s}   {'rule':>12s} {'us':>8s}  best/rule")
    record = []
    shares = []
    for key in keys:
        graph, win = graphs[key], wins[key]
        x = np.random.default_rng(1).standard_normal(key[0]).astype(F32)
        plans = [(o, b) for o in ("rows", "lanes") for b in blocks]
        fused = run_pipeline(graph, FusionConfig.defaults()).fused
        progs = {p: build_program(forced(fused, *p)) for p in plans}
        want = progs[plans[0]].run({"x": x})[graph.outputs[0]].copy()
        for p in plans[1:]:
            got = progs[p].run({"x": x})[graph.outputs[0]]
            assert np.allclose(got, want, rtol=1e-3, atol=1e-4), (label_of(key), p)
        fns: list[Callable[[], object]] = [lambda pr=progs[p], x=x: pr.run({"x": x}) for p in plans]
        timings = time_interleaved(fns, args.rounds, MeasureConfig(warmup=1), min_sample_s=0.01)
        us = {p: t.median_s * 1e6 for p, t in zip(plans, timings, strict=True)}
        best = min(plans, key=lambda p: us[p])
        pick = plan_packed(win, key[1][0], "float32")
        rule = (pick.orient, f"{pick.uk.mr}x{pick.uk.nv}")
        share = us[best] / us[rule] if rule in us else float("nan")
        shares.append(share)
        print(f"{label_of(key):28s} {best[0]:>5s} {best[1]:>6s} {us[best]:8.1f}   {rule[0]:>5s} {rule[1]:>6s} "
              f"{us.get(rule, float('nan')):8.1f}  {share:8.3f}")
        record.append({"shape": label_of(key), "x": key[0], "w": key[1], "strides": key[2], "pads": key[3],
                       "dilations": key[4], "bias": key[5], "rule": list(rule),
                       "us": {f"{o} {b}": v for (o, b), v in us.items()}})
    ok = [s for s in shares if s == s]
    if ok:
        print(f"rule's pick / best: geometric mean {np.exp(np.mean(np.log(ok))):.3f}, worst {min(ok):.3f} "
              f"over {len(ok)} shapes")
    if args.json:
        args.json.write_text(json.dumps({"vector_bits": microkernel.VECTOR_BITS, "blocks": blocks,
                                         "shapes": record}, indent=1))


if __name__ == "__main__":
    main()
