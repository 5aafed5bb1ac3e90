"""Vector-Jacobian rules of the fused backward ops (ir/_ops_grad.py): second derivatives.

A backward op (SoftmaxGrad, LayerNormGrad, RmsNormGrad, GeluGrad, ReluGrad, AttentionGrad) is
differentiated through its expansion (ir/expand.py), the primitive form it stands for: the
expansion becomes a small graph, :func:`~fusiontune.ir.autodiff.grad_graph` writes that graph's
backward from the primitives' rules, and the backward is copied into the graph being built, reading the op's
inputs and the cotangents of its outputs. So a backward can be differentiated again (a
Hessian-vector product) with no hand-written second derivative, and the rules stay exactly the
derivatives of what the ops compute.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusiontune.ir.autodiff import (
    VjpContext,
    cotangent_name,
    grad_graph,
    gradient_name,
    is_float,
    vjp,
)
from fusiontune.ir.builder import Tensor
from fusiontune.ir.expand import expand
from fusiontune.ir.graph import Graph

GRAD_OPS = ("SoftmaxGrad", "LayerNormGrad", "RmsNormGrad", "GeluGrad", "ReluGrad", "AttentionGrad")


@vjp(*GRAD_OPS)
def _through_expansion(c: VjpContext) -> Sequence[Tensor | None]:
    node, b = c.node, c.b
    e = expand(node, b.values)
    inputs = tuple(dict.fromkeys(node.inputs))
    values = {**{i: b.values[i] for i in inputs}, **e.values}
    sub = Graph(f"{node.name}_expanded", values, e.nodes, inputs, node.outputs, dict(e.constants))
    wrt = [i for i, need in zip(node.inputs, c.needs, strict=True) if need and is_float(b.values[i].dtype)]
    wrt = list(dict.fromkeys(wrt))
    if not wrt:
        return [None] * len(node.inputs)
    back = grad_graph(sub, wrt, keep_outputs=False)
    env: dict[str, Tensor] = {i: t for i, t in zip(node.inputs, c.inputs, strict=True)}
    for k, o in enumerate(node.outputs):
        if cotangent_name(o) in back.inputs:
            env[cotangent_name(o)] = c.cot(k)
    for name, arr in back.constants.items():
        env[name] = b.const(np.asarray(arr), dtype=str(arr.dtype))
    for n in back.nodes:
        made = b.op(n.op, *(env[i] for i in n.inputs), n_outputs=len(n.outputs), **dict(n.attrs))
        for o, t in zip(n.outputs, made if len(n.outputs) > 1 else (made,), strict=True):
            env[o] = t
    return [
        env[gradient_name(i)] if need and i in wrt else None
        for i, need in zip(node.inputs, c.needs, strict=True)
    ]
