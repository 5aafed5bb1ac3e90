"""``--dump-graphs`` without Graphviz says so once: the .dot files are written, no PNGs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.dump import NO_DOT_NOTE, write_stage_dumps
from fusiontune.passes.fused_graph import FusedGraph

NOTE_LINE = "fusiontune: note: dot (Graphviz) not found: wrote the .dot files, no PNGs"


def _stages() -> list[tuple[str, FusedGraph]]:
    g = GraphBuilder("net")
    x = g.input("x", (2, 2))
    g.output(g.add(g.mul(x, 2.0), 1.0))
    single = FusedGraph.singletons(g.build())
    return [("initial", single), ("after", single), ("end", single)]


def test_without_dot_the_note_is_one_line_for_all_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("fusiontune.ir.dump.shutil.which", lambda name: None)
    paths = write_stage_dumps(_stages(), tmp_path)
    assert capsys.readouterr().err.splitlines() == [NOTE_LINE]
    assert {p.suffix for p in paths} == {".dot", ".txt"}


def test_with_dot_there_is_no_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done; : > "$2"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    paths = write_stage_dumps(_stages(), tmp_path / "dumps")
    assert capsys.readouterr().err == ""
    assert [p.name for p in paths if p.suffix == ".png"] == [
        "00_initial.png",
        "01_after.png",
        "02_end.png",
    ]


def test_the_note_can_go_elsewhere_or_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("fusiontune.ir.dump.shutil.which", lambda name: None)
    told: list[str] = []
    write_stage_dumps(_stages(), tmp_path / "a", note=told.append)
    write_stage_dumps(_stages(), tmp_path / "b", note=None)
    assert told == [NO_DOT_NOTE] and capsys.readouterr().err == ""


def test_run_with_dump_graphs_prints_the_note_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fusiontune.cli import main

    monkeypatch.setattr("fusiontune.ir.dump.shutil.which", lambda name: None)
    out = tmp_path / "dumps"
    rc = main(["run", "mindspore_basic", "--dump-graphs", str(out), "--out", str(tmp_path / "r")])
    assert rc == 0
    err = capsys.readouterr().err.splitlines()
    assert err.count(NOTE_LINE) == 1
    assert sorted(out.glob("*.dot")) and not sorted(out.glob("*.png"))
