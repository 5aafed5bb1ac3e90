"""Text and Graphviz DOT dumps of a graph, or of a fused graph with its kernels as clusters.

The pipeline writes one of each after every stage (``write_stage_dumps``), which gives seed 001's
before / after pictures: plain ops first, then the fused groups drawn as boxes around their ops.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fusiontune.ir.graph import Graph, Node

if TYPE_CHECKING:
    # Only for types: the IR must not import the passes package (it imports the IR).
    from fusiontune.passes.fused_graph import FusedGraph, Group

GraphLike = Union[Graph, "FusedGraph"]


def _split(graph_or_fused: GraphLike) -> tuple[Graph, tuple[Group, ...] | None]:
    if isinstance(graph_or_fused, Graph):
        return graph_or_fused, None
    return graph_or_fused.graph, tuple(graph_or_fused.groups)


def _fmt_scalar(x: float) -> str:
    return f"{x:.6g}"


def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return _fmt_scalar(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v) if isinstance(v, str) else str(v)


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return _fmt_attr(tuple(shape))


# ---- text ----------------------------------------------------------------------------------------
def _operand_text(graph: Graph, name: str) -> str:
    scalar = graph.scalar_constant(name)
    return _fmt_scalar(scalar) if scalar is not None else f"%{name}"


def _node_text(graph: Graph, node: Node) -> str:
    outs = ", ".join(f"%{o}" for o in node.outputs)
    args = ", ".join(_operand_text(graph, i) for i in node.inputs)
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in node.attrs.items())
    types = ", ".join(
        f"{_fmt_shape(graph.values[o].shape)} {graph.values[o].dtype}" for o in node.outputs
    )
    line = f"{outs} = {node.op}({args})"
    if attrs:
        line += f" {{{attrs}}}"
    line += f" :: {types}"
    if node.outputs != (node.name,):
        line += f"  # {node.name}"
    return line


def dump_text(graph_or_fused: GraphLike) -> str:
    """A readable listing: one line per node, ``%out = Op(%a, %b) {attrs} :: shape dtype``.

    Scalar constants appear inline as their value; other constants are listed in the header. For
    a :class:`FusedGraph`, nodes sit under one ``kernel <group name> [passes]:`` header per group,
    in kernel order.

    Args:
        graph_or_fused: a graph, or a fused graph.

    Returns:
        The listing, newline-terminated.
    """
    graph, groups = _split(graph_or_fused)
    ins = ", ".join(
        f"%{n}: {_fmt_shape(graph.values[n].shape)} {graph.values[n].dtype}" for n in graph.inputs
    )
    lines = [f"graph {graph.name}({ins}):"]
    for name in graph.constants:
        if graph.scalar_constant(name) is None:
            v = graph.values[name]
            lines.append(f"  const %{name} :: {_fmt_shape(v.shape)} {v.dtype}")
    if groups is None:
        lines.extend(f"  {_node_text(graph, n)}" for n in graph.nodes)
    else:
        for group in groups:
            passes = ", ".join(group.passes)
            schedule = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in group.schedule.items())
            header = f"  kernel {group.name} [{passes}]"
            if schedule:
                header += f" {{{schedule}}}"
            lines.append(header + ":")
            lines.extend(f"    {_node_text(graph, graph.node(n))}" for n in group.nodes)
    lines.append("  return " + ", ".join(f"%{o}" for o in graph.outputs))
    return "\n".join(lines) + "\n"


# ---- DOT -----------------------------------------------------------------------------------------
def _q(s: str) -> str:
    """A DOT double-quoted string: any name is a valid id once quoted and escaped."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_id(name: str) -> str:
    return _q(f"node:{name}")


def _value_id(name: str) -> str:
    return _q(f"value:{name}")


def _output_id(name: str) -> str:
    return _q(f"output:{name}")


def _op_label(graph: Graph, node: Node) -> str:
    args = [graph.scalar_constant(i) for i in node.inputs]
    head = node.op
    if any(a is not None for a in args):
        head += "(" + ", ".join("·" if a is None else _fmt_scalar(a) for a in args) + ")"
    shapes = " ".join(_fmt_shape(graph.values[o].shape) for o in node.outputs)
    return f"{head}\n{shapes}"


def dump_dot(graph_or_fused: GraphLike, title: str = "") -> str:
    """Graphviz DOT of a graph; a fused graph's multi-node groups are drawn as clusters.

    Graph inputs and non-scalar constants are ellipses; scalar constants are written into their
    consumer's label (``Mul(·, 2)``) rather than drawn; ops are boxes labelled with the op and
    output shape (the node name is the tooltip); graph outputs are double octagons. A group of
    two or more nodes is ``subgraph cluster_<i>`` (``i``: its kernel index), labelled with its
    name, node count and passes; single-node groups are drawn bare, so an unfused graph looks the
    same either way.

    Args:
        graph_or_fused: a graph, or a fused graph.
        title: the picture's caption; defaults to the graph name.

    Returns:
        DOT source.
    """
    graph, groups = _split(graph_or_fused)
    out = [
        f"digraph {_q(title or graph.name)} {{",
        f"  graph [label={_q(title or graph.name)}, labelloc=t, fontname=Helvetica, rankdir=TB];",
        "  node [fontname=Helvetica, fontsize=10];",
        "  edge [fontname=Helvetica, fontsize=9];",
    ]
    for name in graph.inputs:
        v = graph.values[name]
        label = f"{name}\n{_fmt_shape(v.shape)} {v.dtype}"
        out.append(f"  {_value_id(name)} [shape=ellipse, label={_q(label)}];")
    for name in graph.constants:
        if graph.scalar_constant(name) is None:
            label = f"{name}\n{_fmt_shape(graph.values[name].shape)}"
            out.append(
                f"  {_value_id(name)} [shape=ellipse, style=filled, fillcolor=gray92, label={_q(label)}];"
            )

    def box(node: Node, indent: str) -> str:
        return (
            f"{indent}{_node_id(node.name)} [shape=box, style=rounded, "
            f"label={_q(_op_label(graph, node))}, tooltip={_q(node.name)}];"
        )

    if groups is None:
        out.extend(box(n, "  ") for n in graph.nodes)
    else:
        for i, group in enumerate(groups):
            if len(group.nodes) < 2:
                out.extend(box(graph.node(n), "  ") for n in group.nodes)
                continue
            label = f"{group.name} ({len(group.nodes)} nodes)"
            if group.passes:
                label += "\n" + ", ".join(group.passes)
            out.append(f"  subgraph cluster_{i} {{")
            out.append(
                f'    label={_q(label)}; style="rounded,filled"; fillcolor=aliceblue; color=steelblue;'
            )
            out.extend(box(graph.node(n), "    ") for n in group.nodes)
            out.append("  }")

    producer = {
        o: (n.name, len(n.outputs), k) for n in graph.nodes for k, o in enumerate(n.outputs)
    }
    for node in graph.nodes:
        for name in node.inputs:
            if graph.scalar_constant(name) is not None:
                continue
            if name in producer:
                src, n_out, k = producer[name]
                attrs = f" [label={_q(str(k))}]" if n_out > 1 else ""
                out.append(f"  {_node_id(src)} -> {_node_id(node.name)}{attrs};")
            else:
                out.append(f"  {_value_id(name)} -> {_node_id(node.name)};")
    for name in graph.outputs:
        out.append(f"  {_output_id(name)} [shape=doubleoctagon, label={_q(name)}];")
        src = _node_id(producer[name][0]) if name in producer else _value_id(name)
        out.append(f"  {src} -> {_output_id(name)};")
    out.append("}")
    return "\n".join(out) + "\n"


# ---- per-stage files -----------------------------------------------------------------------------
def _file_stem(index: int, stage: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stage).strip("_") or "stage"
    return f"{index:02d}_{safe}"


NO_DOT_NOTE = "dot (Graphviz) not found: wrote the .dot files, no PNGs"


def _note_stderr(message: str) -> None:
    print(f"fusiontune: note: {message}", file=sys.stderr)


def write_stage_dumps(
    snapshots: Sequence[tuple[str, GraphLike]],
    directory: str | Path,
    note: Callable[[str], None] | None = _note_stderr,
) -> list[Path]:
    """Write ``NN_<stage>.dot`` and ``NN_<stage>.txt`` for each stage, and a PNG when Graphviz is here.

    Args:
        snapshots: ``(stage name, graph after that stage)`` in pipeline order; ``NN`` is the
            position (00, 01, ...). Characters unsafe in file names become ``_``.
        directory: where to write; created if missing.
        note: told :data:`NO_DOT_NOTE` once, before any stage, when the ``dot`` binary is not on
            PATH (a user who asked for dumps would otherwise look for PNGs that never come);
            default: a ``fusiontune: note:`` line on stderr; None says nothing.

    Returns:
        The paths written, per stage: the ``.dot``, the ``.txt``, then the ``.png`` when the
        ``dot`` binary is on PATH and rendering succeeded.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dot_binary = shutil.which("dot")
    if dot_binary is None and note is not None:
        note(NO_DOT_NOTE)
    written: list[Path] = []
    for index, (stage, snapshot) in enumerate(snapshots):
        stem = _file_stem(index, stage)
        dot_path = directory / f"{stem}.dot"
        txt_path = directory / f"{stem}.txt"
        dot_path.write_text(dump_dot(snapshot, f"{index:02d} {stage}"), encoding="utf-8")
        txt_path.write_text(dump_text(snapshot), encoding="utf-8")
        written += [dot_path, txt_path]
        if dot_binary is not None:
            png_path = directory / f"{stem}.png"
            # A picture is a convenience: a Graphviz failure must not fail the run that dumps it.
            try:
                result = subprocess.run(
                    [dot_binary, "-Tpng", str(dot_path), "-o", str(png_path)],
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if result.returncode == 0 and png_path.exists():
                written.append(png_path)
    return written


__all__ = ["dump_dot", "dump_text", "write_stage_dumps"]
