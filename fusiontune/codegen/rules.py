"""Codegen rules: how each op of the catalogue becomes numba code.

Every op has exactly one rule, found by :func:`rule_kind`:

* ``scalar``: an elementwise op, written as a scalar expression over its operands' local
  variables (``SCALAR_RULES``); the loop-nest generator puts it inside the loops.
* ``reduce``: a reduction, written as an accumulator (``REDUCE_RULES``).
* ``expand``: a fused normalization, lowered through its primitive expansion (ir/expand.py).
* ``contraction``: MatMul, a BLAS call per block with the epilogue applied in cache.
* ``layout``: a data-movement kernel of its own (codegen/layout.py).

``tests/codegen/test_op_rules.py`` walks the catalogue and fails when an op has no rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fusiontune.ir.expand import EXPANDABLE

Lit = Callable[[float], str]
ScalarRule = Callable[[list[str], Mapping[str, Any], Lit, str], str]


def literal(value: float, dtype: str) -> str:
    """A literal of ``dtype`` in generated code (float32 literals stay float32 under numba)."""
    if dtype == "bool":
        return "True" if value else "False"
    if dtype.startswith("int"):
        return f"np.{dtype}({int(value)})"
    v = float(value)
    if np.isnan(v):
        text = "np.nan"
    elif np.isinf(v):
        text = "np.inf" if v > 0 else "-np.inf"
    else:
        text = repr(v)
    return f"np.{dtype}({text})"


def _pow(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    return f"({a[0]} ** {a[1]})"


def _cast(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    to = str(np.dtype(attrs["to"]))
    if to == "bool":
        return f"({a[0]} != 0)"
    return f"np.{to}({a[0]})"


def _gelu(a: list[str], attrs: Mapping[str, Any], lit: Lit, dtype: str) -> str:
    x = a[0]
    if attrs.get("approximate", "none") == "tanh":
        inner = f"{lit(0.7978845608028654)} * ({x} + {lit(0.044715)} * {x} * {x} * {x})"
        return f"({lit(0.5)} * {x} * ({lit(1.0)} + np.tanh({inner})))"
    return f"({lit(0.5)} * {x} * ({lit(1.0)} + math.erf({x} * {lit(0.7071067811865476)})))"


SCALAR_RULES: dict[str, ScalarRule] = {
    "Add": lambda a, at, lit, dt: f"({a[0]} + {a[1]})",
    "BiasAdd": lambda a, at, lit, dt: f"({a[0]} + {a[1]})",
    "Sub": lambda a, at, lit, dt: f"({a[0]} - {a[1]})",
    "Mul": lambda a, at, lit, dt: f"({a[0]} * {a[1]})",
    "Div": lambda a, at, lit, dt: f"({a[0]} / {a[1]})",
    "Pow": _pow,
    # np.maximum / np.minimum, not max / min: NaN propagates as numpy's reference does.
    "Maximum": lambda a, at, lit, dt: f"np.maximum({a[0]}, {a[1]})",
    "Minimum": lambda a, at, lit, dt: f"np.minimum({a[0]}, {a[1]})",
    "Greater": lambda a, at, lit, dt: f"({a[0]} > {a[1]})",
    "Less": lambda a, at, lit, dt: f"({a[0]} < {a[1]})",
    "Equal": lambda a, at, lit, dt: f"({a[0]} == {a[1]})",
    "Neg": lambda a, at, lit, dt: f"(-{a[0]})",
    "Relu": lambda a, at, lit, dt: f"np.maximum({a[0]}, {lit(0.0)})",
    "Reciprocal": lambda a, at, lit, dt: f"({lit(1.0)} / {a[0]})",
    "Sqrt": lambda a, at, lit, dt: f"np.sqrt({a[0]})",
    "Rsqrt": lambda a, at, lit, dt: f"({lit(1.0)} / np.sqrt({a[0]}))",
    "Exp": lambda a, at, lit, dt: f"np.exp({a[0]})",
    "Log": lambda a, at, lit, dt: f"np.log({a[0]})",
    "Tanh": lambda a, at, lit, dt: f"np.tanh({a[0]})",
    "Erf": lambda a, at, lit, dt: f"math.erf({a[0]})",
    "Sigmoid": lambda a, at, lit, dt: f"({lit(1.0)} / ({lit(1.0)} + np.exp(-{a[0]})))",
    "Silu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + np.exp(-{a[0]})))",
    "SwiGlu": lambda a, at, lit, dt: f"({a[0]} / ({lit(1.0)} + np.exp(-{a[0]})) * {a[1]})",
    "Gelu": _gelu,
    "Cast": _cast,
    "Where": lambda a, at, lit, dt: f"({a[1]} if {a[0]} else {a[2]})",
    # Expand is a pure index map: inside a loop nest the broadcast read already does it.
    "Expand": lambda a, at, lit, dt: a[0],
}

# Reductions: (initial value, update statements, finish expression). ``{flag}`` is a boolean
# accumulator initialized False. The max keeps a select (which vectorizes) and a separate
# "seen a NaN" flag, so that NaN propagates as in np.max without a NaN-aware maximum per element
# (np.maximum in the loop kept it scalar: 3x slower).
REDUCE_RULES: dict[str, tuple[float, tuple[str, ...], str]] = {
    "ReduceSum": (0.0, ("{acc} += {v}",), "{acc}"),
    "ReduceMean": (0.0, ("{acc} += {v}",), "{acc} * {inv_n}"),
    "ReduceMax": (
        -np.inf,
        ("{acc} = {v} if {v} > {acc} else {acc}", "{flag} = {flag} | ({v} != {v})"),
        "{acc} if not {flag} else {nan}",
    ),
}

LAYOUT_OPS = ("Reshape", "Transpose", "Concat", "Split", "Slice")
CONTRACTION_OPS = ("MatMul",)


def rule_kind(op: str) -> str | None:
    """Which codegen rule covers ``op``: scalar, reduce, expand, contraction, layout, or None."""
    if op in SCALAR_RULES:
        return "scalar"
    if op in REDUCE_RULES:
        return "reduce"
    if op in EXPANDABLE:
        return "expand"
    if op in CONTRACTION_OPS:
        return "contraction"
    if op in LAYOUT_OPS:
        return "layout"
    return None
