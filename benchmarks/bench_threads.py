"""Does a program stall when other work shares the cores? Quiet against busy, per threading layer.

For each threading layer a child process builds the programs (defaults configuration), then
alternates quiet and busy phases: in a busy phase ``--hogs`` other processes spin on the cores
(``while True: pass``, what any CPU-bound neighbour does to a scheduler). Each phase times every
program ``--calls`` times; the medians and 90th percentiles of the phases are pooled per program.
The figure is the ratio busy median / quiet median, taken in one child on the same machine, and
the same program with one numba thread beside it (which no barrier can stall). The last column,
the busy program's mean time over the one-thread program's beside the same processes, is what
thread waiting costs beyond the cores the other processes took. Means, not medians: beside
CPU-bound processes a call takes its own time or that plus a scheduler slice (the training step
2.0 or 6.0 ms, often alternating call by call, on one thread as on two), and the median of such a
mix jumps between the two from one run to the next::

    python benchmarks/bench_threads.py                         # omp and tbb, 1 hog, 3 rounds
    python benchmarks/bench_threads.py --layers omp,tbb --hogs 2 --models search_spaces/models/real/convnext_tiny.dynamo.onnx

A layer that is not installed is reported and skipped. ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKLOADS = ("transformer_block", "llama_block", "transformer_block:train")
HOG = "while True: pass"


def _workload(spec: str) -> Any:
    from fusiontune.ir.training import TrainSpec
    from fusiontune.workloads.onnx_model import OnnxSource, load_workload

    name, _, mode = spec.partition(":")
    train = TrainSpec() if mode == "train" else None
    if name.endswith(".onnx"):
        stem = Path(name).name.removesuffix(".onnx")
        inputs = Path(name).parent / f"{stem}.inputs.npz"
        source = OnnxSource.make(name, {}, {}, inputs if inputs.is_file() else None)
        return load_workload(source, train=train)
    return load_workload(name, {}, train)


def _phase(programs: dict[str, Any], calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, program in programs.items():
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            program.execute()
            times.append(time.perf_counter() - t0)
        out[name] = times
    return out


def child(args: argparse.Namespace) -> None:
    """Build, then alternate quiet and busy phases; print one JSON line of per-program samples."""
    from fusiontune.codegen.threading_layer import (
        configure_threading,
        num_threads,
        set_num_threads,
        threading_layer,
    )
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.tune.evaluate import build_candidate

    configure_threading()
    programs = {}
    for spec in args.workloads:
        w = _workload(spec)
        p = build_candidate(w, FusionConfig.defaults()).program
        p.bind(w.inputs)
        for _ in range(3):
            p.execute()
        programs[spec] = p
    threads = num_threads()
    samples: dict[str, dict[str, list[float]]] = {k: {"quiet": [], "busy": [], "one_thread": []} for k in programs}
    for r in range(args.rounds):
        for name, t in _phase(programs, args.calls).items():
            samples[name]["quiet"] += t
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
        try:
            time.sleep(0.3)
            # The two busy phases in turn, each first every other round: the spinning processes'
            # standing with the scheduler changes as they age, and with the one-thread phase
            # always second it read 0.96 ms against 1.26-1.34 for two threads (transformer_block),
            # where alternating blocks of calls beside the same processes gave both 1.41 ms.
            for count in ((threads, 1) if r % 2 == 0 else (1, threads)):
                set_num_threads(count)
                for name, t in _phase(programs, args.calls).items():
                    samples[name]["busy" if count == threads else "one_thread"] += t
            set_num_threads(threads)
        finally:
            for h in hogs:
                h.kill()
            for h in hogs:
                h.wait()
    kernels = {k: p.kernel_count for k, p in programs.items()}
    print(json.dumps({"layer": threading_layer(), "threads": threads, "kernels": kernels, "samples": samples}))


def run_layer(layer: str, args: argparse.Namespace) -> dict[str, Any] | None:
    env = {**os.environ, "FUSIONTUNE_THREADING": layer}
    cmd = [sys.executable, __file__, "--child", "--workloads", *args.workloads]
    cmd += ["--hogs", str(args.hogs), "--calls", str(args.calls), "--rounds", str(args.rounds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        print(f"{layer}: not measured: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="omp,tbb", help="threading layers, comma-separated (default omp,tbb)")
    ap.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS),
                    help="built-in names or .onnx paths; NAME:train measures the training step")
    ap.add_argument("--models", nargs="*", default=[], help="more .onnx files (inputs from MODEL.inputs.npz beside)")
    ap.add_argument("--hogs", type=int, default=1, help="spinning processes in a busy phase (default 1)")
    ap.add_argument("--calls", type=int, default=40, help="timed calls per program per phase (default 40)")
    ap.add_argument("--rounds", type=int, default=3, help="quiet/busy alternations (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write the figures there")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.workloads = [*args.workloads, *args.models]
    if args.child:
        child(args)
        return 0
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.hogs} hog(s) in busy phases,"
          f" {args.rounds} rounds x {args.calls} calls per phase")
    rows, figures = [], {}
    for layer in args.layers.split(","):
        got = run_layer(layer.strip(), args)
        if got is None:
            continue
        figures[layer] = got
        for name, s in got["samples"].items():
            quiet, busy, one = (np.median(s[k]) for k in ("quiet", "busy", "one_thread"))
            p90 = np.percentile(s["busy"], 90)
            waiting = np.mean(s["busy"]) / np.mean(s["one_thread"])
            rows.append((Path(name).name, got["layer"], got["kernels"][name], quiet, busy, p90, one, busy / quiet, waiting))
    print(f"{'program':<28} {'layer':<9} {'kernels':>7} {'quiet':>11} {'busy':>11} {'busy p90':>11}"
          f" {'1 thread busy':>14} {'busy/quiet':>10} {'busy/1 thread, means':>21}")
    for name, layer, k, quiet, busy, p90, one, ratio, waiting in rows:
        print(f"{name:<28} {layer:<9} {k:>7} {_ms(quiet):>11} {_ms(busy):>11} {_ms(p90):>11} {_ms(one):>14}"
              f" {ratio:>9.2f}x {waiting:>20.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
