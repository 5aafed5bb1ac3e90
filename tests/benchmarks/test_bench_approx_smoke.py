"""Smoke run of benchmarks/bench_approx.py: every case runs and reports its times and errors.

Marked ``bench``: CI never runs it and nothing here depends on how fast anything is.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_approx.py"


@pytest.mark.bench
def test_bench_approx_quick_reports_every_case(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_approx", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "bench.json"
    figures = module.main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    for case in ("softmax", "gelu_erf"):
        fig = figures["cases"][case]
        assert set(fig["timings"]) == {"default", "approx"}
        assert fig["default_over_approx"] > 0
        # The approximation's error is declared; a kernel that computed garbage would be far off.
        assert fig["max_rel_error"]["approx"] < 1e-3
