"""The CLI's edge: every option value checked before any work, typed options records, --version,
and the layering rule that the library never imports the CLI (or argparse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.workloads import WORKLOADS

PACKAGE = Path(__file__).resolve().parents[1] / "fusiontune"
STUDY_NAME = (
    "expected a study name of letters, digits, '_', '.', '-', starting with a letter or digit"
    " (it names the folder results/<name>/)"
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ("run mlp --repeat -3", "--repeat: must be >= 1, got -3"),
        ("run mlp --repeat 0", "--repeat: must be >= 1, got 0"),
        ("run mlp --repeat many", "--repeat: expected an integer, got 'many'"),
        ("run mlp --size batch=0", "--size: batch must be >= 1, got 0"),
        ("run mlp --size batch", "--size: expected NAME=INT, got 'batch'"),
        ("run model.onnx --dim batch=0", "--dim: batch must be >= 1, got 0"),
        (
            "run model.onnx --input-shape x=2x0",
            "--input-shape: every dimension of x must be >= 1, got 2x0",
        ),
        (
            "run mlp --split MatMulRowSplitFusionPass.row_block=-1",
            "--split: MatMulRowSplitFusionPass.row_block must be >= 0, got -1",
        ),
        ("tune space.toml --trials 0", "--trials: must be >= 1, got 0"),
        ("tune space.toml --workers -1", "--workers: must be >= 0, got -1"),
        ("tune space.toml --top-k -1", "--top-k: must be >= 0, got -1"),
        ("tune space.toml --seed -1", "--seed: must be >= 0, got -1"),
        (
            "tune space.toml --timeout 0",
            "--timeout: invalid duration '0': expected a positive number",
        ),
        ("tune space.toml --timeout 8x", "--timeout: invalid duration '8x'"),
        ("tune space.toml --timeout=-5m", "--timeout: invalid duration '-5m'"),
        ("tune space.toml --study ../../../x", f"--study: {STUDY_NAME}, got '../../../x'"),
        ("tune space.toml --study /abs/path", f"--study: {STUDY_NAME}, got '/abs/path'"),
        ("tune space.toml --study a/b", f"--study: {STUDY_NAME}, got 'a/b'"),
        ("tune space.toml --replay missing.db", "--replay: missing.db: no such file"),
        ("bisect space.toml --bound 0", "--bound: must be a finite number > 0, got 0"),
        ("bisect space.toml --bound=-1e-3", "--bound: must be a finite number > 0, got -1e-3"),
        (
            "bisect space.toml --bound -1e-3",
            "--bound: expected one argument; a value that starts with '-' is written --bound=VALUE",
        ),
        ("bisect space.toml --bound nan", "--bound: must be a finite number > 0, got nan"),
        ("bisect space.toml --bound inf", "--bound: must be a finite number > 0, got inf"),
        ("bisect space.toml --bound tight", "--bound: expected a number, got 'tight'"),
        ("bisect space.toml --name ../../../x", f"--name: {STUDY_NAME}, got '../../../x'"),
        ("bisect space.toml --name /abs/path", f"--name: {STUDY_NAME}, got '/abs/path'"),
        ("bisect space.toml --name a/b", f"--name: {STUDY_NAME}, got 'a/b'"),
        ("bisect space.toml --workers -2", "--workers: must be >= 0, got -2"),
        ("bisect space.toml --replay missing.json", "--replay: missing.json: no such file"),
        ("passes --kind Other", "--kind: invalid choice: 'Other'"),
        ("tune", "the following arguments are required: SPACE (see `fusiontune tune --help`)"),
    ],
)
def test_a_bad_option_value_is_one_line_naming_the_option_and_exit_2(
    argv: str,
    line: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv.split())
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"fusiontune: error: {line}"), err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_version_prints_the_program_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    code, out, err = run_cli(capsys, "--version")
    assert code == 0 and err == ""
    assert out == f"fusiontune {version('fusiontune')}\n"


def test_run_help_lists_every_built_in_workload(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0
    listed = out.split("built-in workloads", 1)[1]
    for name, spec in WORKLOADS.items():
        assert f"  {name} " in listed and spec.description in listed


def test_tune_parses_into_tune_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fusiontune.tune import driver

    seen: list[driver.TuneOptions] = []
    monkeypatch.setattr(driver, "tune_command", lambda options: seen.append(options) or 0)
    db = tmp_path / "study.db"
    db.touch()
    argv = "tune s.toml --trials 7 --timeout 1h30m --workers 0 --study again --seed 3 --top-k 0"
    assert main([*argv.split(), "--replay", str(db), "--no-confirm", "--no-progress"]) == 0
    assert seen == [
        driver.TuneOptions(
            space=Path("s.toml"),
            trials=7,
            timeout_s=5400.0,
            workers=0,
            study="again",
            seed=3,
            top_k=0,
            confirm=False,
            replay=str(db),
            progress=False,
        )
    ]


def test_bisect_parses_into_bisect_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusiontune.bisect import driver as bisect

    seen: list[bisect.BisectOptions] = []
    monkeypatch.setattr(bisect, "bisect_command", lambda options: seen.append(options) or 0)
    argv = "bisect s.toml --bad b.cfg --bound 2e-4 --metric max_abs --name n.1 --workers 2"
    assert main(argv.split()) == 0
    assert seen == [
        bisect.BisectOptions(
            space=Path("s.toml"),
            bad=Path("b.cfg"),
            bound=2e-4,
            metric="max_abs",
            name="n.1",
            workers=2,
        )
    ]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_library_never_imports_the_cli_or_argparse() -> None:
    """Library functions take typed options; only fusiontune/cli/ (and ``python -m``) parse argv."""
    cli = PACKAGE / "cli"
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(cli) or path == PACKAGE / "__main__.py":
            continue
        bad = sorted(
            n
            for n in _imports(path)
            if n == "argparse"
            or n.startswith("argparse.")
            or n == "fusiontune.cli"
            or n.startswith("fusiontune.cli.")
        )
        if bad:
            offenders.append(f"{path.relative_to(PACKAGE.parent)}: {', '.join(bad)}")
    assert offenders == []
    assert (cli / "__init__.py").is_file()  # the walk saw the package it exempts
