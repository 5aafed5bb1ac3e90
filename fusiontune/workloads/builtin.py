"""The built-in workloads: the seeds' MindSpore networks and decomposed transformer / llama / MLP blocks.

The transformer, llama and MLP blocks are written in decomposed primitive form (softmax as
max / sub / exp / sum / div, LayerNorm and RMSNorm as their reductions, GELU through Erf, SiLU
through Sigmoid), as exporters emit them, so the GraphFusion passes have real patterns to fold.
Weights are deterministic float32 constants (``np.random.default_rng``), scaled by 1/sqrt(fan_in)
so activations stay of order one whatever the sizes.

One table, :data:`WORKLOADS`, lists them; :func:`make_workload` is the only way in.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from fusiontune.errors import UserError
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph
from fusiontune.ir.training import TrainSpec
from fusiontune.workloads._memory import check_fits, workload_bytes
from fusiontune.workloads.workload import InputSpec, Workload, WorkloadSpec, build_workload

_SHAPES_ONLY = contextvars.ContextVar("fusiontune_shapes_only", default=False)
"""True while :func:`graph_shapes` builds a graph for its shapes alone: weights are then
zero-stride views that take no memory whatever their shape."""


# ---- the seeds (MindSpore graph-kernel tutorials, seeds 000 and 001) ---------------------------
def mindspore_basic(*, rows: int, cols: int) -> Graph:
    """Seed 001 NetBasicFuse / seed 000 MyNet: ``x * 2.0 + 1.0``."""
    g = GraphBuilder("mindspore_basic")
    x = g.input("x", (rows, cols))
    a = g.mul(x, 2.0)
    g.output(g.add(a, 1.0))
    return g.build()


def mindspore_composite(*, rows: int, cols: int) -> Graph:
    """Seed 001 NetCompositeFuse: ``(x * 2.0 + 1.0) ** 3.0``; Pow joins only at composite fusion."""
    g = GraphBuilder("mindspore_composite")
    x = g.input("x", (rows, cols))
    a = g.add(g.mul(x, 2.0), 1.0)
    g.output(g.pow(a, 3.0))
    return g.build()


def my_op(g: GraphBuilder, x: Tensor, y: Tensor) -> Tensor:
    """Seed 000's custom composite op ``MyOp(x, y) = (x - y) * x``, built from basic ops.

    The scope only names the nodes (``MyOp/Sub_0``); fusion is free to cross the boundary.
    """
    with g.scope("MyOp"):
        return g.mul(g.sub(x, y), x)


def mindspore_custom_op(*, rows: int, cols: int) -> Graph:
    """Seed 000 MyNet with MyOp: ``b = (x * 2.0) ** 3.0; MyOp(b, y)``."""
    g = GraphBuilder("mindspore_custom_op")
    x = g.input("x", (rows, cols))
    y = g.input("y", (rows, cols))
    b = g.pow(g.mul(x, 2.0), 3.0)
    g.output(my_op(g, b, y))
    return g.build()


# ---- decomposed blocks -------------------------------------------------------------------------
class _Weights:
    """Deterministic float32 parameters, drawn in build order from one seeded generator."""

    def __init__(self, g: GraphBuilder, seed: int) -> None:
        self.g = g
        self.rng = np.random.default_rng(seed)
        self.shapes_only = _SHAPES_ONLY.get()

    def _const(self, draw: Callable[[], np.ndarray], shape: tuple[int, ...], name: str) -> Tensor:
        if self.shapes_only:
            return _placeholder(self.g, shape, name)
        return self.g.const(draw().astype(np.float32), name=name)

    def matrix(self, fan_in: int, fan_out: int, name: str) -> Tensor:
        shape = (fan_in, fan_out)
        return self._const(lambda: self.rng.standard_normal(shape) / math.sqrt(fan_in), shape, name)

    def bias(self, n: int, name: str) -> Tensor:
        return self._const(lambda: 0.02 * self.rng.standard_normal(n), (n,), name)

    def gamma(self, n: int, name: str) -> Tensor:
        return self._const(lambda: 1.0 + 0.1 * self.rng.standard_normal(n), (n,), name)

    def beta(self, n: int, name: str) -> Tensor:
        return self._const(lambda: 0.1 * self.rng.standard_normal(n), (n,), name)


def _placeholder(g: GraphBuilder, shape: tuple[int, ...], name: str) -> Tensor:
    """A float32 constant of ``shape`` that takes no memory (a broadcast zero), for shapes only.

    The dtype is passed so the builder keeps the view instead of copying it into a real array.
    """
    return g.const(np.broadcast_to(np.float32(0.0), shape), name=name, dtype="float32")


def _linear(g: GraphBuilder, w: _Weights, x: Tensor, n_out: int, name: str, bias: bool) -> Tensor:
    """``x @ W (+ b)``: a MatMul with a constant weight, the bias as a separate Add of an (n,) vector."""
    y = g.matmul(x, w.matrix(x.shape[-1], n_out, f"{name}/weight"))
    return g.add(y, w.bias(n_out, f"{name}/bias")) if bias else y


def _attention(
    g: GraphBuilder, w: _Weights, x: Tensor, heads: int, bias: bool, mask: Tensor | None = None
) -> Tensor:
    """Multi-head self-attention over ``x`` (B, S, H), projections included, softmax decomposed."""
    batch, seq, hidden = x.shape
    d = hidden // heads

    def split_heads(t: Tensor, perm: tuple[int, ...]) -> Tensor:
        return g.transpose(g.reshape(t, (batch, seq, heads, d)), perm)

    q = split_heads(_linear(g, w, x, hidden, "attention/q", bias), (0, 2, 1, 3))  # (B, h, S, d)
    k = split_heads(_linear(g, w, x, hidden, "attention/k", bias), (0, 2, 3, 1))  # (B, h, d, S)
    v = split_heads(_linear(g, w, x, hidden, "attention/v", bias), (0, 2, 1, 3))  # (B, h, S, d)
    scores = g.mul(g.matmul(q, k), 1.0 / math.sqrt(d))
    if mask is not None:
        scores = g.add(scores, mask)
    ctx = g.matmul(g.softmax_decomposed(scores), v)
    ctx = g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (batch, seq, hidden))
    return _linear(g, w, ctx, hidden, "attention/out", bias)


def _check_heads(hidden: int, heads: int) -> None:
    if hidden % heads:
        raise UserError(f"hidden ({hidden}) must be a multiple of heads ({heads})")


def transformer_block(*, batch: int, seq: int, hidden: int, heads: int, ffn: int) -> Graph:
    """A post-norm BERT-style encoder block: attention, Add + LayerNorm, GELU FFN, Add + LayerNorm."""
    _check_heads(hidden, heads)
    g = GraphBuilder("transformer_block")
    w = _Weights(g, seed=0)
    x = g.input("x", (batch, seq, hidden))
    with g.scope("attention"):
        attn = _attention(g, w, x, heads, bias=True)
    with g.scope("ln1"):
        h = g.layer_norm_decomposed(
            g.add(x, attn), w.gamma(hidden, "ln1/gamma"), w.beta(hidden, "ln1/beta")
        )
    with g.scope("ffn"):
        f = g.gelu_decomposed(_linear(g, w, h, ffn, "ffn/up", bias=True))
        f = _linear(g, w, f, hidden, "ffn/down", bias=True)
    with g.scope("ln2"):
        out = g.layer_norm_decomposed(
            g.add(h, f), w.gamma(hidden, "ln2/gamma"), w.beta(hidden, "ln2/beta")
        )
    g.output(out)
    return g.build()


def causal_mask(seq: int) -> np.ndarray:
    """(S, S) float32: 0 where a query may attend (key <= query), -1e9 above the diagonal."""
    return np.triu(np.full((seq, seq), -1e9, dtype=np.float32), k=1)


def llama_block(*, batch: int, seq: int, hidden: int, heads: int, ffn: int) -> Graph:
    """A pre-norm llama decoder block: RMSNorm, causal attention, residual, RMSNorm, SwiGLU MLP, residual."""
    _check_heads(hidden, heads)
    g = GraphBuilder("llama_block")
    w = _Weights(g, seed=0)
    x = g.input("x", (batch, seq, hidden))
    with g.scope("attention_norm"):
        h = g.rms_norm_decomposed(x, w.gamma(hidden, "attention_norm/gamma"))
    with g.scope("attention"):
        if w.shapes_only:
            mask = _placeholder(g, (seq, seq), "attention/causal_mask")
        else:
            mask = g.const(causal_mask(seq), name="attention/causal_mask")
        x1 = g.add(x, _attention(g, w, h, heads, bias=False, mask=mask))
    with g.scope("ffn_norm"):
        h2 = g.rms_norm_decomposed(x1, w.gamma(hidden, "ffn_norm/gamma"))
    with g.scope("mlp"):
        gate = _linear(g, w, h2, ffn, "mlp/gate", bias=False)
        up = _linear(g, w, h2, ffn, "mlp/up", bias=False)
        down = _linear(g, w, g.mul(g.silu_decomposed(gate), up), hidden, "mlp/down", bias=False)
        out = g.add(x1, down)
    g.output(out)
    return g.build()


def mlp(*, batch: int, hidden: int) -> Graph:
    """Three dense layers on ``x`` (B, H): Relu, then decomposed erf GELU, then linear."""
    g = GraphBuilder("mlp")
    w = _Weights(g, seed=0)
    x = g.input("x", (batch, hidden))
    with g.scope("fc1"):
        h = g.relu(_linear(g, w, x, hidden, "fc1", bias=True))
    with g.scope("fc2"):
        h = g.gelu_decomposed(_linear(g, w, h, hidden, "fc2", bias=True))
    with g.scope("fc3"):
        out = _linear(g, w, h, hidden, "fc3", bias=True)
    g.output(out)
    return g.build()


# ---- the table ---------------------------------------------------------------------------------
_SEED_SHAPE = {"rows": 4, "cols": 4}

WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            "mindspore_basic",
            mindspore_basic,
            _SEED_SHAPE,
            "seed 001 NetBasicFuse: x * 2.0 + 1.0 (x = 0.5 gives 2.0 everywhere)",
            InputSpec(fill={"x": 0.5}),
        ),
        WorkloadSpec(
            "mindspore_composite",
            mindspore_composite,
            _SEED_SHAPE,
            "seed 001 NetCompositeFuse: (x * 2.0 + 1.0) ** 3.0",
            InputSpec(seed=0),
        ),
        WorkloadSpec(
            "mindspore_custom_op",
            mindspore_custom_op,
            _SEED_SHAPE,
            "seed 000 MyNet with the MyOp composite: MyOp((x * 2.0) ** 3.0, y) = (b - y) * b",
            InputSpec(fill={"x": 0.2, "y": 0.3}),
        ),
        WorkloadSpec(
            "transformer_block",
            transformer_block,
            {"batch": 2, "seq": 64, "hidden": 128, "heads": 4, "ffn": 512},
            "BERT-style encoder block, decomposed softmax / LayerNorm / erf GELU, biases as Adds",
        ),
        WorkloadSpec(
            "llama_block",
            llama_block,
            {"batch": 2, "seq": 64, "hidden": 128, "heads": 4, "ffn": 384},
            "llama decoder block, decomposed RMSNorm / softmax / SiLU, causal mask, SwiGLU MLP",
        ),
        WorkloadSpec(
            "mlp",
            mlp,
            {"batch": 256, "hidden": 512},
            "three dense layers: MatMul + bias + Relu, + decomposed GELU, + bias",
        ),
    )
}


def list_workloads() -> list[WorkloadSpec]:
    """Every built-in workload's table row, in table order."""
    return list(WORKLOADS.values())


@contextlib.contextmanager
def _shapes_only() -> Iterator[None]:
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def graph_shapes(spec: WorkloadSpec, sizes: Mapping[str, int]) -> Graph:
    """The graph of ``spec`` at ``sizes`` with placeholder weights: every shape, no memory.

    Args:
        spec: the table row.
        sizes: complete size parameters.

    Returns:
        The graph; its weights are zero-stride views, good for shapes and byte counts only.
    """
    with _shapes_only():
        return spec.build(**sizes)


def make_workload(name: str, *, train: TrainSpec | None = None, **sizes: int) -> Workload:
    """Build a built-in workload: its graph, inputs and float64 reference outputs.

    Before any array is made, the graph is built for its shapes alone and the bytes the workload
    needs (inputs, weights and the float64 reference, :func:`~fusiontune.workloads._memory.
    workload_bytes`) are compared with the memory the machine has available.

    Args:
        name: a key of :data:`WORKLOADS`.
        train: build the model's training step instead of its inference (its reference is the
            step's; the forward's own is not run).
        **sizes: size parameters overriding the workload's defaults (positive integers).

    Returns:
        The workload.

    Raises:
        UserError: unknown workload name (the message names the closest ones), unknown size
            key (the message lists the valid ones), a size that is not a positive integer or
            does not fit the others, or sizes that need more memory than the machine has
            available (the message names the sizes and both amounts).
    """
    spec = WORKLOADS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(WORKLOADS), n=3, cutoff=0.4)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(WORKLOADS)}"
        raise UserError(f"unknown workload {name!r} ({hint})")
    unknown = [k for k in sizes if k not in spec.sizes]
    if unknown:
        raise UserError(
            f"workload {name}: unknown size {unknown[0]!r} (valid sizes: {', '.join(spec.sizes)})"
        )
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(
                f"workload {name}: size {key} must be a positive integer, got {value!r}"
            )
    merged = {**spec.sizes, **{k: int(v) for k, v in sizes.items()}}
    given = ", ".join(f"{k}={int(v)}" for k, v in sizes.items())
    what = f"{name}: {given}" if given else f"{name} at its default sizes"
    try:
        shapes = graph_shapes(spec, merged)
    except (ValueError, OverflowError) as e:  # numpy's shape arithmetic is int64: 2**63 breaks it
        raise UserError(f"{what}: no graph has these sizes ({e})") from None
    check_fits(workload_bytes(shapes), what, "inputs, weights and the float64 reference")
    return build_workload(spec, merged, train)
