"""Smoke run of benchmarks/peers.py: one small case, every installed peer, the table and RESULTS shape.

Marked ``bench``: CI never runs it and nothing here depends on how fast anything is. It runs the
script in a subprocess (as a user does), on the elementwise chain at --quick sizes, and skips when
onnx is not installed (every case is an ONNX model).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers.py"


@pytest.mark.bench
def test_peers_quick_checks_and_tables_every_installed_peer(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    results, figures_path = tmp_path / "RESULTS.md", tmp_path / "peers.json"
    # torch.compile needs a C++ compiler and tens of seconds: the smoke run leaves it out.
    cmd = [sys.executable, str(PEERS), "--quick", "--only", "elementwise_chain", "--rounds", "2",
           "--skip", "torch.compile", "--results", str(results), "--json", str(figures_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    figures = json.loads(figures_path.read_text())
    case = figures["cases"]["elementwise_chain"]
    assert "error" not in case, case.get("error")
    peers = case["peers"]
    assert set(peers) == {"fusiontune", "onnxruntime", "jax", "torch.compile", "numpy", "numexpr"}
    for name in ("fusiontune", "numpy"):  # always there: checked against float64, then timed
        assert peers[name]["max_rel"] <= case["tolerance"]
        assert not peers[name]["wrong"]
        assert peers[name]["median_s"] > 0
    for name, peer in peers.items():
        installed = importlib.util.find_spec({"torch.compile": "torch"}.get(name, name)) is not None
        if installed and name != "torch.compile":
            assert "median_s" in peer, (name, peer["note"])
            assert peer["max_rel"] == peer["max_rel"], f"{name}: outputs were not checked"
        elif not installed:
            assert peer["note"].startswith("not installed"), (name, peer["note"])
    assert peers["torch.compile"]["note"].startswith(("skipped", "not installed"))
    assert case["bandwidth"]["fraction"] > 0  # a memory-bound case reports its share of copy bandwidth

    text = results.read_text()
    assert "| peer | median ms | IQR ms | min..max ms | peer / fusiontune | max_rel | note |" in text
    assert "model name" not in text and "machine:" in text and "numba" in text
    assert "## Goals" in text and "elementwise_chain: jax/fusiontune" in text
    assert "| fusiontune |" in proc.stdout  # the table is printed too
