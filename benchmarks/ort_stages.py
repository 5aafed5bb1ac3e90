"""Where a model's time goes beside onnxruntime's: program prefixes against onnxruntime prefix models.

A per-kernel profile (``fusiontune run --profile``) times each kernel alone, and onnxruntime's own
profiler adds several microseconds to every node (SqueezeNet's export: its node times sum to 3x its
run). Neither says where two whole runs part. This times prefixes of both: the first ``k`` kernels
of the default program (its own kernel calls in program order, over its own buffers) against the
model cut after the same value (``onnx.utils.extract_model``: every node that value needs), for each
stage boundary ``k`` (the first kernel, a kernel whose group ends in a Concat or a pool, and the
last kernel, where that group's output is an ONNX value), all in interleaved rounds
(``fusiontune.measure.time_interleaved``). The difference between successive prefixes is a stage's
cost in context: its inputs left in cache by the stage before, and onnxruntime keeping its NCHWc
layout inside the cut. Each cut model converts back to NCHW once at its end, at a cost that follows
the size of the value cut after, so an onnxruntime stage that shrinks its output (a pool) can read
below zero; the running gap is the figure to read.

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/ort_stages.py \\
        search_spaces/models/real/squeezenet1_1.torchscript.onnx [--rounds 9] [--every]

``--every`` cuts after every kernel whose output is an ONNX value, not only at stage boundaries.
The columns: prefix times (us), the stage's time on each (the prefix minus the one before) and the
running gap (fusiontune's prefix minus onnxruntime's: where it grows, that stage loses).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.onnx_import import import_onnx
from fusiontune.measure import MeasureConfig, time_interleaved
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import Program

STAGE_OPS = ("Concat", "MaxPool", "AveragePool", "GlobalAveragePool")


def stages(program: Program, onnx_values: set[str], every: bool) -> list[tuple[int, str, str]]:
    """``(kernels, value, group)``: the prefixes to cut, each after the kernel that writes
    ``value`` (an ONNX value name), in program order."""
    g = program.graph
    cuts = []
    for i, k in enumerate(program.kernels):
        last = g.node(k.nodes[-1])
        out = last.outputs[0]
        boundary = every or i == 0 or i == len(program.kernels) - 1 or last.op in STAGE_OPS
        if boundary and out in onnx_values:
            cuts.append((i + 1, out, k.group))
    return cuts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime's intra-op threads")
    ap.add_argument("--every", action="store_true", help="cut after every kernel, not only at stage boundaries")
    args = ap.parse_args()
    try:
        import onnx
        import onnx.utils
        import onnxruntime as ort
    except ImportError:
        sys.exit("ort_stages: needs onnx and onnxruntime (pip install -e '.[test]')")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ort import session_options

    npz = args.model.with_suffix(".inputs.npz")
    if not npz.exists():
        sys.exit(f"ort_stages: {args.model}: no {npz.name} beside it")
    inputs = dict(np.load(npz))
    graph = import_onnx(str(args.model), input_shapes={k: v.shape for k, v in inputs.items()})
    program = Program(run_pipeline(graph, FusionConfig.defaults()).fused)
    program.bind(inputs)
    calls = program.kernel_calls()
    values = {o for n in onnx.load(str(args.model)).graph.node for o in n.output}
    cuts = stages(program, values, args.every)
    fns: list[Callable[[], object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, value, _ in cuts:
            cut = str(Path(tmp) / f"prefix{k}.onnx")
            onnx.utils.extract_model(str(args.model), cut, list(inputs), [value])
            sess = ort.InferenceSession(cut, session_options(args.threads), providers=["CPUExecutionProvider"])
            fns.append(lambda s=sess: s.run(None, inputs))

            def prefix(head: tuple[Callable[[], None], ...] = calls[:k]) -> None:
                for call in head:
                    call()

            fns.append(prefix)
        timings = time_interleaved(fns, args.rounds, MeasureConfig(warmup=1), min_sample_s=0.05)
    print(f"{args.model.name}: {len(calls)} kernels, {len(cuts)} cuts, {args.rounds} interleaved rounds, "
          f"medians in us; onnxruntime {args.threads} thread(s)")
    print(f"{'kernels':>7}  {'group':44s} {'fusiontune':>10} {'ort':>8} {'stage ft':>9} {'stage ort':>9} {'gap':>7}")
    prev_ft = prev_ort = 0.0
    for (k, _, group), t_ort, t_ft in zip(cuts, timings[0::2], timings[1::2], strict=True):
        ft, o = t_ft.median_s * 1e6, t_ort.median_s * 1e6
        print(f"{k:7d}  {group[-44:]:44s} {ft:10.1f} {o:8.1f} {ft - prev_ft:9.1f} {o - prev_ort:9.1f} {ft - o:7.1f}")
        prev_ft, prev_ort = ft, o


if __name__ == "__main__":
    main()
