"""The static shapes of an ONNX model's inputs, from every source the user has, checked together.

Sources, in the order they fix named dimensions: sizes by name (``--dim seq=16``), whole shapes
per input (``--input-shape input_ids=2x16``), the shapes of the arrays of an input file (an
``.npz`` keyed by input name), then the model's own fixed dimensions. A named dimension
(``dim_param``) fixed by one source is fixed for every input that names it; a later source that
disagrees is an error naming both, one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusiontune.ir.onnx_import import InputFileError, OnnxImportError, graph_inputs, used_dim_names

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _Given:
    """A whole shape given for one input, and how errors name where it came from."""

    input: str
    shape: Shape
    label: str  # the start of an error about it: "model.onnx: --input-shape x", "in.npz: key 'x'"
    who: str  # how an error about another input names it: "--input-shape x=2x8", "key 'x'"
    error: type[OnnxImportError]


def _dims_text(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def _declared(vi: Any) -> list[tuple[int | None, str]] | None:
    """The model's dimensions of an input: (fixed size or None, dim_param or ''), None: no shape.

    A dimension is fixed when its ``dim_value`` field is *set*, whatever the value: 0 is a static
    0-size dimension, not an unknown one (protobuf reads an unset field as 0 too, hence
    ``HasField``). A negative value, which some converters write for "unknown", stays dynamic.
    """
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [
        (int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None, d.dim_param)
        for d in tt.shape.dim
    ]


def _declared_text(declared: list[tuple[int | None, str]]) -> str:
    return "[" + ", ".join(str(v) if v is not None else (p or "?") for v, p in declared) + "]"


def fix_input_shapes(
    model: Any,
    path: str,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    arrays_file: str | None = None,
    array_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[dict[str, Shape], dict[str, int]]:
    """The static shape of every graph input, and the size of every named input dimension.

    Args:
        model: the loaded ``ModelProto``.
        path: the model file, for messages.
        input_shapes: whole shapes by input name (``--input-shape``); an unknown name is an error.
        dims: sizes of named dimensions (``--dim``); a name no input uses is an error.
        arrays_file: the file ``array_shapes`` come from, for messages.
        array_shapes: the shapes of that file's arrays by key; keys that are not inputs are
            ignored. An input with both a key and an ``input_shapes`` entry needs them equal.

    Returns:
        ``(shapes, dims)``: every graph input's shape, and every named dimension's size.

    Raises:
        OnnxImportError: an unknown name, an input the model gives a 0-size dimension, a rank or
            fixed dimension that differs from the model's, two sources that give one named
            dimension different sizes, or a dynamic dimension nothing fixes. Errors about an array of ``arrays_file`` are :class:`InputFileError`,
            naming the file and the key.
    """
    given = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    dims = dict(dims or {})
    arrays = {k: tuple(int(d) for d in v) for k, v in (array_shapes or {}).items()}
    real = graph_inputs(model)
    names = [vi.name for vi in real]
    for name in given:
        if name not in names:
            raise OnnxImportError(f"{path}: --input-shape {name}: no such input (inputs: {', '.join(names)})")
    used = used_dim_names(model)
    for name in dims:
        if name not in used:
            known = ", ".join(sorted(used)) or "none"
            raise OnnxImportError(f"{path}: --dim {name}: no input dimension has this name (named dimensions: {known})")
    fixed: dict[str, tuple[int, str]] = {k: (int(v), f"--dim {k}={int(v)}") for k, v in dims.items()}
    sources = [
        _Given(n, s, f"{path}: --input-shape {n}", f"--input-shape {n}={_dims_text(s)}", OnnxImportError)
        for n, s in given.items()
    ]
    for name in names:
        if name not in arrays:
            continue
        shape = arrays[name]
        if name in given:
            if given[name] != shape:
                raise InputFileError(
                    f"{arrays_file}: key {name!r} has shape {_dims_text(shape)},"
                    f" --input-shape {name}={_dims_text(given[name])} says otherwise"
                )
            continue
        sources.append(_Given(name, shape, f"{arrays_file}: key {name!r}", f"key {name!r}", InputFileError))
    declared = {vi.name: _declared(vi) for vi in real}
    for name, dims_of in declared.items():
        zero = next((i for i, (value, _) in enumerate(dims_of or ()) if value == 0), None)
        if zero is not None:
            raise OnnxImportError(
                f"{path}: input {name!r} dimension {zero} is 0 in the model"
                f" {_declared_text(dims_of or [])}: a 0-size input has no elements to measure"
            )
    shapes: dict[str, Shape] = {}
    for src in sources:
        _check_given(src, declared[src.input], fixed)
        shapes[src.input] = src.shape
    for vi in real:
        if vi.name not in shapes:
            shapes[vi.name] = _shape_from_model(vi.name, declared[vi.name], fixed, path, arrays_file)
    return {n: shapes[n] for n in names}, {k: v for k, (v, _) in fixed.items()}


def _check_given(src: _Given, declared: list[tuple[int | None, str]] | None, fixed: dict[str, tuple[int, str]]) -> None:
    """Check one given shape against the model and the named dimensions fixed so far; record its own."""
    shape, label = src.shape, src.label
    if any(d < 1 for d in shape):
        raise src.error(f"{label}: shape {_dims_text(shape) or '()'} has an empty or negative dimension (every dimension must be >= 1)")
    if declared is None:
        return
    if len(declared) != len(shape):
        raise src.error(
            f"{label}: shape {_dims_text(shape) or '()'} has rank {len(shape)}, the model's input"
            f" {src.input!r} has rank {len(declared)} {_declared_text(declared)}"
        )
    for i, ((value, param), size) in enumerate(zip(declared, shape, strict=True)):
        if value is not None and value != size:
            raise src.error(f"{label}: dimension {i} is {size}, the model fixes it to {value}")
        if param:
            if param in fixed and fixed[param][0] != size:
                before, who = fixed[param]
                raise src.error(f"{label}: dimension {i} ({param!r}) is {size}, but {who} makes {param} {before}")
            fixed.setdefault(param, (size, src.who))


def _shape_from_model(
    name: str,
    declared: list[tuple[int | None, str]] | None,
    fixed: Mapping[str, tuple[int, str]],
    path: str,
    arrays_file: str | None,
) -> Shape:
    """An input nobody gave a shape for: the model's fixed dimensions and the named ones fixed."""
    if declared is None:
        if arrays_file:
            raise InputFileError(f"{arrays_file}: no key {name!r}, and the model gives input {name!r} no shape: add it to the file")
        raise OnnxImportError(f"{path}: input {name!r} has no shape in the model: give it with --input-shape {name}=...")
    shape = []
    for i, (value, param) in enumerate(declared):
        if value is not None:
            shape.append(value)
        elif param and param in fixed:
            shape.append(fixed[param][0])
        else:
            what = f"dimension {i} ({param!r})" if param else f"dimension {i} (unnamed)"
            fix = f"--dim {param}=N" if param else f"--input-shape {name}=..."
            if arrays_file:
                raise InputFileError(
                    f"{arrays_file}: no key {name!r}, and nothing fixes input {name!r}'s {what}:"
                    f" add {name!r} to the file, or fix it with {fix}"
                )
            raise OnnxImportError(f"{path}: input {name!r} {what} is dynamic: fix it with {fix}")
    return tuple(shape)
