"""``fusiontune run``: what it prints and records about its timing, noisy or not.

The noise is injected where the measurement path draws its samples (``time_stable`` in the
evaluate module, ``time_interleaved`` for the all-off comparison): the program itself is real,
fused, compiled and checked; nothing depends on how busy the machine is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fusiontune.cli import main
from fusiontune.measure import MeasureConfig, Timing, describe_noise, time_interleaved, time_stable

QUIET = (1.00e-3, 1.01e-3, 0.99e-3, 1.00e-3, 1.02e-3, 0.98e-3, 1.00e-3)
BUSY = (1.0e-3, 3.0e-3, 0.9e-3, 2.5e-3, 1.1e-3, 4.0e-3, 1.0e-3)
SMALL_MLP = ["run", "mlp", "--size", "batch=4", "--size", "hidden=32", "--repeat", "3"]


def scripted(samples: Sequence[float]) -> Callable[[Callable[[], Any], MeasureConfig], Timing]:
    def measure_once(fn: Callable[[], Any], cfg: MeasureConfig) -> Timing:
        fn()  # the real program runs; its time is the script's
        return Timing.from_samples(tuple(samples), 1)

    return measure_once


@pytest.fixture
def noise(monkeypatch: pytest.MonkeyPatch) -> Callable[[Sequence[float], Sequence[float]], None]:
    """Make the run's samples ``run`` and the all-off comparison's ``versus`` (fused and all-off)."""

    def set_noise(run: Sequence[float], versus: Sequence[float]) -> None:
        monkeypatch.setattr(
            "fusiontune.tune.evaluate.time_stable",
            lambda fn, cfg: time_stable(fn, cfg, measure_once=scripted(run)),
        )

        def measure_round(fns: Any, rounds: int, cfg: MeasureConfig, m: float) -> list[Timing]:
            return [Timing.from_samples(tuple(versus), 1), Timing.from_samples(QUIET * 3, 1)]

        monkeypatch.setattr(
            "fusiontune.runner.time_interleaved",
            lambda fns, rounds, cfg: time_interleaved(
                fns, rounds, cfg, measure_round=measure_round
            ),
        )

    return set_noise


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *extra: str) -> tuple[str, str]:
    assert main([*SMALL_MLP, "--out", str(tmp_path / "out"), *extra]) == 0
    out, err = capsys.readouterr()
    return out, err


def test_a_quiet_run_prints_no_noise_line(noise, capsys, tmp_path: Path) -> None:
    noise(QUIET, QUIET)
    out, _ = run(capsys, tmp_path, "--vs-all-off")
    assert "noisy" not in out and "unreliable" not in out
    assert "runtime   median 1.00 ms  (IQR" in out


def test_a_noisy_run_says_so_in_one_line_after_its_retries(noise, capsys, tmp_path: Path) -> None:
    noise(BUSY, QUIET)
    out, _ = run(capsys, tmp_path)
    lines = out.splitlines()
    expected = describe_noise(
        Timing(**{**Timing.from_samples(BUSY, 1).__dict__, "noisy": True, "attempts": 3})
    )
    assert expected.startswith("noisy: CV ") and expected.endswith(
        "after 3 measurements; the machine is busy, figures are not reliable"
    )
    assert lines.count(expected) == 1
    runtime = next(i for i, line in enumerate(lines) if line.startswith("runtime   "))
    assert lines[runtime + 1] == expected  # right under the figure it qualifies


def test_a_noisy_comparison_calls_the_speedup_unreliable(noise, capsys, tmp_path: Path) -> None:
    noise(QUIET, BUSY)
    out, _ = run(capsys, tmp_path, "--vs-all-off")
    lines = out.splitlines()
    (speedup,) = [line for line in lines if line.startswith("all-off   ")]
    assert speedup.endswith("faster with this configuration; unreliable, the timing is noisy")
    noted = [line for line in lines if line.startswith("noisy: ")]
    assert len(noted) == 1 and "after 3 measurements" in noted[0]


def test_the_json_record_carries_noise_attempts_and_the_ci(noise, capsys, tmp_path: Path) -> None:
    noise(BUSY, BUSY)
    out, err = run(capsys, tmp_path, "--vs-all-off", "--json")
    record = json.loads(out)  # the noise lines went to stderr
    assert record["noisy"] is True and record["attempts"] == 3
    assert record["ci_low_s"] <= record["median_s"] <= record["ci_high_s"]
    assert record["noise"] == describe_noise(
        Timing(**{**Timing.from_samples(BUSY, 1).__dict__, "noisy": True, "attempts": 3})
    )
    versus = record["vs_all_off"]
    assert (
        versus["noisy"] is True
        and versus["fused_noisy"] is True
        and versus["all_off_noisy"] is False
    )
    assert versus["attempts"] == 3 and versus["noise"].startswith("noisy: CV ")
    assert versus["fused_ci_low_s"] <= versus["fused_median_s"] <= versus["fused_ci_high_s"]
    assert err.count("noisy: CV ") == 2 and "the speedup is unreliable" in err


def test_a_quiet_json_record_says_not_noisy(noise, capsys, tmp_path: Path) -> None:
    noise(QUIET, QUIET)
    out, err = run(capsys, tmp_path, "--json")
    record = json.loads(out)
    assert (record["noisy"], record["attempts"], record["noise"]) == (False, 1, None)
    assert "noisy" not in err
