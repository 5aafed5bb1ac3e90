"""Smoke run of benchmarks/hardening.py: the bad-input table against this checkout.

Marked ``bench``: CI never runs it. It runs the script in a subprocess, as a user does, and checks
the table's shape and that the script leaves nothing in the checkout; what the rows say is the
measurement, not a premise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "hardening.py"


def _results_and_top_level() -> set[str]:
    """The checkout's files where a run would leave its output: results/ and the top level."""
    found = {p.name for p in ROOT.iterdir()}
    if (ROOT / "results").is_dir():
        found |= {str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*")}
    return found


@pytest.mark.bench
def test_hardening_inputs_table_has_a_row_per_input_and_leaves_the_checkout_alone() -> None:
    before = _results_and_top_level()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "inputs", "--markdown"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(rows) == 1 + 17, proc.stdout  # the header and one row per input
    assert "not measured" not in proc.stdout
    assert _results_and_top_level() <= before
