"""Smoke run of benchmarks/bench_train.py at tiny sizes: every figure is there and sane.

Nothing here depends on how fast anything is; the torch part runs only where torch is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train.py"
TINY = ["--sizes", "batch=1,seq=8,hidden=16,heads=2,ffn=32", "--rounds", "2"]


def load_bench():  # noqa: ANN201  (a module loaded from a file)
    spec = importlib.util.spec_from_file_location("bench_train", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_train_reports_peak_and_time_per_recompute_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = load_bench().main([*TINY, "--levels", "0,2", "--no-torch"])
    rows = figures["recompute"]
    assert [r["value"] for r in rows] == ["recompute=0", "recompute=2"]
    assert all(r["peak_bytes"] > 0 and r["median_s"] > 0 and r["max_rel"] < 1e-3 for r in rows)
    assert rows[1]["saved_bytes"] < rows[0]["saved_bytes"]  # the GELU output is recomputed
    assert "recompute=2" in capsys.readouterr().out


def test_bench_train_checks_torch_against_the_reference() -> None:
    pytest.importorskip("torch")
    figures = load_bench().main([*TINY, "--levels", "0"])
    assert figures["torch_matches"], figures["torch_check"]
    assert figures["torch_check"]["grad_rel"] < 1e-4
    assert figures["speedup_vs_torch"] > 0
