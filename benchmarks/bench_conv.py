"""Conv benchmark: im2col + BLAS vs the direct loop kernel vs numpy, and Conv+BN+Relu fused vs not.

Prints, for people:

1. Per ResNet / MobileNet / EfficientNet-style conv shape (batch 1, float32; ``--batch``): the
   median time (and IQR) of the conv kernel with ``conv_algo="im2col"``, ``"shifted"`` (stride 1
   only; a strided conv shows "-"), ``"direct"``, ``"packed"``, ``"plane"`` (grouped convs only),
   ``"chan"`` (depthwise convs only), ``"axpy"`` (1x1 stride-1 convs only),
   of onnxruntime running the same Conv, and of the catalogue's numpy reference (ir/ops.py, einsum over a strided window view), timed in interleaved rounds
   (A B C A B C ...) so that load from other processes hits every variant alike; which algorithm
   wins, and which one :func:`fusiontune.codegen.conv.choose_conv_algo` picks.
2. Conv + BatchNorm + Relu blocks: the program with the registry defaults (BN folded into the
   conv, Relu as the conv kernel's epilogue: one kernel) against everything off (three kernels).
3. The MaxPool and AveragePool shapes of the real exports (``POOLS``): each pool kernel of
   codegen/pool.py (flat, row, phase), onnxruntime, and the kernel the rule picks.

This is a benchmark, not a test: nothing is gated on time. Run it on a quiet machine
(``cat /proc/loadavg`` below ~0.5).

    .venv/bin/python benchmarks/bench_conv.py [--quick] [--rounds N] [--batch N] [--only algos|fused|pools]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fusiontune.codegen._window import window_of
from fusiontune.codegen.conv import choose_conv_algo
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.graph import Graph
from fusiontune.ir.ops import get_op
from fusiontune.measure import MeasureConfig, time_interleaved
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime.program import build_program

F32 = np.float32

# (label, C, H(=W), M, k, stride, group)
SHAPES: tuple[tuple[str, int, int, int, int, int, int], ...] = (
    ("stem 7x7 s2 3->64 @224", 3, 224, 64, 7, 2, 1),
    ("3x3 64->64 @56", 64, 56, 64, 3, 1, 1),
    ("1x1 64->256 @56", 64, 56, 256, 1, 1, 1),
    ("1x1 256->64 @56", 256, 56, 64, 1, 1, 1),
    ("3x3 s2 128->128 @56", 128, 56, 128, 3, 2, 1),
    ("1x1 s2 256->512 @56", 256, 56, 512, 1, 2, 1),
    ("3x3 256->256 @14", 256, 14, 256, 3, 1, 1),
    ("3x3 512->512 @7", 512, 7, 512, 3, 1, 1),
    ("dw 3x3 32 @112", 32, 112, 32, 3, 1, 32),
    ("dw 3x3 s2 96 @112", 96, 112, 96, 3, 2, 96),
    ("dw 3x3 256 @28", 256, 28, 256, 3, 1, 256),
    ("grouped 3x3 g32 256->256 @28", 256, 28, 256, 3, 1, 32),
    ("resnet_cnn stem 3x3 3->32 @64", 3, 64, 32, 3, 1, 1),
    ("resnet_cnn 3x3 32->32 @32", 32, 32, 32, 3, 1, 1),
    ("resnet_cnn 3x3 s2 32->64 @32", 32, 32, 64, 3, 2, 1),
    ("resnet_cnn 3x3 64->64 @16", 64, 16, 64, 3, 1, 1),
    ("conv_bn_relu 3x3 32->64 @56", 32, 56, 64, 3, 1, 1),
    # EfficientNet-B0's depthwise convs at 224x224 (MBConv stages 2 to 7)
    ("effnet dw5x5 s2 144 @56", 144, 56, 144, 5, 2, 144),
    ("effnet dw5x5 240 @28", 240, 28, 240, 5, 1, 240),
    ("effnet dw3x3 s2 240 @28", 240, 28, 240, 3, 2, 240),
    ("effnet dw3x3 480 @14", 480, 14, 480, 3, 1, 480),
    ("effnet dw5x5 s2 672 @14", 672, 14, 672, 5, 2, 672),
    ("effnet dw5x5 1152 @7", 1152, 7, 1152, 5, 1, 1152),
    # 1x1 convs with a short reduction (the axpy kernel): EfficientNet-B0's first expansion,
    # MobileNetV3-small's and SqueezeNet 1.1's first expand
    ("effnet 1x1 16->96 @112", 16, 112, 96, 1, 1, 1),
    ("mbv3 1x1 16->72 @28", 16, 28, 72, 1, 1, 1),
    ("squeezenet 1x1 16->64 @55", 16, 55, 64, 1, 1, 1),
)
QUICK = ("3x3 64->64 @56", "1x1 256->64 @56", "dw 3x3 32 @112")


def conv_graph(c: int, h: int, m: int, k: int, stride: int, group: int, bn_relu: bool = False, batch: int = 1) -> Graph:
    rng = np.random.default_rng(0)
    g = GraphBuilder("conv", dtype="float32")
    x = g.input("x", (batch, c, h, h))
    w = g.const((rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(F32))
    p = k // 2
    y = g.op("Conv", x, w, strides=(stride, stride), pads=(p, p, p, p), group=group)
    if bn_relu:
        params = [rng.uniform(0.5, 1.5, (m, 1, 1)), rng.standard_normal((m, 1, 1)),
                  rng.standard_normal((m, 1, 1)), rng.uniform(0.5, 1.5, (m, 1, 1))]
        y = g.relu(g.op("BatchNorm", y, *(g.const(a.astype(F32)) for a in params)))
    g.output(y)
    return g.build()


def with_algo(graph: Graph, algo: str) -> FusedGraph:
    fused = FusedGraph.singletons(graph)
    return fused.with_groups([replace(grp, schedule={"conv_algo": algo}) for grp in fused.groups])


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, min_s: float = 0.05) -> dict[str, tuple[float, float]]:
    """Median and IQR (ms) of each callable, timed in interleaved rounds
    (``fusiontune.measure.time_interleaved``); a sample repeats the call for about ``min_s``."""
    timings = time_interleaved(list(fns.values()), rounds, MeasureConfig(warmup=1), min_sample_s=min_s)
    return {name: (t.median_s * 1e3, t.iqr_s * 1e3) for name, t in zip(fns, timings, strict=True)}


def ort_conv(c: int, h: int, m: int, k: int, stride: int, group: int, w: np.ndarray, batch: int,
             threads: int) -> Callable[[np.ndarray], object] | None:
    """The same Conv as a one-node ONNX model in an onnxruntime session (benchmarks/_ort.py,
    ``threads`` intra-op threads), or None where onnxruntime is not installed."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    p = k // 2
    o = (h + 2 * p - k) // stride + 1
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride, stride], pads=[p, p, p, p], group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m, o, o])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from _ort import session_options

    sess = ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})


def ort_floor(threads: int) -> Callable[[], object] | None:
    """onnxruntime's least cost of a run: one Relu over 8 floats (3.4 us here). Every onnxruntime
    time below includes it, where a fusiontune program's ``execute`` pays about 0.2 us a kernel,
    so the tables time it in the same rounds and give the ratio without it too."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "floor",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from _ort import session_options

    sess = ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
    x = np.ones((1, 8), F32)
    return lambda: sess.run(None, {"x": x})


def bench_algos(rounds: int, quick: bool, batch: int = 1) -> None:
    """Per conv shape: each algorithm, onnxruntime, numpy; GFLOP/s of the rule's pick, and
    onnxruntime / the rule's pick (> 1: fusiontune is faster)."""
    import numba

    from fusiontune.measure.roofline import measure_peak_flops

    algos = ("im2col", "shifted", "direct", "packed", "plane", "chan", "axpy")
    threads = numba.config.NUMBA_NUM_THREADS
    peak = measure_peak_flops(threads)
    print(f"threads: {threads} (NUMBA_NUM_THREADS; onnxruntime intra-op alike); ms: median ±IQR of {rounds} interleaved rounds")
    print(f"measured float32 peak on {threads} thread(s): {peak / 1e9:.1f} GFLOP/s (the faster of sgemm and the conv micro-kernel)")
    floor = ort_floor(threads)
    print(f"{'shape':30s}" + "".join(f"{a:>14s}" for a in (*algos, "onnxruntime", "numpy"))
          + "  winner   rule     GFLOP/s  %peak  ort/rule  (ort - its floor)/rule")
    ref = get_op("Conv").reference
    ratios: list[float] = []
    nets: list[float] = []
    for label, c, h, m, k, s, grp in SHAPES:
        if quick and label not in QUICK:
            continue
        graph = conv_graph(c, h, m, k, s, grp, batch=batch)
        x = np.random.default_rng(1).standard_normal((batch, c, h, h)).astype(F32)
        # a strided conv runs im2col for "shifted"; plane and chan are depthwise kernels (a dense
        # conv's channels would each make a pass over the plane; chan needs one channel per group)
        run = [a for a in algos if (a != "shifted" or s == 1) and (a != "plane" or grp > 1)
               and (a != "chan" or c == m == grp) and (a != "axpy" or (k == 1 and s == 1 and grp == 1))]
        progs = {a: build_program(with_algo(graph, a)) for a in run}
        conv = graph.nodes[0]
        wv = graph.constants[conv.inputs[1]]
        attrs = {**get_op("Conv").attrs, **conv.attrs}
        want = progs["im2col"].run({"x": x})[graph.outputs[0]].copy()
        for a in run[1:]:
            got = progs[a].run({"x": x})[graph.outputs[0]]
            assert np.allclose(got, want, rtol=1e-3, atol=1e-4), (label, a)
        fns: dict[str, Callable[[], object]] = {a: (lambda p=progs[a], x=x: p.run({"x": x})) for a in run}
        ort_fn = ort_conv(c, h, m, k, s, grp, wv, batch, threads)
        if ort_fn is not None:
            assert np.allclose(ort_fn(x)[0], want, rtol=1e-3, atol=1e-4), (label, "onnxruntime")
            fns["onnxruntime"] = lambda f=ort_fn, x=x: f(x)
        fns["numpy"] = lambda a=attrs, x=x, w=wv: ref(a, x, w)
        if floor is not None and "onnxruntime" in fns:
            fns["floor"] = floor
        res = interleaved(fns, rounds)
        winner = min(run, key=lambda a: res[a][0])
        o = -(-h // s)
        rule = choose_conv_algo(c // grp, m // grp, k, k, grp, o * o, strided=s > 1)
        rule = rule if rule in res else "im2col"
        gflops = 2 * batch * m * o * o * (c // grp) * k * k / (res[rule][0] * 1e-3) / 1e9
        ratio = res["onnxruntime"][0] / res[rule][0] if "onnxruntime" in res else float("nan")
        net = (res["onnxruntime"][0] - res["floor"][0]) / res[rule][0] if "floor" in res else float("nan")
        ratios.append(ratio)
        nets.append(net)
        cell = {a: f"{res[a][0]:7.3f} ±{res[a][1]:4.2f}" if a in res else "-" for a in (*algos, "onnxruntime", "numpy")}
        print(f"{label:30s}" + "".join(f"{cell[a]:>14s}" for a in (*algos, "onnxruntime", "numpy"))
              + f"  {winner:7s}  {rule:7s} {gflops:7.1f}  {100 * gflops * 1e9 / peak:5.0f}  {ratio:6.2f}x  {net:6.2f}x")
    if ratios and all(r == r for r in ratios):
        print(f"onnxruntime / fusiontune (the rule's pick): geometric mean {np.exp(np.mean(np.log(ratios))):.2f}x, "
              f"min {min(ratios):.2f}x over {len(ratios)} shapes")
    if nets and all(r == r and r > 0 for r in nets):
        print(f"the same without onnxruntime's per-run floor (ort_floor): geometric mean "
              f"{np.exp(np.mean(np.log(nets))):.2f}x, min {min(nets):.2f}x")


def bench_fused(rounds: int, quick: bool) -> None:
    print(f"\n{'Conv+BN+Relu':32s} {'fused ms':>14s} {'unfused ms':>14s}  kernels  speedup")
    on = FusionConfig.resolve()
    off = FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False})
    for label, c, h, m, k, s, grp in SHAPES:
        if quick and label not in QUICK:
            continue
        graph = conv_graph(c, h, m, k, s, grp, bn_relu=True)
        x = np.random.default_rng(1).standard_normal((1, c, h, h)).astype(F32)
        fused = build_program(run_pipeline(graph, on).fused)
        unfused = build_program(run_pipeline(graph, off).fused)
        res = interleaved({"fused": lambda p=fused, x=x: p.run({"x": x}), "unfused": lambda p=unfused, x=x: p.run({"x": x})}, rounds)
        cell = {a: f"{res[a][0]:8.2f} ±{res[a][1]:4.2f}" for a in res}
        kernels = f"{fused.kernel_count} vs {unfused.kernel_count}"
        print(f"{label:32s} {cell['fused']:>14s} {cell['unfused']:>14s}  {kernels:7s}  {res['unfused'][0] / res['fused'][0]:.2f}x")


# (label, op, (N, C, H, W), kernel, stride, pad, ceil_mode): the pools of the real exports
POOLS: tuple[tuple[str, str, tuple[int, int, int, int], int, int, int, int], ...] = (
    ("squeezenet max 3x3 s2 64 @31", "MaxPool", (2, 64, 31, 31), 3, 2, 0, 1),
    ("squeezenet max 3x3 s2 128 @15", "MaxPool", (2, 128, 15, 15), 3, 2, 0, 1),
    ("squeezenet max 3x3 s2 256 @7", "MaxPool", (2, 256, 7, 7), 3, 2, 0, 1),
    ("resnet18 max 3x3 s2 p1 64 @32", "MaxPool", (2, 64, 32, 32), 3, 2, 1, 0),
    ("resnet18 max 3x3 s2 p1 64 @112", "MaxPool", (1, 64, 112, 112), 3, 2, 1, 0),
    ("vgg max 2x2 s2 64 @64", "MaxPool", (1, 64, 64, 64), 2, 2, 0, 0),
    ("densenet avg 2x2 s2 128 @16", "AveragePool", (2, 128, 16, 16), 2, 2, 0, 0),
    ("densenet avg 2x2 s2 128 @32", "AveragePool", (2, 128, 32, 32), 2, 2, 0, 0),
    ("densenet avg 2x2 s2 128 @56", "AveragePool", (1, 128, 56, 56), 2, 2, 0, 0),
    # the pools of the corpus' narrow exports themselves (search_spaces/models/real, batch 2)
    ("squeezenet export max 3x3 s2 16 @31", "MaxPool", (2, 16, 31, 31), 3, 2, 0, 1),
    ("squeezenet export max 3x3 s2 32 @15", "MaxPool", (2, 32, 15, 15), 3, 2, 0, 1),
    ("squeezenet export max 3x3 s2 64 @7", "MaxPool", (2, 64, 7, 7), 3, 2, 0, 1),
    ("resnet18 export max 3x3 s2 p1 8 @32", "MaxPool", (2, 8, 32, 32), 3, 2, 1, 0),
    ("densenet export max 3x3 s2 p1 12 @32", "MaxPool", (2, 12, 32, 32), 3, 2, 1, 0),
    ("densenet export avg 2x2 s2 24 @16", "AveragePool", (2, 24, 16, 16), 2, 2, 0, 0),
)


def pool_graph(op: str, shape: tuple[int, int, int, int], k: int, stride: int, pad: int, ceil: int) -> Graph:
    g = GraphBuilder("pool", dtype="float32")
    g.output(g.op(op, g.input("x", shape), kernel_shape=(k, k), strides=(stride, stride), pads=(pad,) * 4,
                  ceil_mode=ceil))
    return g.build()


def ort_pool(op: str, shape: tuple[int, int, int, int], k: int, stride: int, pad: int, ceil: int, out: tuple[int, ...],
             threads: int) -> Callable[[np.ndarray], object] | None:
    """The same pool as a one-node onnxruntime session, or None where onnxruntime is not installed."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                            ceil_mode=ceil)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from _ort import session_options

    sess = ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})


def bench_pools(rounds: int) -> None:
    """Per pool of the real exports: each kernel (flat, row, phase; codegen/pool.py),
    onnxruntime, and which one the rule picks; outputs checked against onnxruntime's first."""
    import numba

    from fusiontune.codegen import pool

    threads = numba.config.NUMBA_NUM_THREADS
    rule, avg_rule = pool.max_pool_algo, pool.average_pool_algo
    print(f"\npools, {threads} thread(s); us: median of {rounds} interleaved rounds")
    floor = ort_floor(threads)
    print(f"{'shape':34s}{'flat':>9s}{'row':>9s}{'phase':>9s}{'onnxruntime':>13s}{'ort floor':>11s}  rule   "
          "onnxruntime / rule, with and without its floor")
    try:
        for label, op, shape, k, s, p, ceil in POOLS:
            graph = pool_graph(op, shape, k, s, p, ceil)
            x = np.random.default_rng(1).standard_normal(shape).astype(F32)
            out = graph.values[graph.outputs[0]].shape
            fns: dict[str, Callable[[], object]] = {}
            want = None
            ort_fn = ort_pool(op, shape, k, s, p, ceil, out, threads)
            if ort_fn is not None:
                want = ort_fn(x)[0]
                fns["onnxruntime"] = lambda f=ort_fn, x=x: f(x)
            algos = pool.MAX_POOL_ALGOS if op == "MaxPool" else ("flat", "row", "phase")
            for algo in algos:
                pool.max_pool_algo = pool.average_pool_algo = lambda win, a=algo: a
                prog = build_program(FusedGraph.singletons(graph))
                got = prog.run({"x": x})[graph.outputs[0]]
                if want is not None:
                    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{label} {algo}")
                fns[algo] = lambda p=prog: p.execute()
            pool.max_pool_algo, pool.average_pool_algo = rule, avg_rule
            if floor is not None and "onnxruntime" in fns:
                fns["floor"] = floor
            res = interleaved(fns, rounds)
            win = window_of({**get_op(op).attrs, **graph.nodes[0].attrs}, shape, (k, k), out)
            pick = (rule if op == "MaxPool" else avg_rule)(win)
            cells = "".join(f"{res[a][0] * 1e3:9.1f}" if a in res else f"{'-':>9s}" for a in ("flat", "row", "phase"))
            ort_us = f"{res['onnxruntime'][0] * 1e3:13.1f}" if "onnxruntime" in res else f"{'-':>13s}"
            floor_us = f"{res['floor'][0] * 1e3:11.1f}" if "floor" in res else f"{'-':>11s}"
            ratio = f"{res['onnxruntime'][0] / res[pick][0]:.2f}x" if "onnxruntime" in res else "-"
            if "floor" in res:
                ratio += f" {(res['onnxruntime'][0] - res['floor'][0]) / res[pick][0]:.2f}x"
            print(f"{label:34s}{cells}{ort_us}{floor_us}  {pick:6s} {ratio}", flush=True)
    finally:
        pool.max_pool_algo, pool.average_pool_algo = rule, avg_rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=("algos", "fused", "pools"), default=None)
    ap.add_argument("--batch", type=int, default=1, help="images per conv in the algorithm table")
    args = ap.parse_args()
    if args.only in (None, "algos"):
        bench_algos(args.rounds, args.quick, args.batch)
    if args.only in (None, "fused"):
        bench_fused(args.rounds, args.quick)
    if args.only in (None, "pools"):
        bench_pools(args.rounds)


if __name__ == "__main__":
    main()
