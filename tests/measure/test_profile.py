"""The kernel profile (``fusiontune run --profile``): real kernels, compiled and timed in place.

Nothing here depends on how fast anything is: the checks are on which kernels are listed, how
their shares add up, and that the kernels timed one by one add up to about the whole program
(a generous band: a busy machine moves both alike, since they are timed in the same rounds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.measure import MeasureConfig, interleaved_timings
from fusiontune.measure.profile import (
    KINDS,
    ProfileReport,
    format_profile,
    kernel_kind,
    kind_shares,
    profile_program,
)
from fusiontune.measure.roofline import measure_peak_flops
from fusiontune.tune.evaluate import build_candidate
from fusiontune.workloads import make_workload

SMALL_BLOCK = {"batch": 1, "seq": 32, "hidden": 64, "heads": 2, "ffn": 128}
BANDWIDTH = 10e9  # bytes/s: the roofline's figures are not what these tests check


@pytest.fixture(scope="module")
def profiled() -> tuple[object, ProfileReport]:
    workload = make_workload("transformer_block", **SMALL_BLOCK)
    program = build_candidate(workload, FusionConfig.defaults()).program
    report = profile_program(program, workload.inputs, rounds=9, bandwidth=BANDWIDTH)
    return program, report


def test_the_profile_lists_exactly_the_programs_kernels(profiled) -> None:
    program, report = profiled
    assert sorted(k.index for k in report.kernels) == list(range(program.kernel_count))
    assert {k.index: k.name for k in report.kernels} == {
        i: info.group for i, info in enumerate(program.kernels)
    }
    assert [k.median_s for k in report.kernels] == sorted(
        (k.median_s for k in report.kernels), reverse=True
    )
    assert all(k.median_s > 0 for k in report.kernels)


def test_shares_add_up_to_the_whole(profiled) -> None:
    _, report = profiled
    assert math.fsum(report.share(k) for k in report.kernels) == pytest.approx(1.0)
    by_kind = report.by_kind()
    assert sum(n for n, _ in by_kind.values()) == len(report.kernels)
    assert math.fsum(s for _, s in by_kind.values()) == pytest.approx(report.kernel_sum_s)
    assert math.fsum(kind_shares([report, report]).values()) == pytest.approx(1.0)


def test_the_kernels_add_up_to_about_the_whole_program(profiled) -> None:
    _, report = profiled
    ratio = report.kernel_sum_s / report.program_median_s
    assert 0.5 < ratio < 2.0, format_profile(report)
    assert report.overhead_per_kernel_s == pytest.approx(
        (report.program_median_s - report.kernel_sum_s) / len(report.kernels)
    )


def test_kinds_come_from_the_generator_and_the_ops(profiled) -> None:
    program, report = profiled
    kinds = {k.kind for k in report.kernels}
    assert kinds <= set(KINDS)
    assert {"matmul", "layout"} <= kinds  # the projections and the head reshapes
    for info in program.kernels:
        ops = {program.graph.node(n).op for n in info.nodes}
        if "MatMul" in ops and info.kind == "contraction":
            assert kernel_kind(info, program.graph) == "matmul"
        if ops <= {"Reshape", "Transpose"}:
            assert kernel_kind(info, program.graph) == "layout"


def test_the_roofline_figures_follow_the_bytes_and_flops(profiled) -> None:
    _, report = profiled
    assert report.bandwidth == BANDWIDTH and report.peak_flops > 0
    for k in report.kernels:
        assert k.memory_s == pytest.approx(k.bytes_moved / BANDWIDTH)
        assert k.compute_s == pytest.approx(k.flops / report.peak_flops)
        assert k.bound == ("compute" if k.compute_s > k.memory_s else "memory")
        assert k.pct_bandwidth == pytest.approx(100 * k.memory_s / k.median_s)


def test_the_record_round_trips_through_json(profiled) -> None:
    _, report = profiled
    assert ProfileReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_the_table_has_every_kernel_or_the_top_and_a_summary_line(profiled) -> None:
    _, report = profiled
    lines = format_profile(report)
    n = len(report.kernels)
    assert lines[1].split() == [
        "kernel", "kind", "median", "share", "bytes", "FLOPs", "%bw", "%peak", "bound",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[2 : 2 + n]] == [k.name for k in report.kernels]
    assert lines[2 + n].lstrip().startswith("sum of kernel medians")
    short = format_profile(report, top=2)
    assert short[4].lstrip().startswith(f"... {n - 2} more kernels")


def test_the_peak_is_measured_on_the_threads_asked_and_cached() -> None:
    one = measure_peak_flops(1)
    assert one > 1e8  # any machine running numba does more than 0.1 GFLOP/s in sgemm
    assert measure_peak_flops(1) == one


def test_unrotated_rounds_call_in_list_order() -> None:
    calls: list[str] = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    interleaved_timings(fns, 3, MeasureConfig(warmup=1), min_sample_s=0.0, rotate=False)
    assert "".join(calls) == "aabbcc" + "abc" * 3


# ---- the command line ------------------------------------------------------------------------
SMALL_MLP = ["run", "mlp", "--size", "batch=4", "--size", "hidden=32", "--repeat", "3"]


def test_run_profile_prints_the_table(capsys, tmp_path: Path) -> None:
    assert main([*SMALL_MLP, "--out", str(tmp_path), "--profile", "--profile-top", "2"]) == 0
    out = capsys.readouterr().out
    assert "profile   " in out and "sum of kernel medians" in out and "by kind: matmul" in out
    header = next(line for line in out.splitlines() if line.split()[:2] == ["kernel", "kind"])
    assert header.split()[-1] == "bound"


def test_run_profile_json_records_every_kernel(capsys, tmp_path: Path) -> None:
    assert main([*SMALL_MLP, "--out", str(tmp_path), "--profile", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    profile = ProfileReport.from_json(rec["profile"])
    assert len(profile.kernels) == rec["kernels_after"]
    assert rec["profile"]["kernel_sum_s"] == pytest.approx(profile.kernel_sum_s)


@pytest.mark.parametrize(
    "extra",
    [
        ["--profile-top", "3"],  # without --profile
        ["--profile", "--profile-top", "0"],
        ["--profile", "--profile-top", "3", "--json"],
    ],
)
def test_bad_profile_options_are_one_line_and_exit_2(capsys, tmp_path: Path, extra) -> None:
    assert main([*SMALL_MLP, "--out", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--profile" in err[0]
