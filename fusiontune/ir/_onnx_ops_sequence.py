"""ONNX converters for tensor sequences on live data: SplitToSequence, SequenceAt, SequenceConstruct,
SequenceLength, ConcatFromSequence.

The IR has no sequence type: a live sequence exists only during import, as the tuple of IR values
it holds (:attr:`Importer.sequences`, under a fresh name that stands for the ONNX sequence). The
dynamo exporter without its optimizer writes ``torch.split`` this way (GPT-2's q, k, v:
``SplitToSequence`` then ``SequenceAt`` with constant positions), which becomes one Split node.
Positions must be constants; a sequence that reaches a graph output is refused by the import.
Sequences of constants never get here: they fold (ir/_onnx_fold.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusiontune.ir._onnx_ops import CONVERTERS, _ints
from fusiontune.ir.onnx_import import Importer
from fusiontune.ir.ops import normalize_axis


def _sequence(imp: Importer, name: str | None) -> tuple[str, ...]:
    seqs = getattr(imp, "sequences", {})
    if name is None or name not in seqs:
        raise imp.fail("reads a sequence that is not a live sequence of tensors")
    return seqs[name]


def _make(imp: Importer, items: list[str]) -> list[str]:
    if not hasattr(imp, "sequences"):
        imp.sequences = {}  # type: ignore[attr-defined]
    name = imp.fresh(f"{imp.current}/sequence")
    imp.sequences[name] = tuple(items)  # type: ignore[attr-defined]
    return [name]


def _split_to_sequence(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    """``torch.split``: pieces of the given sizes, or of one size (the last may be smaller), or
    of size 1 with the axis dropped when ``keepdims=0`` and no split is given."""
    x = ins[0]
    shape = imp.shape(x)
    axis = normalize_axis(int(attrs.get("axis", 0)), len(shape))
    dim = shape[axis]
    keep = True
    if len(ins) > 1 and ins[1] is not None:
        split = np.asarray(imp.constant_of(ins[1], "SplitToSequence's split"))
        if split.ndim == 0:
            chunk = int(split)
            if chunk <= 0:
                raise imp.fail(f"SplitToSequence split {chunk} must be positive")
            sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
        else:
            sizes = _ints(split)
    else:
        sizes = [1] * dim
        keep = bool(attrs.get("keepdims", 1))
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise imp.fail(f"SplitToSequence sizes {sizes} do not add up to {dim}")
    outs = imp.emit("Split", [x], {"axis": axis, "sizes": tuple(sizes)}, n_out=len(sizes), tag="split")
    if not keep:
        squeezed = [d for i, d in enumerate(shape) if i != axis]
        outs = [imp.reshape(o, squeezed, tag=f"squeeze{i}") for i, o in enumerate(outs)]
    return _make(imp, outs)


def _sequence_at(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    items = _sequence(imp, ins[0])
    position = int(np.asarray(imp.constant_of(ins[1], "SequenceAt's position")).reshape(()))
    if not -len(items) <= position < len(items):
        raise imp.fail(f"SequenceAt position {position} is outside a sequence of {len(items)}")
    return [items[position]]


def _sequence_construct(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return _make(imp, [i for i in ins if i is not None])


def _sequence_length(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    return [imp.bind_known(node.output[0], np.asarray(len(_sequence(imp, ins[0])), dtype=np.int64))]


def _concat_from_sequence(imp: Importer, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[str]:
    items = list(_sequence(imp, ins[0]))
    if not items:
        raise imp.fail("ConcatFromSequence of an empty sequence")
    rank = len(imp.shape(items[0]))
    if int(attrs.get("new_axis", 0)):
        axis = normalize_axis(int(attrs["axis"]), rank + 1)
        items = [imp.reshape(t, (*imp.shape(t)[:axis], 1, *imp.shape(t)[axis:]), tag=f"unsqueeze{i}") for i, t in enumerate(items)]
    else:
        axis = normalize_axis(int(attrs["axis"]), rank)
    if len(items) == 1:
        return [imp.reshape(items[0], imp.shape(items[0]), node.output[:1], tag=None)]
    return imp.emit("Concat", items, {"axis": axis}, node.output[:1])


CONVERTERS.update(
    {
        "SplitToSequence": _split_to_sequence,
        "SequenceAt": _sequence_at,
        "SequenceConstruct": _sequence_construct,
        "SequenceLength": _sequence_length,
        "ConcatFromSequence": _concat_from_sequence,
    }
)
