"""Build the three ONNX models the shipped search spaces tune, with onnx.helper (no torch needed).

Each model is written the way torch.onnx exports its kind of network, so that the importer and the
fusion passes meet the patterns they meet in the field: BatchNormalization after Conv, a
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` shape subgraph, the erf GELU as
Div / Erf / Add / Mul / Mul, the HuggingFace attention mask (Unsqueeze, Cast, Sub from 1, Mul by
-10000), RMSNorm as Pow / ReduceMean / Add / Sqrt / Div / Mul, SiLU as Sigmoid * x. Batch and
sequence (and image size) are symbolic dimensions (``dim_param``): the search space fixes them.

* ``resnet_cnn.onnx``: stem Conv 3x3 + BN + Relu, MaxPool, four basic residual blocks (the third
  with stride 2 and a 1x1 projection), GlobalAveragePool, Flatten, Gemm. Input ``image``
  (batch, 3, height, width).
* ``bert_encoder.onnx``: token + position embeddings, LayerNormalization, two post-norm encoder
  layers (hidden 128, 4 heads, FFN 512). The two layers share their weights (ALBERT's cross-layer
  sharing) so that the file stays well under 2 MB with a vocabulary of 1000. Inputs ``input_ids``
  and ``attention_mask``, int64 (batch, seq).
* ``llama_decoder.onnx``: two pre-norm llama decoder layers (hidden 128, 4 heads, SwiGLU MLP 256),
  causal mask, final RMSNorm. Input ``hidden_states`` float32 (batch, seq, hidden).

Weights are drawn from a fixed seed, so the files are reproducible byte for byte.

    .venv/bin/python search_spaces/models/export_models.py           # write the three files here
    .venv/bin/python search_spaces/models/export_models.py --check   # also check and run each with onnxruntime
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as exc:  # pragma: no cover - the message is the point
    raise SystemExit("export_models.py needs the onnx package: pip install onnx") from exc

OPSET = 17
HERE = Path(__file__).resolve().parent
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


class Builder:
    """A small graph writer over onnx.helper: unique names, initializers, nodes in order."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return f"{base}_{n}" if n else base

    def input(self, name: str, elem: int, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, elem: int, shape: Sequence[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def i64(self, base: str, values: Sequence[int]) -> str:
        return self.const(base, np.asarray(values, dtype=np.int64))

    def scalar(self, base: str, value: float) -> str:
        return self.const(base, np.asarray(value, dtype=np.float32))

    def weight(self, base: str, shape: Sequence[int], fan_in: int) -> str:
        w = self.rng.standard_normal(shape) / math.sqrt(fan_in)
        return self.const(base, w.astype(np.float32))

    def vector(self, base: str, n: int, center: float = 0.0, spread: float = 0.02) -> str:
        return self.const(base, (center + spread * self.rng.standard_normal(n)).astype(np.float32))

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, out: str | None = None, **attrs: object) -> str | list[str]:
        base = out or op_type.lower()
        outs = [self.fresh(base) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"{op_type}"), **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fusiontune-export_models")
        model.ir_version = 8  # opset 17's IR version; loadable by every onnxruntime since 1.13
        return model


# ---- resnet_cnn ------------------------------------------------------------------------------
def _conv_bn(b: Builder, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
    """Conv (no bias, as torchvision) + BatchNormalization (+ Relu)."""
    w = b.weight("conv.weight", (cout, cin, k, k), cin * k * k)
    p = k // 2
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p])
    gamma = b.vector("bn.weight", cout, 1.0, 0.1)
    beta = b.vector("bn.bias", cout, 0.0, 0.1)
    mean = b.vector("bn.running_mean", cout, 0.0, 0.1)
    var = b.const("bn.running_var", (1.0 + 0.2 * b.rng.random(cout)).astype(np.float32))
    y = b.op("BatchNormalization", [y, gamma, beta, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def _basic_block(b: Builder, x: str, cin: int, cout: int, stride: int) -> str:
    """torchvision's BasicBlock: relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))."""
    y = _conv_bn(b, x, cin, cout, 3, stride, True)
    y = _conv_bn(b, y, cout, cout, 3, 1, False)
    short = _conv_bn(b, x, cin, cout, 1, stride, False) if (stride != 1 or cin != cout) else x
    return b.op("Relu", [b.op("Add", [y, short])])


def build_resnet_cnn(classes: int = 10) -> onnx.ModelProto:
    b = Builder("resnet_cnn", seed=0)
    x = b.input("image", F32, ["batch", 3, "height", "width"])
    y = _conv_bn(b, x, 3, 32, 3, 1, True)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = _basic_block(b, y, 32, 32, 1)
    y = _basic_block(b, y, 32, 32, 1)
    y = _basic_block(b, y, 32, 64, 2)
    y = _basic_block(b, y, 64, 64, 1)
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    w = b.weight("fc.weight", (classes, 64), 64)
    bias = b.vector("fc.bias", classes, 0.0, 0.1)
    b.op("Gemm", [y, w, bias], out="logits", alpha=1.0, beta=1.0, transB=1)
    b.output("logits", F32, ["batch", classes])
    return b.model("small ResNet-style CNN: stem, maxpool, 4 basic blocks, global average pool, classifier")


# ---- shared transformer pieces ---------------------------------------------------------------
def _dims(b: Builder, x: str) -> tuple[str, str]:
    """``batch`` and ``seq`` of ``x`` as 1-D int64 tensors, as torch exports ``x.size(0)``."""
    shape = b.op("Shape", [x])
    batch = b.op("Unsqueeze", [b.op("Gather", [shape, b.const("idx0", np.asarray(0, np.int64))], axis=0), b.i64("axes0", [0])])
    seq = b.op("Unsqueeze", [b.op("Gather", [shape, b.const("idx1", np.asarray(1, np.int64))], axis=0), b.i64("axes0", [0])])
    return batch, seq


def _split_heads(b: Builder, x: str, heads: int, dh: int, dims: tuple[str, str], perm: Sequence[int]) -> str:
    """(batch, seq, hidden) -> Reshape (batch, seq, heads, dh) by a Concat'ed shape -> Transpose."""
    shape = b.op("Concat", [dims[0], dims[1], b.i64("heads", [heads]), b.i64("head_dim", [dh])], axis=0)
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=list(perm))


def _merge_heads(b: Builder, x: str, hidden: int) -> str:
    """(batch, heads, seq, dh) -> (batch, seq, hidden): Transpose, then Reshape by a constant."""
    y = b.op("Transpose", [x], perm=[0, 2, 1, 3])
    return b.op("Reshape", [y, b.i64("merged_shape", [0, 0, hidden])])


def _linear(b: Builder, x: str, w: str, bias: str | None) -> str:
    y = b.op("MatMul", [x, w])
    return b.op("Add", [bias, y]) if bias is not None else y  # torch puts the bias first


def _attention(b: Builder, x: str, p: dict[str, str], heads: int, hidden: int, dims: tuple[str, str], mask: str) -> str:
    dh = hidden // heads
    q = _split_heads(b, _linear(b, x, p["wq"], p.get("bq")), heads, dh, dims, [0, 2, 1, 3])
    k = _split_heads(b, _linear(b, x, p["wk"], p.get("bk")), heads, dh, dims, [0, 2, 3, 1])  # K^T
    v = _split_heads(b, _linear(b, x, p["wv"], p.get("bv")), heads, dh, dims, [0, 2, 1, 3])
    s = b.op("Div", [b.op("MatMul", [q, k]), b.scalar("sqrt_head_dim", math.sqrt(dh))])
    s = b.op("Add", [s, mask])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    return _linear(b, _merge_heads(b, a, hidden), p["wo"], p.get("bo"))


def _seq_slice(b: Builder, table: str, seq: str, axes: Sequence[int]) -> str:
    """``table[:seq]`` on ``axes``, with ``seq`` from the shape subgraph (constant once dims are fixed)."""
    starts = b.i64("zeros", [0] * len(axes))
    ends = seq if len(axes) == 1 else b.op("Concat", [seq] * len(axes), axis=0)
    return b.op("Slice", [table, starts, ends, b.i64("slice_axes", list(axes))])


# ---- bert_encoder ----------------------------------------------------------------------------
def _gelu_erf(b: Builder, x: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt 2))`` as torch.onnx exports nn.GELU()."""
    e = b.op("Erf", [b.op("Div", [x, b.scalar("sqrt2", math.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [e, b.scalar("one", 1.0)])]), b.scalar("half", 0.5)])


def _layer_norm(b: Builder, x: str, hidden: int) -> str:
    return b.op("LayerNormalization", [x, b.vector("ln.weight", hidden, 1.0, 0.1), b.vector("ln.bias", hidden, 0.0, 0.1)], axis=-1, epsilon=1e-12)


def build_bert_encoder(vocab: int = 1000, hidden: int = 128, heads: int = 4, layers: int = 2, max_pos: int = 128) -> onnx.ModelProto:
    b = Builder("bert_encoder", seed=1)
    ids = b.input("input_ids", I64, ["batch", "seq"])
    mask_in = b.input("attention_mask", I64, ["batch", "seq"])
    dims = _dims(b, ids)
    tok = b.op("Gather", [b.weight("embeddings.word", (vocab, hidden), 25), ids], axis=0)
    pos = _seq_slice(b, b.weight("embeddings.position", (max_pos, hidden), 25), dims[1], [0])
    x = _layer_norm(b, b.op("Add", [tok, pos]), hidden)
    # HuggingFace's extended mask: (1 - mask[:, None, None, :]) * -10000. The Cast to bool first
    # treats any non-zero entry as "attend", so random integer masks make sense too.
    m = b.op("Unsqueeze", [mask_in, b.i64("mask_axes", [1, 2])])
    m = b.op("Cast", [b.op("Cast", [m], to=TensorProto.BOOL)], to=F32)
    mask = b.op("Mul", [b.op("Sub", [b.scalar("one", 1.0), m]), b.scalar("mask_min", -10000.0)])
    ffn = 4 * hidden
    shared = {
        "wq": b.weight("attn.q.weight", (hidden, hidden), hidden), "bq": b.vector("attn.q.bias", hidden),
        "wk": b.weight("attn.k.weight", (hidden, hidden), hidden), "bk": b.vector("attn.k.bias", hidden),
        "wv": b.weight("attn.v.weight", (hidden, hidden), hidden), "bv": b.vector("attn.v.bias", hidden),
        "wo": b.weight("attn.out.weight", (hidden, hidden), hidden), "bo": b.vector("attn.out.bias", hidden),
    }
    w1, b1 = b.weight("ffn.in.weight", (hidden, ffn), hidden), b.vector("ffn.in.bias", ffn)
    w2, b2 = b.weight("ffn.out.weight", (ffn, hidden), ffn), b.vector("ffn.out.bias", hidden)
    for _ in range(layers):  # ALBERT-style: every layer uses the same weights, its own LayerNorms
        x = _layer_norm(b, b.op("Add", [_attention(b, x, shared, heads, hidden, dims, mask), x]), hidden)
        h = _gelu_erf(b, _linear(b, x, w1, b1))
        x = _layer_norm(b, b.op("Add", [_linear(b, h, w2, b2), x]), hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    b.output("last_hidden_state", F32, ["batch", "seq", hidden])
    return b.model("BERT-style encoder: embeddings, LayerNorm, 2 post-norm layers (weights shared), erf GELU")


# ---- llama_decoder ---------------------------------------------------------------------------
def _rms_norm(b: Builder, x: str, hidden: int, eps: float = 1e-6) -> str:
    """``x / sqrt(mean(x^2) + eps) * weight`` as exported: Pow, ReduceMean, Add, Sqrt, Div, Mul."""
    ms = b.op("ReduceMean", [b.op("Pow", [x, b.scalar("two", 2.0)])], axes=[-1], keepdims=1)
    y = b.op("Div", [x, b.op("Sqrt", [b.op("Add", [ms, b.scalar("rms_eps", eps)])])])
    return b.op("Mul", [b.vector("norm.weight", hidden, 1.0, 0.1), y])


def build_llama_decoder(hidden: int = 128, heads: int = 4, ffn: int = 256, layers: int = 2, max_pos: int = 128) -> onnx.ModelProto:
    b = Builder("llama_decoder", seed=2)
    x = b.input("hidden_states", F32, ["batch", "seq", hidden])
    dims = _dims(b, x)
    # Causal mask as GPT-2 exports it: a registered tril(ones) buffer cut to (seq, seq), then
    # Where(tril == 0, -1e9, 0): key j > query i is masked.
    tril = np.tril(np.ones((max_pos, max_pos), dtype=np.float32))
    keep = _seq_slice(b, b.const("causal_tril", tril), dims[1], [0, 1])
    blocked = b.op("Equal", [keep, b.scalar("zero", 0.0)])
    mask = b.op("Where", [blocked, b.scalar("neg_big", -1e9), b.scalar("zero", 0.0)])
    for _ in range(layers):
        p = {name: b.weight(f"attn.{name}", (hidden, hidden), hidden) for name in ("wq", "wk", "wv", "wo")}
        x = b.op("Add", [x, _attention(b, _rms_norm(b, x, hidden), p, heads, hidden, dims, mask)])
        h = _rms_norm(b, x, hidden)
        gate = b.op("MatMul", [h, b.weight("mlp.gate", (hidden, ffn), hidden)])
        up = b.op("MatMul", [h, b.weight("mlp.up", (hidden, ffn), hidden)])
        act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])  # silu, as exported
        x = b.op("Add", [x, b.op("MatMul", [b.op("Mul", [act, up]), b.weight("mlp.down", (ffn, hidden), ffn)])])
    y = _rms_norm(b, x, hidden)
    b.nodes.append(helper.make_node("Identity", [y], ["output"], name="output"))
    b.output("output", F32, ["batch", "seq", hidden])
    return b.model("llama-style decoder: 2 pre-RMSNorm layers, causal attention, SwiGLU MLP, final RMSNorm")


MODELS = {
    "resnet_cnn": (build_resnet_cnn, {"batch": 2, "height": 32, "width": 32}),
    "bert_encoder": (build_bert_encoder, {"batch": 2, "seq": 64}),
    "llama_decoder": (build_llama_decoder, {"batch": 2, "seq": 64}),
}


def sample_inputs(model: onnx.ModelProto, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a check run: normal floats, token ids below 1000, 0/1 masks."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        shape = [d.dim_value or dims[d.dim_param] for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == I64:
            high = 2 if "mask" in vi.name else 1000
            feeds[vi.name] = rng.integers(0, high, size=shape).astype(np.int64)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def check(path: Path, dims: dict[str, int]) -> str:
    """onnx.checker (full), shape inference, then one onnxruntime run; returns a summary line."""
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    try:
        import onnxruntime as ort
    except ImportError:
        return f"{path.name}: checker ok ({len(model.graph.node)} nodes); onnxruntime not installed, not run"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = sess.run(None, sample_inputs(model, dims))
    for o in outs:
        if not np.all(np.isfinite(o)):
            raise SystemExit(f"{path.name}: onnxruntime output has non-finite values")
    shapes = ", ".join(str(tuple(o.shape)) for o in outs)
    kib = path.stat().st_size / 1024
    return f"{path.name}: {kib:.0f} KiB, {len(model.graph.node)} nodes, checker ok, onnxruntime {dims} -> {shapes}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write to (default: this one)")
    parser.add_argument("--check", action="store_true", help="check each model and run it with onnxruntime")
    parser.add_argument("--only", choices=sorted(MODELS), action="append", help="build only this model")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or MODELS:
        build, dims = MODELS[name]
        path = args.out / f"{name}.onnx"
        onnx.save(build(), str(path))
        print(check(path, dims) if args.check else f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
