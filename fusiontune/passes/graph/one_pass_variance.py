"""OnePassVarianceFusionPass: LayerNorm's variance as E[x^2] - E[x]^2, in one sweep (inexact)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fusiontune.ir.graph import Graph, GraphEditor, Node
from fusiontune.ir.ops import FLOAT_DTYPES, infer_node
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph._match import View, effective_attrs
from fusiontune.passes.pattern import Match, P, V, match_node
from fusiontune.passes.pipeline import patterns


@dataclass(frozen=True)
class _Variance:
    """A two-pass variance written out: ``x``, its mean ``m`` and ``d = x - m`` over ``axis``.

    ``nodes`` are the matched nodes (the mean, the Sub, then the square and the variance mean,
    or the RMSNorm of ``d``); ``removed`` those the rewrite replaces.
    """

    pattern: str
    nodes: tuple[Node, ...]
    removed: tuple[Node, ...]
    x: str
    mean: str
    d: str
    axis: int


def _float(view: View, value: str) -> bool:
    return view.dtype(value) in FLOAT_DTYPES


def _two_pass(view: View, node: Node) -> bool:
    return effective_attrs(node)["variance"] == "two_pass"


_x = V("x", where=_float)
_D = P("Sub", _x, P("ReduceMean", _x, name="mean"), name="sub")
MARK_RULES = (
    ("OnePassVarianceLayerNorm", P("LayerNorm", V("x"), V("g"), V("b"), where=_two_pass)),
    (
        "OnePassVarianceAddLayerNorm",
        P("AddLayerNorm", V("a"), V("r"), V("g"), V("b"), where=_two_pass),
    ),
)
"""Fused norms whose ``variance`` attribute becomes ``one_pass``."""
VARIANCE_RULES = (
    # The canonical form writes the square Mul(d, d) (the canonicalize stage rewrites Pow(d, 2)).
    ("OnePassVarianceMul", P("ReduceMean", P("Mul", _D, _D, name="square"), name="var")),
    ("OnePassVarianceCentredRmsNorm", P("RMSNorm", _D, V("gamma"), name="rms")),
)
"""Two-sweep variances written out (or an RMSNorm's mean of squares of a centred input)."""


def _variance(pattern: str, m: Match) -> _Variance | None:
    """The two-pass variance a match of :data:`VARIANCE_RULES` found, or None."""
    view, mean, sub = m.view, m.node("mean"), m.node("sub")
    d = sub.outputs[0]
    if view.shape(d) != view.shape(m["x"]):
        return None
    if m.has_node("var"):
        var, square = m.node("var"), m.node("square")
        axis = view.reduce_axis(var)
        if (
            axis is None
            or view.reduce_axis(mean) != axis
            or view.sole_reader(square.outputs[0]) is not var
        ):
            return None
        return _Variance(
            pattern, (mean, sub, square, var), (square, var), m["x"], mean.outputs[0], d, axis
        )
    rms = m.node("rms")
    axis = len(view.shape(d)) - 1
    if view.reduce_axis(mean) != axis or view.dtype(m["gamma"]) != view.dtype(d):
        return None
    return _Variance(pattern, (mean, sub, rms), (rms,), m["x"], mean.outputs[0], d, axis)


def _match_at(view: View, node: Node) -> tuple[str, _Variance | None] | None:
    """The first rule matching at ``node``: (pattern, None) for a fused norm to mark, (pattern,
    variance) for a variance to rewrite; None when none matches."""
    for name, pattern in MARK_RULES:
        if next(match_node(pattern, node, Match(view)), None) is not None:
            return name, None
    for name, pattern in VARIANCE_RULES:
        for m in match_node(pattern, node, Match(view)):
            found = _variance(name, m)
            if found is not None:
                return name, found
    return None


def _candidates(view: View) -> Iterator[tuple[str, Node, _Variance | None]]:
    """(pattern, anchor, decomposed match or None) in node order."""
    for node in view.graph.nodes:
        hit = _match_at(view, node)
        if hit is not None:
            yield hit[0], node, hit[1]


class _Writer:
    """Adds primitive nodes to an editor; each new node stands for ``origin``."""

    def __init__(self, ed: GraphEditor, stem: str, origin: tuple[str, ...]) -> None:
        self.ed = ed
        self.stem = stem
        self.origin = origin

    def op(self, kind: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        name = self.ed.fresh(f"{self.stem}/{kind}")
        out = out or name
        node = Node(name, kind, inputs, (out,), attrs, self.origin)
        ((shape, dtype),) = infer_node(node, [self.ed.values[i] for i in inputs])
        if out not in self.ed.values:
            self.ed.add_value(out, shape, dtype)
        self.ed.add_node(node)
        return out

    def const(self, value: float, dtype: str) -> str:
        return self.ed.add_constant(np.asarray(value, dtype=dtype), f"{self.stem}/c")


def _rewrite(ed: GraphEditor, view: View, v: _Variance) -> None:
    """Replace the two-pass variance by ``max(E[x*x] - m*m, 0)``, keeping the output names.

    For the decomposed variance the clamp writes the variance mean's output; for a centred
    RMSNorm the normalization is written out after it: ``d * Rsqrt(var + eps) * gamma``, as the
    RMSNorm's expansion (ir/expand.py) computes it.
    """
    anchor = v.removed[-1]
    w = _Writer(ed, anchor.name, view.origin(v.removed))
    dtype = view.dtype(v.x)
    ed.remove_nodes(n.name for n in v.removed)
    msq = w.op("ReduceMean", w.op("Mul", v.x, v.x), axes=(v.axis,), keepdims=True)
    diff = w.op("Sub", msq, w.op("Mul", v.mean, v.mean))
    if anchor.op == "ReduceMean":
        w.op("Maximum", diff, w.const(0.0, dtype), out=anchor.outputs[0])
        return
    var = w.op("Maximum", diff, w.const(0.0, dtype))
    rstd = w.op("Rsqrt", w.op("Add", var, w.const(effective_attrs(anchor)["eps"], dtype)))
    w.op("Mul", w.op("Mul", v.d, rstd), anchor.inputs[1], out=anchor.outputs[0])


@patterns(
    "OnePassVarianceLayerNorm",
    "OnePassVarianceAddLayerNorm",
    "OnePassVarianceMul",
    "OnePassVarianceCentredRmsNorm",
)
def one_pass_variance_fusion(graph: Graph, ctx: PassContext) -> Graph:
    """Compute LayerNorm's variance in one sweep, as ``E[x^2] - E[x]^2``: an inexact rewrite.

    Identity (exact in real arithmetic): ``E[(x - E[x])^2] == E[x^2] - E[x]^2``. The left side
    needs two sweeps over a row (the mean, then the squared deviations); the right side reads x
    once for both sums, as MindSpore's and apex's fused LayerNorm kernels do. The result is
    clamped at 0, ``var = max(E[x^2] - E[x]^2, 0)``, because rounding can make the difference
    negative for a near-constant row, and ``rsqrt`` of a negative number is NaN.

    What it rewrites, in node order:

    * a ``LayerNorm`` or ``AddLayerNorm`` node with ``variance="two_pass"`` gets
      ``variance="one_pass"`` (patterns ``OnePassVarianceLayerNorm``,
      ``OnePassVarianceAddLayerNorm``); the interpreter's reference and the expansion codegen
      lowers (ir/expand.py) honour the attribute;
    * the decomposed variance ``ReduceMean(d * d)`` with ``d = x - ReduceMean(x)`` (the canonical
      form of ``ReduceMean(Pow(d, 2))`` too) becomes ``max(ReduceMean(x * x) - m * m, 0)``
      (pattern ``OnePassVarianceMul``), so the pass changes the program when LayerNormFusionPass
      is off. ``d`` stays for the normalization that reads it;
    * ``RMSNorm(d, gamma)`` with the same centred ``d`` (pattern
      ``OnePassVarianceCentredRmsNorm``): with LayerNormFusionPass off, RmsNormFusionPass folds
      the decomposed LayerNorm's ``d / sqrt(mean(d^2) + eps) * gamma`` into such an RMSNorm, whose
      mean of squares is the two-pass variance. It becomes primitives:
      ``d * Rsqrt(max(ReduceMean(x * x) - m * m, 0) + eps) * gamma``, the RMSNorm's own
      expansion with the variance taken in one sweep.

    Any other RMSNorm, and every AddRmsNorm, is left alone: their statistic, the mean of squares,
    already takes one sweep, so there is nothing to rewrite.

    Error: cancellation. With ``u`` the unit roundoff of the dtype (float32: 6e-8), the computed
    variance has a relative error of about ``u * E[x^2] / var = u * (1 + mean^2 / var)`` (plus
    the sums' accumulation error), against about ``u`` for two passes. For rows whose mean is small
    against their spread the two are alike: on the transformer_block workload's LayerNorm inputs
    (``mean^2 / var <= 0.07``) the float32 one-pass variance is within 1.6e-7 of the exact one with
    numpy's pairwise sums (two passes: 1.2e-7) and within 5.0e-7 with a kernel's sequential sums
    (two passes: 4.2e-7). The registry declares ``expected_error = 1e-6``, the variance's relative
    error for unit-scale inputs (the normalized output gets half of it). The loss grows with an
    offset: for 64 rows of ``1000 + N(0, 1)`` (256 wide) in float32 (``mean^2 / var = 1e6``) the
    one-pass variance is off by 6% (median) to 15% (worst row), the two-pass one by 1e-7.

    Preconditions: the norm is over the last axis (LayerNorm always is); for the decomposed form,
    both means reduce the same single axis with keepdims, the square is read by the variance
    mean only and is no graph output, and x is a float tensor; for the centred RMSNorm, the mean
    reduces the last axis with keepdims and gamma has x's dtype.

    Args:
        graph: the graph to rewrite (after the norm fusion passes).
        ctx: the pass context.

    Returns:
        The rewritten graph (``graph`` itself when nothing matched).
    """
    view = View(graph)
    ed = GraphEditor(graph)
    changed = False
    for pattern, anchor, found in list(_candidates(view)):
        if found is None:
            if not ctx.allow(pattern, anchor.origin):
                continue
            attrs = {**anchor.attrs, "variance": "one_pass"}
            new = Node(anchor.name, anchor.op, anchor.inputs, anchor.outputs, attrs, anchor.origin)
            ed.nodes = [new if n.name == anchor.name else n for n in ed.nodes]
        else:
            if not ctx.allow(pattern, view.origin(found.nodes)):
                continue
            _rewrite(ed, view, found)
        changed = True
    return ed.finish() if changed else graph
