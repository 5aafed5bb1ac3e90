"""Peers benchmark: fusiontune vs onnxruntime, JAX jit, torch.compile, numpy and numexpr, side by side.

Every case is defined once, as an ONNX model (onnx.helper): onnxruntime runs that very model,
fusiontune imports it (``import_onnx``), and JAX and torch.compile run one generic lowering of the
imported, unfused graph (benchmarks/_lower.py) that their compilers fuse themselves. So every peer
computes the same math. Before timing, each peer's outputs are compared with the float64
interpreter; a peer whose max_rel exceeds the tolerance is flagged WRONG in the table (and left out
of the goals), never timed silently.

Cases: six subgraphs (a 12-op elementwise chain, Add + LayerNorm, Softmax, MatMul + bias + erf
GELU, Conv + BN + Relu, attention) and the three models of search_spaces/models/. Timing: every
peer once per round, in turn, for ``--rounds`` rounds (a sample is raised to >= 5 ms of calls), so
load from other processes hits every peer alike (fusiontune.measure.time_interleaved: rounds in
which some peer's spread is too wide are measured again, then that peer is flagged noisy); the
table gives medians, the IQR, the min..max range, and each peer's time divided by fusiontune's
(> 1: fusiontune is faster). fusiontune is built, checked and timed by the tuning loop's own path
(fusiontune.tune.evaluate.build_candidate, check_and_time). For the
memory-bound subgraphs it gives fusiontune's effective bandwidth (its kernels' least bytes moved
over its median time) as a share of the copy bandwidth (a parallel numba copy of the same bytes).

fusiontune runs the registry defaults, a ``--config`` (fusion_switch.cfg / best_config.json), or the
fastest feasible configuration of a ``--sweep N`` (the defaults, all-off, the defaults with each
inexact pass on, and N random points;
feasible: max_rel <= max(5 x float32 floor, 1e-4)). Peers that are not installed are skipped with a
note. This is a benchmark, not a test: run it on a quiet machine (``cat /proc/loadavg`` < ~1.5).

``--models DIR`` runs every ``.onnx`` file of a folder instead (``--match SUBSTRING`` keeps those
whose name holds it), each on the arrays beside it: ``<stem>.inputs.npz`` (the convention of
search_spaces/models/real/), else ``<stem>.npz``, keyed by ONNX input name; their shapes fix the
model's symbolic dimensions. After the per-model tables it prints one summary: per model,
fusiontune's and onnxruntime's medians, their ratio (onnxruntime / fusiontune: > 1, fusiontune is
faster), the geometric mean of the ratios, and where fusiontune's time goes by kernel kind (its
program profiled kernel by kernel, fusiontune.measure.profile). A model that does not import, or
has no inputs beside it, gets one line saying why, and the run goes on. Nothing is written to
RESULTS.md unless ``--results PATH`` is given.

``--isolate`` runs every peer in a process of its own: the parent asks each process for one sample
in turn, so the rounds still interleave, each process times its own calls, and the others are
stopped meanwhile (:class:`RemotePeer`). In one process two peers' pools slow each other by an
amount that depends on where their workers land. It is the default for ``--models`` with more than
one thread (fusiontune beside onnxruntime, the corpus' setting, where it was measured), not for
the built-in cases: there torch.compile in a process of its own took 2.7 ms or 6.6-7.8 ms on
conv_bn_relu from one measurement to the next (the same script, one process), against 2.75 in the
shared one, which was not explained; ``--isolate`` asks for it there too. ``--also-layer LAYER``
(with ``--isolate``) adds fusiontune once more, its process started with
``FUSIONTUNE_THREADING=LAYER``: two threading layers timed in the same rounds, which separate runs
on a shared machine cannot compare (their figures moved 2x between runs an hour apart here).

    .venv/bin/python benchmarks/peers.py [--quick] [--only NAME ...] [--rounds N] [--threads N]
        [--config CFG | --sweep N] [--results PATH] [--json PATH] [--isolate | --no-isolate] [--also-layer LAYER]
    .venv/bin/python benchmarks/peers.py --models DIR [--match SUBSTRING ...] [--skip PEER ...] ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "search_spaces" / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SUBGRAPH_GOAL = 1.0  # JAX and torch.compile time / fusiontune time, every subgraph
MODEL_GOAL = {"bert_encoder": 1.0, "llama_decoder": 1.0, "resnet_cnn": 1 / 1.25}  # onnxruntime / fusiontune
BANDWIDTH_GOAL = 0.70
MEMORY_BOUND = ("elementwise_chain", "add_layernorm", "softmax")
PEERS = ("fusiontune", "onnxruntime", "jax", "torch.compile", "numpy", "numexpr")
MIN_SAMPLE_S = 0.005
COPY = "copy (same bytes)"  # the bandwidth reference, timed in the rounds beside the peers
MIB = 1 << 20


# ---- cases -----------------------------------------------------------------------------------
@dataclass
class Case:
    """One ONNX model with fixed dims and inputs."""

    name: str
    title: str
    kind: str  # "subgraph" | "model"
    model: Any  # onnx.ModelProto
    dims: dict[str, int]
    inputs: dict[str, np.ndarray]


def _sub(name: str) -> Any:
    from export_models import Builder

    return Builder(name, seed=3)


def _f32(b: Any, name: str, shape: Sequence[int]) -> str:
    from onnx import TensorProto

    return b.input(name, TensorProto.FLOAT, list(shape))


def _finish(b: Any, out: str, shape: Sequence[int]) -> Any:
    from onnx import TensorProto, helper

    b.nodes.append(helper.make_node("Identity", [out], ["out"], name="output"))
    b.output("out", TensorProto.FLOAT, list(shape))
    return b.model(b.name)


def case_elementwise_chain(rows: int, cols: int) -> Any:
    """12 cheap elementwise ops over x and y: each intermediate is read once (numexpr-friendly)."""
    b = _sub("elementwise_chain")
    x, y = _f32(b, "x", (rows, cols)), _f32(b, "y", (rows, cols))
    t = b.op("Mul", [x, b.scalar("c", 1.5)])
    t = b.op("Add", [t, b.scalar("c", 0.5)])
    t = b.op("Mul", [t, x])
    t = b.op("Sub", [t, b.scalar("c", 0.25)])
    t = b.op("Relu", [t])
    t = b.op("Mul", [t, y])
    t = b.op("Add", [t, x])
    t = b.op("Div", [t, b.scalar("c", 2.0)])
    t = b.op("Sub", [y, t])
    t = b.op("Max", [t, b.scalar("c", -1.0)])
    t = b.op("Min", [t, b.scalar("c", 4.0)])
    t = b.op("Mul", [t, b.scalar("c", 0.75)])
    return _finish(b, t, (rows, cols))


def case_add_layernorm(rows: int, cols: int) -> Any:
    b = _sub("add_layernorm")
    s = b.op("Add", [_f32(b, "x", (rows, cols)), _f32(b, "r", (rows, cols))])
    y = b.op("LayerNormalization", [s, b.vector("gamma", cols, 1.0, 0.1), b.vector("beta", cols, 0.0, 0.1)], axis=-1, epsilon=1e-5)
    return _finish(b, y, (rows, cols))


def case_softmax(rows: int, cols: int) -> Any:
    b = _sub("softmax")
    return _finish(b, b.op("Softmax", [_f32(b, "x", (rows, cols))], axis=-1), (rows, cols))


def case_matmul_bias_gelu(rows: int, k: int, n: int) -> Any:
    from export_models import _gelu_erf

    b = _sub("matmul_bias_gelu")
    h = b.op("Add", [b.op("MatMul", [_f32(b, "x", (rows, k)), b.weight("w", (k, n), k)]), b.vector("bias", n)])
    return _finish(b, _gelu_erf(b, h), (rows, n))


def case_conv_bn_relu(n: int, c: int, m: int, hw: int) -> Any:
    from export_models import _conv_bn

    b = _sub("conv_bn_relu")
    return _finish(b, _conv_bn(b, _f32(b, "x", (n, c, hw, hw)), c, m, 3, 1, True), (n, m, hw, hw))


def case_attention(batch: int, heads: int, seq: int, d: int) -> Any:
    b = _sub("attention")
    q, k, v = (_f32(b, name, (batch, heads, seq, d)) for name in ("q", "k", "v"))
    mask = _f32(b, "mask", (batch, 1, 1, seq))
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    s = b.op("Add", [b.op("Mul", [s, b.scalar("scale", 1.0 / math.sqrt(d))]), mask])
    return _finish(b, b.op("MatMul", [b.op("Softmax", [s], axis=-1), v]), (batch, heads, seq, d))


SUBGRAPHS: dict[str, tuple[str, Callable[[bool], Any]]] = {
    "elementwise_chain": ("12 elementwise ops, x, y 4096x1024", lambda q: case_elementwise_chain(*((512, 1024) if q else (4096, 1024)))),
    "add_layernorm": ("LayerNorm(x + r), 4096x1024", lambda q: case_add_layernorm(*((512, 1024) if q else (4096, 1024)))),
    "softmax": ("Softmax over the last axis, 4096x1024", lambda q: case_softmax(*((512, 1024) if q else (4096, 1024)))),
    "matmul_bias_gelu": ("erf GELU(x @ W + b), 1024x512 @ 512x2048", lambda q: case_matmul_bias_gelu(*((128, 256, 512) if q else (1024, 512, 2048)))),
    "conv_bn_relu": ("Relu(BN(Conv3x3)), 8x32x56x56 -> 64", lambda q: case_conv_bn_relu(*((1, 8, 16, 16) if q else (8, 32, 64, 56)))),
    "attention": ("softmax(QK^T/sqrt d + mask) V, 4x8x256x64", lambda q: case_attention(*((1, 2, 32, 16) if q else (4, 8, 256, 64)))),
}
MODELS: dict[str, tuple[str, dict[str, int], dict[str, int]]] = {
    "resnet_cnn": ("ResNet-style CNN", {"batch": 8, "height": 64, "width": 64}, {"batch": 1, "height": 32, "width": 32}),
    "bert_encoder": ("BERT-style encoder, 2 layers", {"batch": 4, "seq": 128}, {"batch": 1, "seq": 32}),
    "llama_decoder": ("llama-style decoder, 2 layers", {"batch": 4, "seq": 128}, {"batch": 1, "seq": 32}),
}


def make_case(name: str, quick: bool) -> Case:
    """Build (or load) the ONNX model of ``name`` and its inputs."""
    import onnx
    from export_models import MODELS as BUILDERS
    from export_models import sample_inputs

    if name in SUBGRAPHS:
        title, build = SUBGRAPHS[name]
        model = build(quick)
        rng = np.random.default_rng(0)
        inputs = {}
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            inputs[vi.name] = rng.standard_normal(shape).astype(np.float32)
        if "mask" in inputs:  # additive mask: -10000 on a tenth of the keys
            inputs["mask"] = np.where(rng.random(inputs["mask"].shape) < 0.1, -10000.0, 0.0).astype(np.float32)
        if quick:
            title = "quick sizes: " + ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in inputs.items())
        return Case(name, title, "subgraph", model, {}, inputs)
    title, dims, quick_dims = MODELS[name]
    dims = quick_dims if quick else dims
    path = ROOT / "search_spaces" / "models" / f"{name}.onnx"
    model = onnx.load(str(path)) if path.exists() else BUILDERS[name][0]()
    return Case(name, f"{title} {dims}", "model", model, dims, sample_inputs(model, dims))


# ---- peers -----------------------------------------------------------------------------------
@dataclass
class PeerRun:
    """One peer on one case: the timed callable and its outputs, or why there is none."""

    peer: str
    fn: Callable[[], object] | None = None
    outputs: dict[str, np.ndarray] | None = None
    note: str = ""
    max_rel: float = float("nan")
    wrong: bool = False
    timing: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    program: Any = None  # fusiontune's Program, for its kernel profile
    profile: Callable[[dict[str, np.ndarray], int], dict[str, Any]] | None = None
    """fusiontune's kernel profile as ``ProfileReport.to_json``: (inputs, rounds) -> figures."""


def as_workload(case: Case, graph: Any, reference: dict[str, np.ndarray]) -> Any:
    """The case as a fusiontune Workload (graph, inputs, float64 reference)."""
    from fusiontune.workloads import Workload

    return Workload(case.name, graph, case.inputs, reference, case.dims)


def _fusiontune(workload: Any, config: Any) -> PeerRun:
    from fusiontune.measure import MeasureConfig
    from fusiontune.tune.evaluate import build_candidate, check_and_time

    program = build_candidate(workload, config).program
    checked = check_and_time(workload, program, MeasureConfig(), timing=False)
    program.bind(workload.inputs)
    bytes_moved = sum(k.bytes_moved for k in program.kernels)
    def profile(inputs: dict[str, np.ndarray], rounds: int) -> dict[str, Any]:
        from fusiontune.measure.profile import profile_program

        return profile_program(program, inputs, rounds=rounds).to_json()

    return PeerRun("fusiontune", program.execute, dict(checked.outputs), f"{program.kernel_count} kernels",
                   extra={"bytes_moved": bytes_moved, "kernels": program.kernel_count, "compile_s": program.compile_s},
                   program=program, profile=profile)


def _onnxruntime(case: Case, path: Path, threads: int) -> PeerRun:
    import onnxruntime as ort
    from _ort import session_options

    sess = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, case.inputs), strict=True))
    return PeerRun("onnxruntime", lambda: sess.run(None, case.inputs), outs, "ORT_ENABLE_ALL")


def _jax(case: Case, graph: Any) -> PeerRun:
    import jax
    import jax.numpy as jnp
    from _lower import lower_jax

    fn = lower_jax(graph)
    args = [jnp.asarray(case.inputs[n]) for n in graph.inputs]
    outs = jax.block_until_ready(fn(*args))
    return PeerRun("jax", lambda: jax.block_until_ready(fn(*args)), {o: np.asarray(v) for o, v in zip(graph.outputs, outs, strict=True)}, "jax.jit")


def _torch(case: Case, graph: Any) -> PeerRun:
    import torch
    from _lower import lower_torch

    fn = lower_torch(graph)
    args = [torch.from_numpy(np.array(case.inputs[n])) for n in graph.inputs]

    def call() -> object:
        with torch.no_grad():
            return fn(*args)

    outs = call()
    return PeerRun("torch.compile", call, {o: v.numpy() for o, v in zip(graph.outputs, outs, strict=True)}, "inductor, CPU")


def _numpy(case: Case, graph: Any) -> PeerRun:
    from fusiontune.ir.interpreter import run_graph

    return PeerRun("numpy", lambda: run_graph(graph, case.inputs, dtype=None), run_graph(graph, case.inputs, dtype=None), "interpreter, float32")


def _numexpr(case: Case, graph: Any) -> PeerRun:
    import numexpr as ne
    from _lower import numexpr_expression

    lowered = numexpr_expression(graph)
    if lowered is None:
        return PeerRun("numexpr", note="n/a (not an elementwise graph)")
    expr, consts = lowered
    local = {f"v{i}": case.inputs[n] for i, n in enumerate(graph.inputs)}
    local.update({k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in consts.items()})
    out_v = graph.values[graph.outputs[0]]
    out = np.empty(out_v.shape, dtype=out_v.dtype)
    ne.evaluate(expr, local_dict=local, out=out)  # parses once; later calls hit numexpr's cache
    if out.dtype != np.float32 and out_v.dtype == "float32":
        raise TypeError(f"numexpr computed in {out.dtype}")
    return PeerRun("numexpr", lambda: ne.evaluate(expr, local_dict=local, out=out), {graph.outputs[0]: out.copy()}, f"{ne.get_num_threads()} threads")


def prepare_peers(case: Case, graph: Any, path: Path, config: Any, threads: int, skip: Sequence[str], reference: dict[str, np.ndarray]) -> list[PeerRun]:
    """Build every peer for ``case``; a peer that is missing or fails becomes a row with a note."""
    makers: dict[str, tuple[str, Callable[[], PeerRun]]] = {
        "fusiontune": ("fusiontune", lambda: _fusiontune(as_workload(case, graph, reference), config)),
        "onnxruntime": ("onnxruntime", lambda: _onnxruntime(case, path, threads)),
        "jax": ("jax", lambda: _jax(case, graph)),
        "torch.compile": ("torch", lambda: _torch(case, graph)),
        "numpy": ("numpy", lambda: _numpy(case, graph)),
        "numexpr": ("numexpr", lambda: _numexpr(case, graph)),
    }
    runs = []
    for peer, (module, make) in makers.items():
        if peer in skip:
            runs.append(PeerRun(peer, note="skipped (--skip)"))
            continue
        try:
            __import__(module)
        except ImportError:
            runs.append(PeerRun(peer, note=f"not installed (pip install {module})"))
            continue
        t0 = time.perf_counter()
        try:
            run = make()
        except Exception as exc:  # a peer that cannot run this case is a row, not a crash
            runs.append(PeerRun(peer, note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"))
            continue
        run.extra["prepare_s"] = time.perf_counter() - t0
        runs.append(run)
    return runs


# ---- one process per peer (--isolate) ---------------------------------------------------------
class RemotePeer:
    """A peer built, checked and timed in a process of its own, which the parent asks for samples.

    Interleaved in one process, two peers' thread pools share the cores by where their workers
    happen to land: on two cores, ResNet-18's export with two threads each gave onnxruntime 0.18 ms
    in one process and 0.106 ms in the next (README, performance). In processes of their own each
    pool is alone while it runs, and the rounds still interleave the peers (the parent asks each
    process for one sample in turn), so load from outside hits them alike. The pipe is outside the
    figures: the process times its own calls (``time_callable``, which
    :func:`fusiontune.measure.interleaved.interleaved_timings` uses when a callable has it).

    Between its requests a peer's process is stopped (``SIGSTOP``; ``SIGCONT`` before the next), so
    what its pools do after its last call cannot take a core from the peer timed next: onnxruntime
    spins up to 1 ms (benchmarks/_ort.py), libgomp's and OpenBLAS's workers longer. Before the
    processes were stopped, a pause before each sample was tried instead. On ResNet-18's export
    (two threads, the two peers interleaved, 9 rounds of 5 ms samples, one process pair per run, ms
    onnxruntime / fusiontune) no pause gave 3 runs of 4 at 0.108-0.110 / 0.123-0.125 and one at
    0.190 / 0.140, 1.5 ms all 8 at 0.104-0.116 / 0.114-0.125, 10 ms 0.27-0.47 / 0.14-0.17 (a core
    left idle that long comes back slowly on this VM). But with torch.compile and the numpy
    interpreter in processes of their own too (conv_bn_relu, 7 rounds), fusiontune took 4.5 ms
    after a 1.5 ms pause against 2.3 with those two left out: their pools spin longer than any
    pause that does not slow the others.
    """

    def __init__(self, peer: str, payload: tuple[Any, ...]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no pool inherited
        self.peer = peer
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_peer_process, args=(child, peer, payload), name=f"peer {peer}", daemon=True)
        self._proc.start()
        child.close()
        self.run: PeerRun = self._reply()
        if self.run.note.startswith(("failed", "not installed", "n/a")) or self.run.outputs is None:
            self.close()
        else:
            self._signal(signal.SIGSTOP)
            self.run.fn = self
            if peer == "fusiontune":
                self.run.profile = self.profile

    def _reply(self) -> Any:
        try:
            reply = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the {self.peer} process ended (exit code {self._proc.exitcode})") from None
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _signal(self, sig: int) -> None:
        if self._proc.pid is not None and self._proc.is_alive():
            os.kill(self._proc.pid, sig)

    def _ask(self, *message: Any) -> Any:
        """Resume the process, ask, take the reply, stop it again."""
        self._signal(signal.SIGCONT)
        try:
            self._conn.send(message)
            return self._reply()
        finally:
            self._signal(signal.SIGSTOP)

    def __call__(self) -> None:
        self._ask("call")

    def time_callable(self, cfg: Any) -> Any:
        """``fusiontune.measure.time_callable`` of the peer, timed in its process."""
        return self._ask("time", cfg)

    def profile(self, inputs: dict[str, np.ndarray], rounds: int) -> dict[str, Any]:
        """fusiontune's kernel profile (``ProfileReport.to_json``), taken in its process."""
        return self._ask("profile", rounds)

    def close(self) -> None:
        if self._proc.is_alive():
            self._signal(signal.SIGCONT)
            try:
                self._conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()


def _peer_process(conn: Any, peer: str, payload: tuple[Any, ...]) -> None:
    """A peer's process: build it (:func:`prepare_peers`), send what the check needs, then answer
    ``call``, ``time`` and ``profile`` until ``exit``."""
    from fusiontune.measure import time_callable

    case, path, config, threads, reference = payload
    try:
        use_threads(threads)
        graph = case_graph(case, path)  # a Graph does not pickle: imported again, the same way
        skip = [p for p in PEERS if p != peer]
        (run,) = [r for r in prepare_peers(case, graph, path, config, threads, skip, reference) if r.peer == peer]
        conn.send(PeerRun(peer, outputs=run.outputs, note=run.note, extra=run.extra))
        while True:
            message = conn.recv()
            if message[0] == "exit":
                break
            try:
                if message[0] == "call":
                    run.fn()
                    conn.send(None)
                elif message[0] == "time":
                    conn.send(time_callable(run.fn, message[1]))
                elif message[0] == "profile":
                    from fusiontune.measure.profile import profile_program

                    conn.send(profile_program(run.program, case.inputs, rounds=message[1]).to_json())
                else:
                    conn.send(ValueError(f"unknown request {message[0]!r}"))
            except Exception as exc:
                conn.send(RuntimeError(f"{peer}: {type(exc).__name__}: {exc}"))
    except Exception as exc:
        conn.send(RuntimeError(f"{peer}: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def prepare_isolated(case: Case, graph: Any, path: Path, config: Any, threads: int, skip: Sequence[str], reference: dict[str, np.ndarray]) -> list[PeerRun]:
    """:func:`prepare_peers` with every peer in a process of its own (:class:`RemotePeer`), started
    one after the other so that no build competes with another for the cores."""
    runs = []
    for peer in PEERS:
        if peer in skip:
            runs.append(PeerRun(peer, note="skipped (--skip)"))
            continue
        t0 = time.perf_counter()
        try:
            remote = RemotePeer(peer, (case, path, config, threads, reference))
        except Exception as exc:
            runs.append(PeerRun(peer, note=f"failed: {str(exc).splitlines()[0][:120]}"))
            continue
        remote.run.extra["prepare_s"] = time.perf_counter() - t0
        remote.run.note = f"{remote.run.note}; own process" if remote.run.fn is not None else remote.run.note
        runs.append(remote.run)
        _LIVE.append(remote)
    for layer in ALSO_LAYERS:  # fusiontune again, its process started on another threading layer
        before = os.environ.get("FUSIONTUNE_THREADING")
        os.environ["FUSIONTUNE_THREADING"] = layer  # what a spawned process starts with
        try:
            remote = RemotePeer("fusiontune", (case, path, config, threads, reference))
        except Exception as exc:
            runs.append(PeerRun(f"fusiontune@{layer}", note=f"failed: {str(exc).splitlines()[0][:120]}"))
            continue
        finally:
            if before is None:
                os.environ.pop("FUSIONTUNE_THREADING", None)
            else:
                os.environ["FUSIONTUNE_THREADING"] = before
        remote.run.peer = f"fusiontune@{layer}"
        remote.run.profile = None
        remote.run.note = f"{remote.run.note}; own process, FUSIONTUNE_THREADING={layer}"
        runs.append(remote.run)
        _LIVE.append(remote)
    return runs


_LIVE: list[RemotePeer] = []
ALSO_LAYERS: list[str] = []
"""``--also-layer``: threading layers fusiontune runs on once more, each in a process of its own."""


def close_isolated() -> None:
    """End the peer processes of the case just measured."""
    while _LIVE:
        _LIVE.pop().close()


def use_threads(threads: int) -> None:
    """``threads`` for fusiontune (numba), torch and numexpr in this process (onnxruntime takes
    them per session; numba reads ``NUMBA_NUM_THREADS`` at import, which :func:`main` sets)."""
    from fusiontune.codegen.threading_layer import set_num_threads

    set_num_threads(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    try:
        import numexpr

        numexpr.set_num_threads(threads)
    except ImportError:
        pass


# ---- timing ----------------------------------------------------------------------------------
def interleaved_rounds(fns: dict[str, Callable[[], object]], rounds: int, warmup: int) -> dict[str, Any]:
    """Every callable once per round, round-robin (fusiontune.measure.time_interleaved, a sample
    >= MIN_SAMPLE_S of calls, too wide a spread measured again then flagged); Timing per name."""
    from fusiontune.measure import MeasureConfig, time_interleaved

    timings = time_interleaved(list(fns.values()), rounds, MeasureConfig(warmup=warmup), MIN_SAMPLE_S)
    return dict(zip(fns, timings, strict=True))


# ---- the sweep -------------------------------------------------------------------------------
def sweep_config(graph: Any, inputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], bound: float, n: int, seed: int = 0) -> tuple[Any, list[dict[str, Any]]]:
    """The fastest configuration with max_rel <= bound among defaults, all-off, the defaults with
    each inexact pass on, and ``n`` random points."""
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.measure import MeasureConfig
    from fusiontune.passes.registry import switchable_passes
    from fusiontune.tune.evaluate import build_candidate, check_and_time
    from fusiontune.workloads import Workload

    rng = np.random.default_rng(seed)
    passes = switchable_passes()
    candidates = [("defaults", FusionConfig.defaults()), ("all_off", FusionConfig.all_off())]
    # As `fusiontune tune` enqueues them: the defaults with each inexact pass switched on.
    for p in passes:
        if not p.exact:
            candidates.append((f"only:{p.name}", FusionConfig.resolve(explicit={p.name: True}, source="--sweep")))
    for i in range(n):
        switches = {p.name: bool(rng.random() < 0.5) for p in passes}
        splits = {}
        for p in passes:
            for sp in p.split_points:
                if switches[p.name]:
                    choices = [c for c in (0, 2, 4, 8, 16, 32, 64, 128, 512) if sp.low <= c <= sp.high]
                    splits[f"{p.name}.{sp.name}"] = int(rng.choice(choices))
        candidates.append((f"random{i}", FusionConfig.resolve(explicit=switches, split_points=splits, source="--sweep")))
    log, best = [], (float("inf"), candidates[0][1])
    measure = MeasureConfig(warmup=1, repeat=5, min_repeat_ms=MIN_SAMPLE_S * 1000)
    workload = Workload("sweep", graph, inputs, reference, {})
    for label, config in candidates:
        try:
            program = build_candidate(workload, config).program
            checked = check_and_time(workload, program, measure)
        except Exception as exc:
            log.append({"label": label, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        err, t = checked.errors.max_rel, checked.timing.median_s
        log.append({"label": label, "median_s": t, "max_rel": err, "kernels": program.kernel_count, "feasible": err <= bound, "noisy": checked.timing.noisy})
        if err <= bound and t < best[0]:
            best = (t, config)
    return best[1], log


# ---- report ----------------------------------------------------------------------------------
def _ms(s: float) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:.3f}"


def table_lines(case: Case, runs: list[PeerRun], bw: dict[str, Any] | None) -> list[str]:
    ft = next((r for r in runs if r.peer == "fusiontune" and r.timing is not None), None)
    lines = [f"### {case.name}: {case.title}", ""]
    lines.append("| peer | median ms | IQR ms | min..max ms | peer / fusiontune | max_rel | note |")
    lines.append("|---|---:|---:|---:|---:|---:|---|")
    for r in runs:
        if r.timing is None:
            lines.append(f"| {r.peer} | - | - | - | - | {'-' if math.isnan(r.max_rel) else f'{r.max_rel:.1e}'} | {r.note} |")
            continue
        t = r.timing
        ratio = "-" if ft is None else f"{t.median_s / ft.timing.median_s:.2f}x"
        flag = " **WRONG**" if r.wrong else ""
        note = f"{r.note}; **noisy**" if t.noisy else r.note
        lines.append(
            f"| {r.peer} | {_ms(t.median_s)} | {_ms(t.iqr_s)} | {_ms(min(t.samples_s))}..{_ms(max(t.samples_s))} | {ratio} | {r.max_rel:.1e}{flag} | {note} |"
        )
    noisy = [r for r in runs if r.timing is not None and r.timing.noisy]
    if noisy:
        from fusiontune.measure import describe_noise

        lines.append("")
        lines += [f"{r.peer}: {describe_noise(r.timing)}" for r in noisy]
    if bw is not None:
        lines.append("")
        lines.append(
            f"fusiontune moves {bw['bytes_moved'] / MIB:.0f} MiB in {_ms(bw['median_s'])} ms = {bw['achieved'] / 1e9:.2f} GB/s = "
            f"{100 * bw['fraction']:.0f}% of copy bandwidth ({bw['copy_bw'] / 1e9:.2f} GB/s: the median of a numba parallel copy of the same bytes,"
            f" timed in the same rounds; its best of 5 alone {bw['best_copy_bw'] / 1e9:.2f} GB/s, np.copyto {bw['numpy_copy_bw'] / 1e9:.2f} GB/s)"
        )
    lines.append("")
    return lines


def goal_lines(results: dict[str, dict[str, Any]], ft_mode: str) -> list[str]:
    """The goals, each met / missed with its figure."""
    lines = []
    for name, res in results.items():
        ratios = res["ratios"]
        if res["kind"] == "subgraph":
            for peer in ("jax", "torch.compile"):
                r = ratios.get(peer)
                if r is None:
                    lines.append(f"- {name}: {peer}/fusiontune not measured ({res['notes'].get(peer, 'no figure')})")
                else:
                    lines.append(f"- {name}: {peer}/fusiontune = {r:.2f}x (goal >= {SUBGRAPH_GOAL:.1f}): {'met' if r >= SUBGRAPH_GOAL else 'MISSED'}")
        else:
            goal = MODEL_GOAL.get(name, 1.0)  # a model of --models: faster than onnxruntime
            r = ratios.get("onnxruntime")
            if r is None:
                lines.append(f"- {name}: onnxruntime/fusiontune not measured ({res['notes'].get('onnxruntime', 'no figure')})")
            else:
                lines.append(f"- {name}: onnxruntime/fusiontune = {r:.2f}x with fusiontune {ft_mode} (goal >= {goal:.2f}): {'met' if r >= goal else 'MISSED'}")
        if res.get("bandwidth"):
            f = res["bandwidth"]["fraction"]
            lines.append(f"- {name}: fusiontune at {100 * f:.0f}% of copy bandwidth (goal >= {100 * BANDWIDTH_GOAL:.0f}%): {'met' if f >= BANDWIDTH_GOAL else 'MISSED'}")
    return lines


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("numpy", "numba", "onnx", "onnxruntime", "jax", "jaxlib", "torch", "numexpr"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ---- main ------------------------------------------------------------------------------------
def bench_case(name: str, args: argparse.Namespace, base_config: Any, threads: int, tmp: Path) -> tuple[Case, list[PeerRun], dict[str, Any]]:
    """One built-in case (a subgraph or a model of search_spaces/models/): every peer, timed."""
    import onnx

    case = make_case(name, args.quick)
    path = tmp / f"{name}.onnx"
    onnx.save(case.model, str(path))
    return bench_loaded(case, path, args, base_config, threads)


# ---- a folder of models (--models DIR) -------------------------------------------------------
INPUT_SUFFIXES = (".inputs.npz", ".npz")  # search_spaces/models/real/ writes <stem>.inputs.npz


def model_files(folder: Path, match: Sequence[str] = ()) -> list[Path]:
    """The ``.onnx`` files of ``folder``, sorted, those whose name holds one of ``match`` (if any)."""
    files = sorted(folder.glob("*.onnx"))
    return [f for f in files if not match or any(m in f.name for m in match)]


def inputs_beside(model: Path) -> Path | None:
    """The input arrays of ``model``: ``<stem>.inputs.npz``, else ``<stem>.npz``; None if neither."""
    stem = model.name.removesuffix(".onnx")
    for suffix in INPUT_SUFFIXES:
        candidate = model.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def model_case(model: Path) -> Case:
    """A model file of ``--models`` as a case, on the arrays beside it (keyed by ONNX input name).

    Raises:
        FileNotFoundError: no ``.npz`` of inputs beside it.
        ValueError: the file lacks one of the model's inputs.
    """
    import onnx

    npz = inputs_beside(model)
    name = model.name.removesuffix(".onnx")
    if npz is None:
        raise FileNotFoundError(f"no inputs beside it ({name}.inputs.npz or {name}.npz)")
    proto = onnx.load(str(model))
    initializers = {t.name for t in proto.graph.initializer}
    wanted = [vi.name for vi in proto.graph.input if vi.name not in initializers]
    with np.load(npz) as arrays:
        missing = [n for n in wanted if n not in arrays.files]
        if missing:
            raise ValueError(f"{npz.name} has no array for input {', '.join(missing)}")
        inputs = {n: np.asarray(arrays[n]) for n in wanted}
    shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in inputs.items())
    return Case(name, f"{model.name} on {npz.name} ({shapes})", "file", proto, {}, inputs)


def bench_model_file(model: Path, args: argparse.Namespace, base_config: Any, threads: int) -> tuple[Case, list[PeerRun], dict[str, Any]]:
    """One model file of ``--models``: every peer, timed, and fusiontune's kernel profile."""
    case = model_case(model)
    case, runs, res = bench_loaded(case, model, args, base_config, threads)
    profile = next((r.profile for r in runs if r.peer == "fusiontune" and r.profile is not None and r.timing is not None), None)
    if profile is not None:
        res["profile"] = profile(case.inputs, args.rounds)
    return case, runs, res


def kinds_text(seconds: dict[str, float], limit: int = 4) -> str:
    """``matmul 52%, elementwise 20%, ...``: the largest ``limit`` kinds' shares of ``seconds``."""
    total = math.fsum(seconds.values())
    ranked = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {100 * s / total:.0f}%" for k, s in ranked[:limit]) if total > 0 else "-"


def models_summary(cases: dict[str, dict[str, Any]]) -> list[str]:
    """The summary of a ``--models`` run: per model the ratio and the kinds, the geometric mean."""
    from fusiontune.measure.profile import ProfileReport

    lines = [
        "## Summary: onnxruntime / fusiontune per model",
        "",
        "| model | kernels | fusiontune ms | onnxruntime ms | ort / fusiontune | fusiontune max_rel | where fusiontune's time goes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    ratios, summed = [], {}
    for name, res in cases.items():
        if "error" in res:
            lines.append(f"| {name} | - | - | - | - | - | not run: {res['error'].splitlines()[0][:120]} |")
            continue
        peers = res["peers"]
        ft, ort = peers.get("fusiontune", {}), peers.get("onnxruntime", {})
        ratio = res["ratios"].get("onnxruntime")
        if ratio is not None and not ft.get("wrong"):
            ratios.append(ratio)
        where = "-"
        if "profile" in res:
            profile = ProfileReport.from_json(res["profile"])
            by_kind = {k: s for k, (_, s) in profile.by_kind().items()}
            for k, s in by_kind.items():
                summed[k] = summed.get(k, 0.0) + s
            where = kinds_text(by_kind)
        wrong = " **WRONG**" if ft.get("wrong") else ""
        lines.append(
            f"| {name} | {ft.get('kernels', '-')} | {_ms(ft.get('median_s', math.nan))} | {_ms(ort.get('median_s', math.nan))}"
            f" | {'-' if ratio is None else f'{ratio:.2f}x'} | {ft.get('max_rel', math.nan):.1e}{wrong} | {where} |"
        )
    lines.append("")
    if ratios:
        geo = math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios))
        faster = sum(r >= 1.0 for r in ratios)
        lines.append(
            f"geometric mean of onnxruntime / fusiontune over {len(ratios)} models: {geo:.2f}x"
            f" (fusiontune faster on {faster} of {len(ratios)})"
        )
    else:
        lines.append("geometric mean of onnxruntime / fusiontune: no model has both figures")
    if summed:
        lines.append(f"fusiontune's kernel time over all models, by kind: {kinds_text(summed, limit=len(summed))}")
    lines.append("")
    return lines


def case_graph(case: Case, path: Path) -> Any:
    """The fusiontune graph of ``case``, imported from its model file ``path``."""
    from fusiontune.ir.onnx_import import import_onnx

    # A model of --models has symbolic dimensions: the shapes of its arrays fix them.
    shapes = {k: v.shape for k, v in case.inputs.items()} if case.kind == "file" else None
    return import_onnx(path, input_shapes=shapes, dims=case.dims or None)


def bench_loaded(case: Case, path: Path, args: argparse.Namespace, base_config: Any, threads: int) -> tuple[Case, list[PeerRun], dict[str, Any]]:
    """Every peer on ``case``, whose model is the file ``path``: checked, then timed interleaved."""
    from fusiontune.ir.interpreter import run_graph
    from fusiontune.measure import compare, measure_copy_bandwidth, numpy_copy_bandwidth
    from fusiontune.measure.roofline import copy_kernel

    name = case.name
    graph = case_graph(case, path)
    reference = run_graph(graph, case.inputs, dtype="float64")
    floor = compare(run_graph(graph, case.inputs, dtype=None), reference).max_rel
    tolerance = max(20 * floor, 2e-3)
    config, sweep_log, mode = base_config, None, args.mode
    if args.sweep:
        config, sweep_log = sweep_config(graph, case.inputs, reference, max(5 * floor, 1e-4), args.sweep)
    prepare = prepare_isolated if args.isolate else prepare_peers
    runs = prepare(case, graph, path, config, threads, args.skip or (), reference)
    for r in runs:
        if r.outputs is not None:
            try:
                r.max_rel = compare(r.outputs, reference).max_rel
            except (KeyError, ValueError) as exc:
                r.max_rel, r.note = float("inf"), f"{r.note}; outputs do not match: {exc}"
            r.wrong = not r.max_rel <= tolerance
    timed = {r.peer: r.fn for r in runs if r.fn is not None}
    ft_run = next((r for r in runs if r.peer == "fusiontune" and r.fn is not None), None)
    if ft_run is not None and name in MEMORY_BOUND:
        # The reference copy moves the kernel's bytes (half read, half written) and is timed in the
        # same interleaved rounds, by the same statistic (the median), on the same warm caches.
        copy = copy_kernel()
        src = np.ones(max(ft_run.extra["bytes_moved"] // 2, MIB) // 4, dtype=np.float32)
        dst = np.zeros_like(src)
        copy(dst, src)
        timed[COPY] = lambda: copy(dst, src)
    timings = interleaved_rounds(timed, args.rounds, 2) if timed else {}
    for r in runs:
        r.timing = timings.get(r.peer)
    ft = next((r for r in runs if r.peer == "fusiontune" and r.timing is not None), None)
    bw = None
    if ft is not None and COPY in timings:
        moved = ft.extra["bytes_moved"]
        copy_bw = 2 * src.nbytes / timings[COPY].median_s
        achieved = moved / ft.timing.median_s
        bw = {"bytes_moved": moved, "median_s": ft.timing.median_s, "achieved": achieved, "copy_bw": copy_bw,
              "copy_median_s": timings[COPY].median_s, "copy_iqr_s": timings[COPY].iqr_s,
              "best_copy_bw": measure_copy_bandwidth(src.nbytes), "numpy_copy_bw": numpy_copy_bandwidth(src.nbytes),
              "fraction": achieved / copy_bw}
    ratios = {r.peer: r.timing.median_s / ft.timing.median_s for r in runs if ft and r.timing is not None and r.peer != "fusiontune" and not r.wrong}
    res = {
        "kind": case.kind, "title": case.title, "dims": case.dims, "float32_floor_max_rel": floor, "tolerance": tolerance,
        "fusiontune_config": config.key(), "mode": mode, "sweep": sweep_log, "bandwidth": bw, "ratios": ratios,
        "notes": {r.peer: r.note for r in runs},
        "peers": {
            r.peer: {
                "note": r.note, "max_rel": r.max_rel, "wrong": r.wrong, **r.extra,
                **({} if r.timing is None else {
                    "median_s": r.timing.median_s, "iqr_s": r.timing.iqr_s, "cv": r.timing.cv, "ci_low_s": r.timing.ci_low_s,
                    "ci_high_s": r.timing.ci_high_s, "noisy": r.timing.noisy, "attempts": r.timing.attempts,
                    "number": r.timing.number, "samples_s": list(r.timing.samples_s),
                }),
            }
            for r in runs
        },
    }
    return case, runs, res


NOTES_START, NOTES_END = "<!-- notes:start -->", "<!-- notes:end -->"


def kept_notes(path: Path) -> list[str]:
    """The hand-written notes block of an existing results file (why a goal is missed, what was
    tried), kept when the figures are rewritten; the notes name the run they were written for."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    start, end = text.find(NOTES_START), text.find(NOTES_END)
    if start < 0 or end < start:
        return []
    return [*text[start : end + len(NOTES_END)].splitlines(), ""]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables, write RESULTS.md; return every figure.

    Args:
        argv: command-line arguments (see ``--help``); ``sys.argv`` when None.

    Returns:
        Every figure, as ``--json`` writes it.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds: a smoke run")
    parser.add_argument("--only", action="append", choices=[*SUBGRAPHS, *MODELS], help="run only this case (repeatable)")
    parser.add_argument("--skip", action="append", choices=PEERS[1:], help="leave out this peer (repeatable)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (9; quick 3)")
    parser.add_argument("--threads", type=int, help="threads for every peer (default: numba's, what fusiontune uses)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--config", type=Path, help="fusiontune configuration (fusion_switch.cfg or best_config.json)")
    group.add_argument("--sweep", type=int, metavar="N", help="fusiontune: the fastest feasible of defaults, all-off and N random configurations")
    parser.add_argument("--models", type=Path, metavar="DIR", help="run every .onnx file of DIR (inputs: <stem>.inputs.npz or <stem>.npz beside it) instead of the built-in cases")
    parser.add_argument("--match", action="append", metavar="SUBSTRING", help="with --models: only the files whose name holds SUBSTRING (repeatable)")
    parser.add_argument("--results", type=Path, help="markdown results file (default: benchmarks/RESULTS.md; none with --models)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="every peer in a process of its own, their samples still interleaved (default: with --models and more than one thread)")
    parser.add_argument("--also-layer", action="append", default=[], metavar="LAYER", choices=("tbb", "omp", "workqueue"),
                        help="with --isolate: fusiontune once more, on this threading layer (FUSIONTUNE_THREADING), "
                             "in a process of its own, timed in the same rounds (repeatable)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 9)
    if args.models is not None:
        if args.only:
            parser.error("--only names built-in cases; with --models, pick files with --match")
        if not args.models.is_dir():
            parser.error(f"--models {args.models}: no such folder")
        files = model_files(args.models, args.match or ())
        if not files:
            parser.error(f"--models {args.models}: no .onnx file" + (" matches --match" if args.match else ""))
    elif args.match:
        parser.error("--match picks files of --models DIR")
    if args.results is None and args.models is None:
        args.results = Path(__file__).resolve().parent / "RESULTS.md"

    if args.threads and "numba" not in sys.modules:
        # numba reads its thread count once, at import: with one thread the kernels are then
        # compiled serial (a parallel region of one thread still costs its launch)
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
    from fusiontune.codegen.threading_layer import num_threads

    threads = args.threads or num_threads()
    os.environ["NUMBA_NUM_THREADS"] = str(threads)  # what a peer's own process starts with
    use_threads(threads)
    if args.isolate is None:  # see the module docstring
        args.isolate = threads > 1 and args.models is not None
    if args.also_layer and not args.isolate:
        parser.error("--also-layer needs --isolate: a process has one threading layer")
    ALSO_LAYERS[:] = args.also_layer
    from fusiontune.config.fusion_config import FusionConfig
    from fusiontune.measure import machine_info

    if args.config:
        from fusiontune.config.switch_file import load_config

        base, args.mode = load_config(args.config), f"config {args.config.name}"
    else:
        base, args.mode = FusionConfig.defaults(), (f"best of a {args.sweep}-point sweep" if args.sweep else "defaults")
    from fusiontune.measure import MeasureConfig

    info, vers, noise = machine_info(), versions(), MeasureConfig()
    load_start = os.getloadavg()
    header = [
        "# fusiontune vs peers",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/peers.py', *(argv if argv is not None else sys.argv[1:])])}`",
        "",
        f"- machine: {info['cpu_model']}, {info['cpu_count']} logical CPUs ({info['cpus_usable']} usable), {platform.platform()}",
        f"- threads: {threads} for every peer (numba, onnxruntime intra-op spin-waiting up to 1 ms after its last work (benchmarks/_ort.py), torch, numexpr; JAX/XLA uses its own pool over the usable CPUs)",
        "- processes: " + ("every peer in its own, asked for its samples in turn, the others stopped meanwhile (--isolate)" if args.isolate
                           else "one, every peer in it (--no-isolate)"),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
        f"- fusiontune configuration: {args.mode}; rounds: {args.rounds} interleaved, a sample >= {MIN_SAMPLE_S * 1e3:.0f} ms of calls;"
        f" rounds in which a peer's CV exceeds {noise.max_cv:.2f} or its IQR {noise.max_iqr:.0%} of its median are measured again"
        f" (at most {noise.retries} times), then the peer is flagged **noisy**",
        f"- loadavg at start: {' '.join(f'{v:.2f}' for v in load_start)}",
        "- peer / fusiontune: the peer's median time over fusiontune's (> 1: fusiontune is faster). max_rel: against the float64 interpreter;"
        " a peer above max(20 x float32 floor, 2e-3) is flagged WRONG and left out of the goals.",
        "",
    ]
    print("\n".join(header))
    figures: dict[str, Any] = {"machine": info, "versions": vers, "threads": threads, "mode": args.mode, "quick": args.quick, "loadavg_start": list(load_start), "cases": {}}
    body: list[str] = []
    names: list[Any] = files if args.models is not None else (args.only or [*SUBGRAPHS, *MODELS])
    with tempfile.TemporaryDirectory(prefix="fusiontune-peers-") as tmp:
        for item in names:
            name = item.name.removesuffix(".onnx") if isinstance(item, Path) else item
            try:
                if isinstance(item, Path):
                    case, runs, res = bench_model_file(item, args, base, threads)
                else:
                    case, runs, res = bench_case(item, args, base, threads, Path(tmp))
            except Exception as exc:  # e.g. the importer lacks an op: say so, go on
                close_isolated()
                reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
                if isinstance(item, Path):  # one line per model that does not run
                    lines = [f"{name}: not run: {reason}", ""]
                else:
                    lines = [f"### {name}", "", f"not run: {reason}", ""]
                figures["cases"][name] = {"error": reason}
            else:
                close_isolated()
                lines = table_lines(case, runs, res["bandwidth"])
                if "profile" in res:
                    from fusiontune.measure.profile import ProfileReport, kind_text

                    profile = ProfileReport.from_json(res["profile"])
                    lines[-1:-1] = [
                        f"fusiontune by kernel kind: {kind_text(profile)}; sum of kernel medians"
                        f" {_ms(profile.kernel_sum_s)} ms, whole program {_ms(profile.program_median_s)} ms",
                    ]
                figures["cases"][name] = res
            print("\n".join(lines), flush=True)
            body += lines
    if args.models is not None:
        summary = models_summary(figures["cases"])
        print("\n".join(summary), flush=True)
        body += summary
    goals = goal_lines({k: v for k, v in figures["cases"].items() if "error" not in v}, args.mode)
    figures["goals"] = goals
    figures["loadavg_end"] = list(os.getloadavg())
    tail = ["## Goals", "", *goals, "", f"loadavg at end: {' '.join(f'{v:.2f}' for v in figures['loadavg_end'])}", ""]
    print("\n".join(tail))
    if args.results is not None:
        notes = kept_notes(args.results)
        args.results.write_text("\n".join(header + notes + ["## Results", ""] + body + tail), encoding="utf-8")
        print(f"wrote {args.results}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2, default=str)
        print(f"wrote {args.json}")
    return figures


if __name__ == "__main__":
    main()
