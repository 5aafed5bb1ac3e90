"""Training-step benchmark: the recompute split point's memory/time trade, and torch eager beside it.

Part 1, recompute: the training step of a built-in block (default ``transformer_block``: MSE loss,
backward, SGD with momentum 0.9) under the registry defaults with
``RecomputeSplitFusionPass.recompute`` = 0, 1, 2, 3 (0: store every activation the backward
reads; 1: recompute elementwise/layout chains such as the GELU output; 2: also normalizations;
3: also the attention core). Per value: kernels, the planned peak of the program
(``Program.peak_bytes``, what ``fusiontune run --train`` prints), the bytes of forward activations
buffered for the backward, the error against the float64 reference (max_rel over loss,
gradients and updated weights as ``Workload.errors`` judges them), and the runtime.

Part 2, torch: the same step in torch eager on CPU (``torch.set_num_threads(2)``): an nn-free
module over the SAME weights (the workload's weight inputs by name, ``x @ W + b``), post-norm,
erf GELU, softmax attention, the same input, target, MSE loss and ``torch.optim.SGD(momentum=0.9)``
with the same momentum buffers. Its loss, gradients, updated weights and momentum buffers are first
checked against fusiontune's float64 reference (printed); then torch's step (zero_grad, forward,
loss, backward, optimizer.step) is timed against fusiontune's defaults program and its all-off
program (and again with each variant timed in a block of its own, which shows how much the two
runtimes' thread pools disturb each other when interleaved). ``--no-torch`` (or torch not
installed) skips part 2.

Timing: every variant once per round, in turn, for ``--rounds`` rounds, in this one process
(``fusiontune.measure.time_interleaved``: too wide a spread is measured again); medians and IQRs in
ms, ratios of medians. Each step updates its weights in place, so later calls train on: the cost
of a step does not depend on the values. This is a benchmark, not a test: run it on a quiet
machine (``cat /proc/loadavg`` below ~1); on a shared machine the spreads say how far to trust it.

    .venv/bin/python benchmarks/bench_train.py [--workload transformer_block] [--rounds 15]
        [--sizes batch=2,seq=64,hidden=128,heads=4,ffn=512] [--levels 0,1,2,3] [--no-torch]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

# Two OpenMP pools share the 2 cores here (torch's and numba's): interleaved in one process, each
# one's threads spin after their work while the other's run, and both look several times slower
# than alone. Passive waiting (set before either pool starts) is the fair setting for both.
# A variant timed alone in a process of its own (--alone) keeps every runtime's own default.
if "--alone" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.training import LOSS, TrainSpec
from fusiontune.measure import MeasureConfig, Timing, time_interleaved
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.passes.ub.recompute import PREFIX, saved_activations
from fusiontune.runtime.program import Program, build_program
from fusiontune.workloads import make_workload
from fusiontune.workloads.workload import Workload, training_workload

POINT = "RecomputeSplitFusionPass.recompute"
KIB = 1024


@dataclass
class Variant:
    """One fusiontune program of the step, bound to the workload's inputs."""

    name: str
    program: Program
    saved_bytes: int
    recomputed: int
    max_rel: float


def build(workload: Workload, config: FusionConfig, name: str) -> Variant:
    """Fuse, compile and check one configuration of the step; its program stays bound."""
    fused = run_pipeline(workload.graph, config, train=workload.train).fused
    program = build_program(fused)
    inputs = {k: np.array(v) for k, v in workload.inputs.items()}  # the program may update them
    out = {k: np.array(v) for k, v in program.run(inputs).items()}
    err = workload.errors(out)
    g = program.graph
    saved = sum(b for v, b in saved_activations(g).items() if v in program.plan.slot_of)
    recomputed = sum(1 for n in g.nodes if n.name.startswith(PREFIX))
    return Variant(name, program, saved, recomputed, err.max_rel)


def timed(fns: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, Timing]:
    timings = time_interleaved(
        list(fns.values()), rounds, MeasureConfig(warmup=2), min_sample_s=0.0
    )
    return dict(zip(fns, timings, strict=True))


def ms(t: float) -> str:
    return f"{t * 1e3:.2f}"


def bench_recompute(workload: Workload, levels: list[int], rounds: int) -> dict[str, Any]:
    variants = [
        build(workload, FusionConfig.resolve(split_points={POINT: level}), f"recompute={level}")
        for level in levels
    ]
    t = timed({v.name: v.program.execute for v in variants}, rounds)
    base = variants[0]
    print(f"\n== recompute split point ({POINT}), defaults otherwise; {rounds} interleaved rounds")
    print(
        f"  {'value':<13}{'kernels':>8}{'recomputed':>11}{'peak KiB':>10}{'saved KiB':>10}"
        f"{'max_rel':>10}{'median ms':>11}{'IQR ms':>8}{'time':>7}{'peak':>7}"
    )
    rows = []
    for v in variants:
        tm = t[v.name]
        row = {
            "value": v.name,
            "kernels": v.program.kernel_count,
            "recomputed_nodes": v.recomputed,
            "peak_bytes": v.program.peak_bytes,
            "saved_bytes": v.saved_bytes,
            "max_rel": v.max_rel,
            "median_s": tm.median_s,
            "iqr_s": tm.iqr_s,
            "noisy": tm.noisy,
        }
        rows.append(row)
        print(
            f"  {v.name:<13}{v.program.kernel_count:>8}{v.recomputed:>11}"
            f"{v.program.peak_bytes / KIB:>10.0f}{v.saved_bytes / KIB:>10.0f}{v.max_rel:>10.1e}"
            f"{ms(tm.median_s):>11}{ms(tm.iqr_s):>8}{tm.median_s / t[base.name].median_s:>6.2f}x"
            f"{v.program.peak_bytes / base.program.peak_bytes:>6.2f}x"
            + ("  (noisy)" if tm.noisy else "")
        )
    print("  time and peak: relative to recompute=0 (below 1: less)")
    return {"recompute": rows}


# ---- torch ----------------------------------------------------------------------------------------
def torch_step(
    workload: Workload, sizes: Mapping[str, int]
) -> tuple[Callable[[], object], dict[str, Any]]:
    """The transformer_block step in torch eager over the workload's weights, checked first.

    Returns:
        The step (zero_grad, forward, loss, backward, optimizer.step) and the check's figures.
    """
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    spec = workload.train
    assert spec is not None and spec.loss == "mse" and spec.optimizer == "sgd"
    heads, hidden = sizes["heads"], sizes["hidden"]
    d = hidden // heads
    params = {
        p: torch.nn.Parameter(torch.from_numpy(np.array(workload.inputs[p]))) for p in spec.params
    }
    x = torch.from_numpy(np.array(workload.inputs["x"]))
    target = torch.from_numpy(np.array(workload.inputs["target"]))
    batch, seq, _ = x.shape

    def linear(h: torch.Tensor, name: str) -> torch.Tensor:
        return h @ params[f"{name}/weight"] + params[f"{name}/bias"]

    def forward() -> torch.Tensor:
        q = linear(x, "attention/q").reshape(batch, seq, heads, d).permute(0, 2, 1, 3)
        k = linear(x, "attention/k").reshape(batch, seq, heads, d).permute(0, 2, 3, 1)
        v = linear(x, "attention/v").reshape(batch, seq, heads, d).permute(0, 2, 1, 3)
        p = torch.softmax((q @ k) * (1.0 / math.sqrt(d)), dim=-1)
        ctx = (p @ v).permute(0, 2, 1, 3).reshape(batch, seq, hidden)
        h = F.layer_norm(
            x + linear(ctx, "attention/out"),
            (hidden,),
            params["ln1/gamma"],
            params["ln1/beta"],
            1e-5,
        )
        f = linear(F.gelu(linear(h, "ffn/up")), "ffn/down")
        return F.layer_norm(h + f, (hidden,), params["ln2/gamma"], params["ln2/beta"], 1e-5)

    order = list(spec.params)
    opt = torch.optim.SGD([params[p] for p in order], lr=spec.lr, momentum=spec.momentum)
    for p in order:
        opt.state[params[p]]["momentum_buffer"] = torch.from_numpy(
            np.array(workload.inputs[f"momentum_buffer/{p}"])
        )

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(forward(), target)
        loss.backward()
        opt.step()
        return loss

    loss = step()  # the checked step: compare with the float64 reference
    ref = workload.reference

    def rel(got: list[np.ndarray], want: list[np.ndarray]) -> float:
        a = np.concatenate([g.ravel().astype(np.float64) for g in got])
        b = np.concatenate([w.ravel().astype(np.float64) for w in want])
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

    check = {
        "loss_rel": abs(float(loss.detach()) - float(ref[LOSS])) / abs(float(ref[LOSS])),
        "grad_rel": rel([params[p].grad.numpy() for p in order], [ref[f"grad/{p}"] for p in order]),
        "updated_rel": rel(
            [params[p].detach().numpy() for p in order], [ref[f"updated/{p}"] for p in order]
        ),
        "momentum_rel": rel(
            [opt.state[params[p]]["momentum_buffer"].numpy() for p in order],
            [ref[f"updated/momentum_buffer/{p}"] for p in order],
        ),
        "threads": torch.get_num_threads(),
        "version": torch.__version__,
    }
    return step, check


def bench_torch(workload: Workload, sizes: Mapping[str, int], rounds: int) -> dict[str, Any]:
    defaults = build(workload, FusionConfig.defaults(), "fusiontune defaults")
    all_off = build(workload, FusionConfig.all_off(), "fusiontune all-off")
    step, check = torch_step(workload, sizes)
    ok = (
        max(check["loss_rel"], check["grad_rel"], check["updated_rel"], check["momentum_rel"])
        < 1e-4
    )
    print(
        f"\n== torch {check['version']} eager, {check['threads']} threads, vs fusiontune"
        f" (numba threads {numba_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')});"
        f" {rounds} interleaved rounds"
    )
    print(
        f"  torch's step vs the float64 reference (max |diff| / max |ref|): loss {check['loss_rel']:.1e},"
        f" gradients {check['grad_rel']:.1e}, updated weights {check['updated_rel']:.1e},"
        f" momentum buffers {check['momentum_rel']:.1e}: {'match' if ok else 'DO NOT MATCH'}"
    )
    print(
        f"  fusiontune vs the same reference (max_rel): defaults {defaults.max_rel:.1e},"
        f" all-off {all_off.max_rel:.1e}"
    )
    fns = {
        "torch eager": step,
        defaults.name: defaults.program.execute,
        all_off.name: all_off.program.execute,
    }
    t = timed(fns, rounds)
    # The same, each variant in a block of its own (one after the other): interleaved, one
    # runtime's worker threads may still spin or wake while the other's run, which the blocks show.
    blocks = {name: timed({name: fn}, rounds)[name] for name, fn in fns.items()}
    print(
        f"  {'variant':<22}{'kernels':>8}{'median ms':>11}{'IQR ms':>8}{'torch/this':>12}"
        f"{'  in blocks: median ms':>23}{'IQR ms':>8}{'torch/this':>12}"
    )
    kernels = {
        "torch eager": "-",
        defaults.name: str(defaults.program.kernel_count),
        all_off.name: str(all_off.program.kernel_count),
    }
    for name, tm in t.items():
        bl = blocks[name]
        print(
            f"  {name:<22}{kernels[name]:>8}{ms(tm.median_s):>11}{ms(tm.iqr_s):>8}"
            f"{t['torch eager'].median_s / tm.median_s:>11.2f}x"
            f"{ms(bl.median_s):>23}{ms(bl.iqr_s):>8}{blocks['torch eager'].median_s / bl.median_s:>11.2f}x"
            + ("  (noisy)" if tm.noisy or bl.noisy else "")
        )
    interleaved = t["torch eager"].median_s / t[defaults.name].median_s
    block_speedup = blocks["torch eager"].median_s / blocks[defaults.name].median_s
    print(f"  in blocks: fusiontune defaults {block_speedup:.2f}x torch eager")
    alone = bench_alone(sizes, rounds)
    print(
        "  each in a process of its own, alternated 3 times (no other runtime's threads beside it;"
        " torch with its default OpenMP waiting): "
        + ", ".join(f"{k} {ms(v)} ms" for k, v in alone.items())
        + f"; fusiontune defaults {alone['torch eager'] / alone[defaults.name]:.2f}x torch eager"
    )
    # The verdict takes the processes of their own: interleaved in one process, torch's OpenMP
    # pool under the passive waiting both need here is slower than torch alone.
    speedup = alone["torch eager"] / alone[defaults.name]
    print(
        f"  fusiontune defaults: {speedup:.2f}x torch eager, each in a process of its own"
        f" (goal >= 1.0x: {'met' if speedup >= 1.0 else 'NOT met'}); interleaved {interleaved:.2f}x;"
        f" {t[all_off.name].median_s / t[defaults.name].median_s:.2f}x all-off"
    )
    return {
        "torch_check": check,
        "torch_matches": ok,
        **{f"{k}_median_s": v.median_s for k, v in t.items()},
        "speedup_vs_torch": speedup,
        "speedup_vs_torch_interleaved": interleaved,
        "speedup_vs_torch_in_blocks": block_speedup,
        "alone_median_s": alone,
        "speedup_vs_torch_alone": alone["torch eager"] / alone[defaults.name],
    }


def bench_alone(sizes: Mapping[str, int], rounds: int) -> dict[str, float]:
    """Each variant timed in a fresh process of its own (3 alternations): the median of the medians."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    size_text = ",".join(f"{k}={v}" for k, v in sizes.items())
    got: dict[str, list[float]] = {}
    for _ in range(3):
        for variant in ("torch eager", "fusiontune defaults"):
            cmd = [sys.executable, __file__, "--alone", variant, "--sizes", size_text, "--rounds", str(rounds)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got.setdefault(variant, []).append(json.loads(done.stdout.strip().splitlines()[-1])["median_s"])
    return {k: float(np.median(v)) for k, v in got.items()}


def time_alone(workload: Workload, sizes: Mapping[str, int], variant: str, rounds: int) -> None:
    """Time one variant in this process, print ``{"median_s": ...}``."""
    if variant == "torch eager":
        fn, _ = torch_step(workload, sizes)
    else:
        fn = build(workload, FusionConfig.defaults(), variant).program.execute
    print(json.dumps({"median_s": timed({variant: fn}, rounds)[variant].median_s}))


def numba_threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def parse_sizes(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="transformer_block")
    ap.add_argument("--sizes", default="", help="e.g. batch=2,seq=64,hidden=128,heads=4,ffn=512")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--levels", default="0,1,2,3")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch eager comparison")
    ap.add_argument("--alone", metavar="VARIANT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    base = make_workload(args.workload, **parse_sizes(args.sizes))
    workload = training_workload(base, TrainSpec(loss="mse", optimizer="sgd", momentum=0.9))
    sizes = dict(base.params)
    if args.alone:
        time_alone(workload, sizes, args.alone, args.rounds)
        return {"alone": args.alone}
    print(
        f"workload {args.workload} {' '.join(f'{k}={v}' for k, v in sizes.items())}: one training step"
        f" (MSE, backward, SGD momentum 0.9) of {len(workload.train.params)} weights;"
        f" load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus"
    )
    out: dict[str, Any] = {"workload": args.workload, "sizes": sizes}
    out.update(bench_recompute(workload, [int(v) for v in args.levels.split(",")], args.rounds))
    if args.no_torch or args.workload != "transformer_block":
        if args.workload != "transformer_block":
            print("\n(torch side: written for transformer_block only)")
        return out
    try:
        import torch  # noqa: F401
    except ImportError:
        print("\n(torch is not installed: .venv/bin/pip install torch; part 2 skipped)")
        return out
    out.update(bench_torch(workload, sizes, args.rounds))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
