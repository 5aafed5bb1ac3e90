"""Smoke run of ``benchmarks/fit_blocks.py`` on a bench_blocks.py JSON written here (times given,
nothing built or timed): the rule's pick is scored against the fastest plan timed, and a grid of
layout constants is tried and ranked. An unknown constant is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "benchmarks" / "fit_blocks.py"


def _times(folder: Path) -> Path:
    """One 1x1 24->144 conv of 4x4 outputs, batch 2, on 16 registers, with the two plans measured
    on a Zen 3 core: rows 6x2 13.2 us, lanes 4x3 7.4 us."""
    shape = {"shape": "1x1 24->144 @4 n2", "x": [2, 24, 4, 4], "w": [144, 24, 1, 1], "strides": [1, 1],
             "pads": [0, 0, 0, 0], "dilations": [1, 1], "bias": True, "rule": ["rows", "6x2"],
             "us": {"rows 6x2": 13.2, "lanes 4x3": 7.4}}
    path = folder / "blocks.json"
    path.write_text(json.dumps({"vector_bits": 256, "blocks": ["6x2", "4x3"], "shapes": [shape]}))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FIT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_fit_blocks_scores_the_rule_and_ranks_a_grid(tmp_path: Path) -> None:
    path = _times(tmp_path)
    out = _run(str(path), "--grid", "ROWS_EPILOGUE_16_REGISTERS=0,4", "--grid", "ROWS_STRIDED_COST_16_REGISTERS=1.16")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # The rule as it stands (a per-row cost for rows on narrow planes) takes lanes 4x3, the fastest.
    assert "geometric mean 1.000, worst 1.000, 0 below 0.9" in lines[0], lines[0]
    ranked = [line for line in lines if line.strip().startswith("geomean")]
    assert len(ranked) == 2
    # Best first: with the per-row cost the pick is the fastest plan; without it rows 6x2, 7.4 / 13.2.
    assert "geomean 1.000" in ranked[0] and "'ROWS_EPILOGUE_16_REGISTERS': 4.0" in ranked[0]
    assert f"geomean {7.4 / 13.2:.3f}" in ranked[1] and "'ROWS_EPILOGUE_16_REGISTERS': 0.0" in ranked[1]


def test_fit_blocks_refuses_a_name_that_is_not_a_constant(tmp_path: Path) -> None:
    out = _run(str(_times(tmp_path)), "--grid", "NO_SUCH_CONSTANT=1,2")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "NO_SUCH_CONSTANT" in out.stderr and "Traceback" not in out.stderr
