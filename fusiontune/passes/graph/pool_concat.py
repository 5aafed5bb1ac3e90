"""MaxPoolConcatSwapPass: MaxPool(Concat(parts)) on the channels -> Concat(MaxPool(part), ...)."""

from __future__ import annotations

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.ir.ops import normalize_axis
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import View, effective_attrs
from fusiontune.passes.pipeline import patterns


@patterns("MaxPoolConcat")
def max_pool_concat_swap(graph: Graph, ctx: PassContext) -> Graph:
    """Pool each part of a channel Concat instead of the Concat: ``MaxPool(Concat(a, b, axis=1))
    == Concat(MaxPool(a), MaxPool(b), axis=1)``.

    Identity: a max pool works on each (image, channel) plane alone, so pooling the parts and
    joining them gives the same elements at the same places, exactly. What it buys: each part's
    pool can then end its conv's kernel (ConvMaxPoolFusionPass), and the Concat joins the pooled parts, a
    quarter of the data at stride 2, or none at all when the convs write into it
    (ConvConcatFusionPass): a SqueezeNet fire module followed by a pool. Preconditions: a 2-D
    MaxPool without an Indices output; the Concat is along axis 1 of a 4-D tensor, read by the
    MaxPool alone and no graph output, and every part is computed by a Conv (so each pool can
    join its kernel). fusiontune's own switch (CANN has none of this name).
    """
    view = View(graph)
    editor = GraphEditor(graph)
    changed = False
    for pool in graph.nodes:
        if pool.op != "MaxPool" or len(pool.outputs) != 1:
            continue
        cat = view.producer(pool.inputs[0], "Concat")
        if cat is None or view.is_output(cat.outputs[0]) or len(view.readers(cat.outputs[0])) != 1:
            continue
        shape = view.shape(cat.outputs[0])
        if len(shape) != 4 or normalize_axis(effective_attrs(cat)["axis"], 4) != 1:
            continue
        if not all(_from_conv(view, part) for part in cat.inputs):
            continue
        origin = view.origin((cat, pool))
        if not ctx.allow("MaxPoolConcat", origin):
            continue
        out = view.shape(pool.outputs[0])
        pooled = []
        for part in cat.inputs:
            value = editor.add_value(editor.fresh(f"{part}/pooled"), (out[0], view.shape(part)[1], *out[2:]),
                                     view.dtype(part))
            editor.add_node(Node(editor.fresh(f"{pool.name}/part"), "MaxPool", (part,), (value,), pool.attrs, origin))
            pooled.append(value)
        editor.remove_nodes([cat.name, pool.name])
        editor.add_node(Node(cat.name, "Concat", tuple(pooled), pool.outputs, cat.attrs, origin))
        changed = True
    return editor.finish() if changed else graph


_UNARY = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "BatchNorm")


def _from_conv(view: View, value: str) -> bool:
    """``value`` is a Conv's output, or a short chain of activations over one (its first input)."""
    seen = 0
    node = view.producer(value)
    while node is not None and seen < 8:
        if node.op == "Conv":
            return True
        if node.op not in _UNARY:
            return False
        node = view.producer(node.inputs[0])
        seen += 1
    return False
