"""Pieces the LayerNorm and RMSNorm matchers share: square, eps add, root, scale and shift."""

from __future__ import annotations

from dataclasses import dataclass

from fusiontune.ir.graph import Node
from fusiontune.passes.graph._match import View


def square_kind(view: View, node: Node | None, x: str) -> str | None:
    """The square's spelling: "Pow" for ``Pow(x, 2)``, "Mul" for ``Mul(x, x)``, else None."""
    if node is None:
        return None
    if node.op == "Pow" and node.inputs[0] == x and view.scalar_is(node.inputs[1], 2.0):
        return "Pow"
    if node.op == "Mul" and node.inputs == (x, x):
        return "Mul"
    return None


@dataclass(frozen=True)
class Normalized:
    """``x / sqrt(stat + eps)`` found from ``stat``: the nodes, eps, and how the root is taken."""

    nodes: tuple[Node, ...]
    eps: float
    root: str
    out: Node


def normalize_from(view: View, stat: str, x: str) -> Normalized | None:
    """Match ``x / Sqrt(stat + eps)`` or ``x * Rsqrt(stat + eps)`` (any operand order).

    Every link must be the only reader of the value before it.
    """
    add = view.sole_reader(stat, "Add")
    if add is None:
        return None
    scalar = view.graph.scalar_constant
    eps = next((c for a, c in View.orders(add) if a == stat and scalar(c) is not None), None)
    if eps is None:
        return None
    rt = view.sole_reader(add.outputs[0], "Sqrt", "Rsqrt")
    if rt is None:
        return None
    r = rt.outputs[0]
    norm = view.sole_reader(r, "Div" if rt.op == "Sqrt" else "Mul")
    if norm is None:
        return None
    if rt.op == "Sqrt" and norm.inputs != (x, r):
        return None
    if rt.op == "Rsqrt" and (x, r) not in set(View.orders(norm)):
        return None
    return Normalized((add, rt, norm), view.scalar_attr(eps), rt.op, norm)


def scale_shift(
    view: View, out: Node, n: int, shift: bool
) -> tuple[list[Node], str | None, str | None]:
    """Extend past ``out`` over ``* gamma`` and (if ``shift``) ``+ beta``, each optional.

    gamma and beta are constants or graph inputs of shape ``(n,)``, in either operand order.

    Returns:
        The extra nodes, gamma (or None), beta (or None).
    """
    nodes: list[Node] = []
    gamma = beta = None
    for op in ("Mul", "Add") if shift else ("Mul",):
        nxt = view.sole_reader(out.outputs[0], op)
        if nxt is None:
            continue
        p = next(
            (p for a, p in View.orders(nxt) if a == out.outputs[0] and view.is_param(p, n)), None
        )
        if p is None:
            continue
        if op == "Mul":
            gamma = p
        else:
            beta = p
        nodes.append(nxt)
        out = nxt
    return nodes, gamma, beta
