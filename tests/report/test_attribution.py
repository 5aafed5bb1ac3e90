"""The accuracy-attribution table: error with only one inexact pass on, speedup it brings."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fusiontune.passes.registry import PASSES
from fusiontune.report.tables import SWITCH_COLUMNS, accuracy_attribution
from fusiontune.workloads.space import ONLY_ROLE, baseline_params, loads_space

INEXACT = [p.name for p in PASSES if not p.exact]


def _row(number: int, role: str, error: float, speedup: float, on: set[str]) -> dict[str, object]:
    row: dict[str, object] = {c: "off" for c in SWITCH_COLUMNS}
    row.update({f"pass.{p}": "on" for p in on})
    row.update(
        number=number, role=role, state="COMPLETE", error=error, feasible=error <= 1e-3,
        speedup_vs_defaults=speedup,
    )
    return row


def test_attribution_takes_the_error_of_the_only_trial_and_the_sweep_median_speedup() -> None:
    fast, lowp = "ApproxTranscendentalFusionPass", "LowPrecisionFusionPass"
    frame = pd.DataFrame(
        [
            _row(0, "defaults", 1e-4, 1.0, set()),
            _row(1, ONLY_ROLE + fast, 1.2e-4, 1.5, {fast}),
            _row(2, ONLY_ROLE + lowp, 3e-3, 1.1, {lowp}),
            _row(3, "", 2e-4, 1.6, {fast, lowp}),
            _row(4, "", 1e-4, 0.9, set()),
        ]
    )
    table = accuracy_attribution(frame, searched=[f"pass.{fast}", f"pass.{lowp}"]).set_index("pass")
    assert list(table.index) == [fast, lowp]
    assert table.loc[fast, "error"] == pytest.approx(1.2e-4) and table.loc[fast, "feasible"]
    assert table.loc[lowp, "error"] == pytest.approx(3e-3) and not table.loc[lowp, "feasible"]
    # fast on: trials 1, 3 (1.5, 1.6); off: 0, 2, 4 (1.0, 1.1, 0.9): ratio of medians 1.55 / 1.0
    assert table.loc[fast, "speedup"] == pytest.approx(1.55)
    assert table.loc[fast, "n_on"] == 2 and table.loc[fast, "n_off"] == 3
    assert table.loc[lowp, "expected"] == next(p.expected_error for p in PASSES if p.name == lowp)


def test_a_pass_without_its_trial_is_listed_as_not_measured() -> None:
    name = INEXACT[0]
    frame = pd.DataFrame([_row(0, "defaults", 1e-4, 1.0, set()), _row(1, "", 1e-4, 1.2, {name})])
    table = accuracy_attribution(frame, searched=[f"pass.{name}"]).set_index("pass")
    assert math.isnan(table.loc[name, "error"]) and table.loc[name, "trial"] is None


def test_the_sweep_enqueues_one_only_trial_per_searched_inexact_pass() -> None:
    space = loads_space('[workload]\nname = "mlp"\n[passes]\nsearch = "ALL"\n', "all.toml")
    roles = list(baseline_params(space))
    assert roles[:2] == ["defaults", "all_off"]
    assert roles[2:] == [ONLY_ROLE + p for p in INEXACT]
    for name in INEXACT:
        params = baseline_params(space)[ONLY_ROLE + name]
        on = [k for k, v in params.items() if v == "on" and k.removeprefix("pass.") in INEXACT]
        assert on == [f"pass.{name}"]
    narrow = loads_space('[workload]\nname = "mlp"\n[passes]\nsearch = ["GeluFusionPass"]\n', "one.toml")
    assert list(baseline_params(narrow)) == ["defaults", "all_off"]
