"""ONNX converters for the index, layout and window ops (see ``_ops_index``), Range and Einsum.

Opset differences handled here: Pad's pads and value became inputs at opset 11 and gained
``axes`` at 18 (and ``wrap`` at 19); Tile's repeats, CumSum's axis and Trilu's k are inputs that
must be constants under static shapes; GatherND's ``batch_dims`` (12) and ScatterND's
``reduction`` (16, max/min at 18) default when absent; ConvTranspose's ``auto_pad`` and
``output_shape`` become explicit pads here, as in ONNX's definition, and where the requested
size passes the natural one, as onnxruntime runs it: the extra positions of an ``output_shape``
come at the end (as ``output_padding`` gives them), SAME keeps the natural size.

Einsum is lowered at import to catalogue ops: a one-operand equation to ReduceSum and Transpose,
a two-operand one to Transpose / Reshape around one batched MatMul (letters summed in both
operands) or one broadcasting Mul (outer products: nothing summed). Equations with a letter
repeated inside one operand (diagonals) or three operands or more fail with one line naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusiontune.ir._onnx_ops import _conv, _ints
from fusiontune.ir.onnx_import import Importer
from fusiontune.ir.ops import normalize_axis

_SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scalar_int(imp: Importer, name: str | None, what: str) -> int:
    arr = imp.constant_of(name, what)
    if arr.size != 1:
        raise imp.fail(f"{what} must hold one value, got shape {arr.shape}")
    return int(arr.reshape(-1)[0])


def _given(ins: list[Any], index: int) -> bool:
    return len(ins) > index and ins[index] is not None


# ---- index ops -----------------------------------------------------------------------------------
@_conv("GatherND")
def _gather_nd(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    a = {"batch_dims": int(attrs.get("batch_dims", 0))}
    return imp.emit("GatherND", ins[:2], a, node.output[:1])


@_conv("GatherElements")
def _gather_elements(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    axis = normalize_axis(int(attrs.get("axis", 0)), len(imp.shape(ins[0])))
    return imp.emit("GatherElements", ins[:2], {"axis": axis}, node.output[:1])


@_conv("ScatterND")
def _scatter_nd(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    reduction = attrs.get("reduction", "none")
    if reduction not in _SCATTER_REDUCTIONS:
        raise imp.fail(f"ScatterND reduction={reduction!r} (supported: {', '.join(_SCATTER_REDUCTIONS)})")
    return imp.emit("ScatterND", ins[:3], {"reduction": reduction}, node.output[:1])


@_conv("CumSum")
def _cumsum(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    axis = _scalar_int(imp, ins[1], "CumSum's axis")
    a = {
        "axis": normalize_axis(axis, len(imp.shape(ins[0]))),
        "exclusive": int(attrs.get("exclusive", 0)),
        "reverse": int(attrs.get("reverse", 0)),
    }
    return imp.emit("CumSum", ins[:1], a, node.output[:1])


@_conv("Trilu")
def _trilu(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    k = _scalar_int(imp, ins[1], "Trilu's k") if _given(ins, 1) else 0
    return imp.emit("Trilu", ins[:1], {"upper": int(attrs.get("upper", 1)), "k": k}, node.output[:1])


@_conv("Tile")
def _tile(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    reps = tuple(_ints(imp.constant_of(ins[1], "Tile's repeats")))
    if all(r == 1 for r in reps) and len(reps) == len(imp.shape(ins[0])):
        return [ins[0]]
    return imp.emit("Tile", ins[:1], {"repeats": reps}, node.output[:1])


@_conv("Pad")
def _pad(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x = ins[0]
    rank = len(imp.shape(x))
    mode = attrs.get("mode", "constant") or "constant"
    if imp.opset < 11:
        pads = [int(p) for p in attrs.get("pads", attrs.get("paddings", ()))]
        value: float = float(attrs.get("value", 0.0))
    else:
        pads = _ints(imp.constant_of(ins[1], "Pad's pads"))
        value = 0.0
        if _given(ins, 2):
            arr = imp.constant_of(ins[2], "Pad's constant_value")
            if arr.size != 1:
                raise imp.fail(f"Pad's constant_value must hold one value, got shape {arr.shape}")
            value = arr.reshape(-1)[0].item()
        if _given(ins, 3):  # opset 18: pads name only these axes
            axes = [normalize_axis(a, rank) for a in _ints(imp.constant_of(ins[3], "Pad's axes"))]
            if len(pads) != 2 * len(axes):
                raise imp.fail(f"Pad's pads {pads} do not fit axes {axes}")
            full = [0] * (2 * rank)
            for k, axis in enumerate(axes):
                full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
            pads = full
    if len(pads) != 2 * rank:
        raise imp.fail(f"Pad's pads {pads} must have 2 * rank = {2 * rank} entries")
    if not any(pads):
        return [x]
    pad = {"pads": tuple(pads), "mode": mode, "value": value if mode == "constant" else 0.0}
    return imp.emit("Pad", [x], pad, node.output[:1])


# ---- Range ---------------------------------------------------------------------------------------
@_conv("Range")
def _range(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """Folds when start, limit and delta are known; otherwise its length would be live data."""
    live = [what for what, i in zip(("start", "limit", "delta"), ins, strict=False) if i not in imp.known]
    if live:
        raise imp.fail(
            f"Range's {', '.join(live)} depend{'s' if len(live) == 1 else ''} on a graph input: its output "
            "length would be live data, which static shapes cannot hold (fix the input shapes it derives "
            "from, or export with constant bounds)"
        )
    start, limit, delta = (imp.known[i].reshape(-1)[0] for i in ins)
    if delta == 0:
        raise imp.fail("Range with delta 0")
    out = np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)
    return [imp.bind_known(node.output[0], out)]


# ---- ConvTranspose -------------------------------------------------------------------------------
@_conv("ConvTranspose")
def _conv_transpose(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    x, w = ins[0], ins[1]
    xs, kernel = imp.shape(x), imp.shape(w)[2:]
    spatial = len(xs) - 2
    if spatial not in (1, 2):
        raise imp.fail(f"ConvTranspose with {spatial} spatial axes (1-D and 2-D have kernels)")
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(kernel):
        raise imp.fail(f"kernel_shape {attrs['kernel_shape']} differs from the weight's {list(kernel)}")
    strides = [int(s) for s in attrs.get("strides", (1,) * spatial)]
    dil = [int(d) for d in attrs.get("dilations", (1,) * spatial)]
    extra = [int(p) for p in attrs.get("output_padding", (0,) * spatial)]
    auto = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    target = attrs.get("output_shape")
    if target is not None:
        target = [int(t) for t in target]
        if len(target) not in (spatial, spatial + 2):
            raise imp.fail(f"output_shape {target} does not fit {spatial} spatial axes")
        target = target[-spatial:]
    if target is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if target is None:
            target = [xs[2 + i] * strides[i] for i in range(spatial)]
        begins, ends = [], []
        for i in range(spatial):
            natural = strides[i] * (xs[2 + i] - 1) + extra[i] + dil[i] * (kernel[i] - 1) + 1
            total = natural - target[i]
            if total < 0:
                # An output_shape past the natural size gets its extra positions at the end (they
                # hold the bias alone), as output_padding would give them; SAME with a stride
                # above the kernel keeps the natural size. Both are onnxruntime's rules.
                if attrs.get("output_shape") is not None:
                    extra[i] -= total
                total = 0
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
        pads = tuple(begins + ends)
    elif auto == "VALID":
        pads = (0,) * (2 * spatial)
    elif auto == "NOTSET":
        pads = tuple(int(p) for p in attrs.get("pads", (0,) * (2 * spatial)))
    else:
        raise imp.fail(f"ConvTranspose auto_pad={auto!r}")
    a = {
        "strides": tuple(strides),
        "pads": pads,
        "dilations": tuple(dil),
        "group": int(attrs.get("group", 1)),
        "output_padding": tuple(extra),
    }
    bias = [ins[2]] if _given(ins, 2) else []
    return imp.emit("ConvTranspose", [x, w, *bias], a, node.output[:1])


# ---- Einsum --------------------------------------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum_terms(imp: Importer, eq: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operand terms and the output term of ``eq``, with ``...`` spelled as letters."""
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise imp.fail(f"Einsum {eq!r} names {len(terms)} operands, the node has {len(ranks)}")
    free = [c for c in _LETTERS if c not in eq]
    widest = max((r - (len(t) - 3) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    ell = "".join(free[:widest])
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            n = r - (len(t) - 3)
            if n < 0:
                raise imp.fail(f"Einsum {eq!r}: term {t!r} has more letters than its operand's rank {r}")
            t = t.replace("...", ell[widest - n :])
        if len(t) != r or any(c not in _LETTERS for c in t):
            raise imp.fail(f"Einsum {eq!r}: term {t!r} does not fit an operand of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit output: the broadcast dims, then every letter used once, sorted
        letters = "".join(out_terms).replace("...", "")
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    return out_terms, out


@_conv("Einsum")
def _einsum(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    eq = "".join(str(attrs["equation"]).split())
    supported = "supported: one or two operands, no letter repeated within an operand"

    def fail(why: str) -> Exception:
        return imp.fail(f"Einsum {eq!r}: {why} ({supported})")

    if len(ins) not in (1, 2):
        raise fail(f"{len(ins)} operands")
    terms, out = _einsum_terms(imp, eq, [len(imp.shape(i)) for i in ins])
    for t in (*terms, out):
        if len(set(t)) != len(t):
            raise fail(f"letter repeated in {t!r}")
    if set(out) - set("".join(terms)):
        raise fail(f"output letters {sorted(set(out) - set(''.join(terms)))} appear in no operand")
    sizes: dict[str, int] = {}
    for i, t in zip(ins, terms, strict=True):
        for c, d in zip(t, imp.shape(i), strict=True):
            if sizes.get(c, d) != d and 1 not in (d, sizes[c]):
                raise fail(f"letter {c!r} is {sizes[c]} and {d}")
            sizes[c] = max(sizes.get(c, d), d)

    def permute(x: str, t: str, order: str, tag: str) -> str:
        perm = tuple(t.index(c) for c in order)
        if perm == tuple(range(len(t))):
            return x
        return imp.emit("Transpose", [x], {"perm": perm}, tag=tag)[0]

    # core: the op that makes the result (None: the input itself); steps: what follows it.
    core: tuple[str, list[str], dict[str, Any]] | None = None
    steps: list[tuple[str, dict[str, Any]]] = []
    have = out
    if len(ins) == 1:
        x, t = ins[0], terms[0]
        gone = tuple(p for p, c in enumerate(t) if c not in out)
        if gone:
            core = ("ReduceSum", [x], {"axes": gone, "keepdims": False})
        have = "".join(c for c in t if c in out)
    else:
        operands: list[tuple[str, str]] = []
        for k, (x, t) in enumerate(zip(ins, terms, strict=True)):
            # a letter of this operand only that the output drops: sum it first
            keep = set(out) | set(terms[1 - k])
            gone = tuple(p for p, c in enumerate(t) if c not in keep)
            if gone:
                x = imp.emit("ReduceSum", [x], {"axes": gone, "keepdims": False}, tag=f"sum{k}")[0]
                t = "".join(c for c in t if c in keep)
            operands.append((x, t))
        (a, ta), (b, tb) = operands
        summed = [c for c in ta if c in tb and c not in out]
        if not summed:
            # an outer (or elementwise) product: each operand in the output's letter order, unit
            # axes for the letters it lacks, one broadcasting Mul
            views = []
            for k, (x, t) in enumerate(operands):
                order = "".join(c for c in out if c in t)
                x = permute(x, t, order, f"order{k}")
                shape = [imp.shape(x)[order.index(c)] if c in t else 1 for c in out]
                views.append(imp.reshape(x, shape, tag=f"view{k}"))
            core = ("Mul", views, {})
        else:
            for c in summed:
                da, db = imp.shape(a)[ta.index(c)], imp.shape(b)[tb.index(c)]
                if da != db:
                    raise fail(f"summed letter {c!r} has sizes {da} and {db}")
            batch = [c for c in out if c in ta and c in tb]
            left = [c for c in out if c in ta and c not in tb]
            right = [c for c in out if c in tb and c not in ta]

            def dims(x: str, t: str, letters: list[str]) -> list[int]:
                return [imp.shape(x)[t.index(c)] for c in letters]

            m = int(np.prod(dims(a, ta, left), dtype=np.int64))
            kk = int(np.prod(dims(a, ta, summed), dtype=np.int64))
            n = int(np.prod(dims(b, tb, right), dtype=np.int64))
            a2 = permute(a, ta, "".join(batch + left + summed), "lhs_order")
            b2 = permute(b, tb, "".join(batch + summed + right), "rhs_order")
            # Without batch letters the lhs keeps its free letters as MatMul batch dims against a
            # plain matrix (a Linear: "bid,jd->bij"), which needs no reshape back.
            rows = dims(a, ta, left) if not batch and left else [*dims(a, ta, batch), m]
            a3 = imp.reshape(a2, [*rows, kk], tag="lhs_matrix")
            b3 = imp.reshape(b2, [*dims(b, tb, batch), kk, n], tag="rhs_matrix")
            core = ("MatMul", [a3, b3], {})
            # the product (batch..., m, n) back to one axis per letter
            bshape = [max(p, q) for p, q in zip(dims(a, ta, batch), dims(b, tb, batch), strict=True)]
            unflat = (*bshape, *dims(a, ta, left), *dims(b, tb, right))
            if unflat != (*bshape, *rows[len(bshape):], n):
                steps.append(("Reshape", {"shape": unflat}))
            have = "".join(batch + left + right)
    perm = tuple(have.index(c) for c in out)
    if perm != tuple(range(len(out))):
        steps.append(("Transpose", {"perm": perm}))
    last = node.output[:1]
    result = ins[0]
    if core is not None:
        op, inputs, core_attrs = core
        result = imp.emit(op, inputs, core_attrs, None if steps else last, tag=op.lower() if steps else None)[0]
    for i, (op, step_attrs) in enumerate(steps):
        final = i == len(steps) - 1
        result = imp.emit(op, [result], step_attrs, last if final else None, tag=None if final else op.lower())[0]
    return [result]
