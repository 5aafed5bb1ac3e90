"""Smoke run of benchmarks/bench_core.py: it runs end to end and reports every figure.

Marked ``bench``: CI never runs it and nothing here depends on how fast anything is.
Run with ``pytest -m bench tests/benchmarks``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_core.py"


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_core", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their string annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.mark.bench
def test_bench_core_quick_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    figures = _load_bench().main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    for case in ("chain", "add_layernorm"):
        fig = figures["cases"][case]
        assert fig["kernels"]["fused"] == 1
        assert fig["kernels"]["all-off"] > 1
        assert set(fig["timings"]) == {"fused", "all-off", "numpy"}
        assert fig["fraction_of_copy_bandwidth"] > 0
    assert figures["compile"]["program_compile_s"]["cold_s"] > 0
    assert figures["compile"]["cache_labels"]["warm"].get("disk", 0) > 0
