"""Graph dumps: text listing, DOT with fused groups as clusters, per-stage files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.dump import dump_dot, dump_text, write_stage_dumps
from fusiontune.ir.graph import Graph
from fusiontune.passes.fused_graph import FusedGraph, Group


def _graph() -> Graph:
    """Seed 000's MyNet with MyOp: names with '/' (scope) and ':' (multi-output Split)."""
    g = GraphBuilder("my_net")
    x = g.input("x", (4, 4))
    y = g.input("y", (4, 4))
    b = g.pow(g.mul(x, 2.0), 3.0)
    with g.scope("MyOp"):
        r = g.mul(g.sub(b, y), b)
    top, bottom = g.split(r, (2, 2), axis=0)
    g.output(g.add(top, bottom))
    return g.build()


def _fused() -> FusedGraph:
    graph = _graph()
    names = [n.name for n in graph.nodes]
    groups = [
        Group("fused_Mul_0", tuple(names[:2]), ("BasicFusion",)),
        Group("fused_MyOp/Sub_0", tuple(names[2:4]), ("CompositeFusion",)),
        *(Group(n, (n,)) for n in names[4:]),
    ]
    return FusedGraph.singletons(graph).with_groups(groups)


def _node_statements(dot: str) -> list[str]:
    return [line.strip() for line in dot.splitlines() if "[shape=" in line]


def test_dot_draws_one_cluster_per_fused_group() -> None:
    dot = dump_dot(_fused(), "after")
    assert len(re.findall(r"subgraph cluster_\d+ \{", dot)) == 2
    assert "fused_Mul_0 (2 nodes)" in dot and "fused_MyOp/Sub_0 (2 nodes)" in dot


def test_dot_braces_balance() -> None:
    dot = dump_dot(_fused(), "after")
    depth = 0
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', dot):  # braces inside labels do not count
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0


def test_dot_quotes_every_node_id() -> None:
    dot = dump_dot(_fused(), 'a title with / and : and "quotes"')
    statements = _node_statements(dot)
    assert statements
    assert all(s.startswith('"') for s in statements)
    for edge in (line.strip() for line in dot.splitlines() if "->" in line):
        assert re.fullmatch(r'"[^"]+" -> "[^"]+"( \[label="\d+"\])?;', edge), edge
    assert '"node:MyOp/Sub_0"' in dot
    assert '\\"quotes\\"' in dot


def test_dot_inlines_scalar_constants() -> None:
    dot = dump_dot(_graph(), "before")
    assert "Mul(·, 2)" in dot and "Pow(·, 3)" in dot
    assert "const" not in dot  # no separate nodes for the scalars
    assert "subgraph" not in dot


def test_text_lists_each_node_once() -> None:
    fused = _fused()
    text = dump_text(fused)
    defined = [
        out.strip()
        for line in text.splitlines()
        if " = " in line
        for out in line.split(" = ")[0].split(",")
    ]
    expected = [f"%{o}" for n in fused.graph.nodes for o in n.outputs]
    assert sorted(defined) == sorted(expected)  # every node once, nothing else
    assert text.count("kernel ") == len(fused.groups)
    assert "kernel fused_Mul_0 [BasicFusion]:" in text
    assert "%Mul_0 = Mul(%x, 2) :: (4, 4) float32" in text


def test_text_of_plain_graph_has_no_kernels() -> None:
    text = dump_text(_graph())
    assert "kernel" not in text
    assert len([line for line in text.splitlines() if " = " in line]) == len(_graph().nodes)


def test_write_stage_dumps_numbers_the_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fusiontune.ir.dump.shutil.which", lambda name: None)
    fused = _fused()
    paths = write_stage_dumps(
        [("initial", FusedGraph.singletons(fused.graph)), ("ub fusion/basic", fused)],
        tmp_path / "dumps",
    )
    assert [p.name for p in paths] == [
        "00_initial.dot",
        "00_initial.txt",
        "01_ub_fusion_basic.dot",
        "01_ub_fusion_basic.txt",
    ]
    assert all(p.exists() for p in paths)
    assert "cluster_" not in paths[0].read_text()
    assert "cluster_" in paths[2].read_text()
