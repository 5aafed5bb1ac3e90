"""The CLI: `passes`, `convert`, the `run` dispatch, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.config import FusionConfig, loads_switch, parse_flags
from fusiontune.passes.registry import PASSES

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- passes --------------------------------------------------------------------------------------
def test_passes_table_has_a_row_per_pass_in_aligned_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "passes")
    assert code == 0 and err == ""
    header, rule, *rows = out.splitlines()
    for column in (
        "name",
        "alias",
        "kind",
        "default",
        "switchable",
        "exact",
        "split points",
        "description",
    ):
        assert column in header
    assert len(rows) == len(PASSES)
    kind_at = header.index("kind")
    assert all(row[kind_at:].startswith(("GraphFusion", "UBFusion")) for row in rows)
    row = next(r for r in rows if r.startswith("MatMulRowSplitFusionPass "))
    assert "matmul_row_split_fusion" in row and "row_block[0..4096]" in row
    assert row.rstrip().endswith(
        next(p.summary for p in PASSES if p.name == "MatMulRowSplitFusionPass")
    )


def test_passes_kind_filters(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "passes", "--kind", "UBFusion")
    rows = out.splitlines()[2:]
    assert code == 0 and rows and all(" UBFusion " in r for r in rows)


def test_passes_json_is_for_machines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "passes", "--json")
    data = json.loads(out)
    assert code == 0 and [d["name"] for d in data] == [p.name for p in PASSES]
    row_split = next(d for d in data if d["name"] == "MatMulRowSplitFusionPass")
    assert row_split["split_points"][0]["name"] == "row_block"
    assert row_split["split_points"][0]["high"] == 4096
    constant_folding = next(d for d in data if d["name"] == "ConstantFoldingPass")
    assert constant_folding["switchable"] is False


def test_python_m_fusiontune_passes_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fusiontune", "passes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("name")
    assert "SoftmaxFusionPass" in proc.stdout and "softmax_fusion" in proc.stdout


# ---- convert -------------------------------------------------------------------------------------
def test_convert_cfg_to_flags_by_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "fusion_switch.cfg"
    cfg.write_text(
        '{"Switch":{"GraphFusion":{"GeluFusionPass":"off"},"UBFusion":{"basic_ops_fusion":"off"}}}'
    )
    code, out, err = run_cli(capsys, "convert", str(cfg))
    assert (code, out, err) == (0, "--disable_pass=gelu_fusion,basic_ops_fusion\n", "")


def test_convert_flags_to_json_cfg_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "convert", "--disable_pass=gelu_fusion")
    assert code == 0
    assert loads_switch(out) == FusionConfig.defaults().with_switches(GeluFusionPass=False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--flags", "--disable_pass=gelu_fusion"],
        ["--flags=--disable_pass=gelu_fusion"],
        ["--disable_pass", "gelu_fusion"],
        ["--disable_pass=gelu_fusion --opt_level=2"],
        ["--", "--disable_pass=gelu_fusion"],
    ],
)
def test_convert_reads_flags_however_they_are_quoted(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, _ = run_cli(capsys, "convert", "--to", "lines", *argv)
    assert code == 0
    assert loads_switch(out) == FusionConfig.defaults().with_switches(GeluFusionPass=False)


def test_convert_notes_ignored_mindspore_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "convert", "--opt_level=2", "--disable_pass=gelu_fusion")
    assert code == 0
    assert (
        err == "fusiontune: note: ignored flags that do not switch fusion passes: --opt_level=2\n"
    )


def test_convert_writes_output_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "rec" / "fusion_switch.cfg"
    code, out, _ = run_cli(
        capsys,
        "convert",
        "--flags",
        "--disable_pass=softmax_fusion",
        "--minimal",
        "-o",
        str(out_file),
    )
    assert code == 0 and out == f"wrote {out_file}\n"
    # "ALL" is stated, so the passes that are off by default (the inexact ones) are named too.
    default_off = {
        kind: {p.name: "off" for p in PASSES if p.kind == kind and not p.default}
        for kind in ("GraphFusion", "UBFusion")
    }
    assert json.loads(out_file.read_text()) == {
        "Switch": {
            "GraphFusion": {"ALL": "on", "SoftmaxFusionPass": "off", **default_off["GraphFusion"]},
            "UBFusion": {"ALL": "on", **default_off["UBFusion"]},
        }
    }


def test_convert_flags_file_and_line_cfg(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags_file = tmp_path / "graph_kernel_flags.txt"
    flags_file.write_text("--disable_pass=gelu_fusion\n")
    code, out, _ = run_cli(capsys, "convert", str(flags_file), "--to", "lines", "--minimal")
    assert code == 0 and "GeluFusionPass:off" in out
    lines_cfg = tmp_path / "lines.cfg"
    lines_cfg.write_text(out)
    code, out, _ = run_cli(capsys, "convert", str(lines_cfg))
    assert (code, out) == (0, "--disable_pass=gelu_fusion\n")


def test_convert_best_config_notes_dropped_split_points(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    best = tmp_path / "best_config.json"
    config = FusionConfig.defaults().with_splits(**{"MatMulRowSplitFusionPass.row_block": 128})
    best.write_text(json.dumps(config.to_json()))
    code, out, err = run_cli(capsys, "convert", str(best), "--to", "flags")
    assert code == 0 and out == "\n"
    assert "dropped MatMulRowSplitFusionPass.row_block=128" in err


def test_convert_flags_round_trip_through_cfg(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = "--disable_pass=softmax_fusion,matmul_row_split_fusion"
    out_file = tmp_path / "fusion_switch.cfg"
    assert main(["convert", flags, "-o", str(out_file)]) == 0
    capsys.readouterr()
    code, out, _ = run_cli(capsys, "convert", str(out_file))
    assert code == 0 and parse_flags(out) == parse_flags(flags)


# ---- run dispatch --------------------------------------------------------------------------------
def test_run_parses_its_arguments_into_run_options_for_the_runner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusiontune import runner

    seen: list[runner.RunOptions] = []
    monkeypatch.setattr(runner, "run_command", lambda options: seen.append(options) or 0)
    argv = [
        "run",
        "mlp",
        "--flags",
        "--disable_pass=gelu_fusion",
        "--split",
        "MatMulRowSplitFusionPass.row_block=128",
        "--size",
        "batch=8",
        "--size",
        "hidden=64",
        "--dump-graphs",
        "dumps",
        "--repeat",
        "5",
        "--json",
    ]
    assert main(argv) == 0
    (options,) = seen
    assert options == runner.RunOptions(
        workload="mlp",
        flags="--disable_pass=gelu_fusion",
        splits=(("MatMulRowSplitFusionPass.row_block", 128),),
        sizes=(("batch", 8), ("hidden", 64)),
        dump_graphs=Path("dumps"),
        repeat=5,
        json=True,
    )


def test_run_unknown_workload_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "transfomer_block")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("fusiontune: error: ") and "transformer_block" in err


# ---- errors: exit 2, one line on stderr, no traceback --------------------------------------------
@pytest.mark.parametrize(
    ("content", "argv", "message"),
    [
        (
            '{"Switch":{"GraphFusion":{"SoftmaxFusionPas":"off"}}}',
            [],
            "{cfg}: Switch.GraphFusion.SoftmaxFusionPas: unknown pass (closest known: SoftmaxFusionPass",
        ),
        (
            '{"Switch":{\n"GraphFusion":{\n"ALL":"off"     "SoftmaxFusionPass":"on"}}}',
            [],
            "{cfg}:3:17: malformed JSON: Expecting ',' delimiter",
        ),
        (
            '{"Switch":{"GraphFusion":{"ConstantFoldingPass":"off"}}}',
            [],
            "{cfg}: Switch.GraphFusion.ConstantFoldingPass: ConstantFoldingPass cannot be switched off",
        ),
        (
            '{"Switch":{"GraphFusion":{"ALL":"maybe"}}}',
            [],
            '{cfg}: Switch.GraphFusion.ALL: expected "on" or "off"',
        ),
        ('{"GraphFusion_typo":{}}', [], "{cfg}: Switch: missing key"),
        ("", ["--flags", "--disable_pass=gelu_fusoin"], None),
        (None, [], "{cfg}: no such file"),
    ],
)
def test_bad_input_exits_2_with_one_stderr_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str | None,
    argv: list[str],
    message: str | None,
) -> None:
    cfg = tmp_path / "fusion_switch.cfg"
    if content is not None:
        cfg.write_text(content)
    args = argv if argv else [str(cfg)]
    code, out, err = run_cli(capsys, "convert", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fusiontune: error: ") and "Traceback" not in err
    if message is not None:
        assert err.startswith("fusiontune: error: " + message.format(cfg=cfg))


def test_flags_error_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "convert", "--enable_pass=gelu_fusion", "--disable_pass=gelu_fusion"
    )
    assert code == 2
    assert err.startswith("fusiontune: error: graph_kernel_flags: --disable_pass=gelu_fusion: ")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["passes", "--kind", "Other"],
        ["convert", "--to", "yaml", "x.cfg"],
        ["run"],
        ["run", "mlp", "--split", "row_block"],
        ["run", "mlp", "--config", "a.cfg", "--flags", "--x=1"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and "error:" in err and "Traceback" not in err


def test_convert_without_input_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "convert")
    assert code == 2 and err.count("\n") == 1


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "passes" in out and "convert" in out and "run" in out
