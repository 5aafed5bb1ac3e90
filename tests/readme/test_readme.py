"""The README works as written: every command, in order, in a fresh clone (slow tier).

``run_readme.py`` does the work and prints its table; this test runs it with 3 trials per sweep
and fails with that table when any command failed. The helpers it uses are checked in the fast
tier below.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_readme  # noqa: E402


@pytest.mark.slow
def test_every_readme_command_runs_in_a_fresh_clone() -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_readme.py"), "--trials", "3", "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-3000:]
    assert " 0 failed" in proc.stdout


def test_the_readme_blocks_are_read_in_order_with_their_lines(tmp_path: Path) -> None:
    md = tmp_path / "README.md"
    md.write_text(
        "x\n```bash\nmake tune   # set up\n\nfusiontune passes\n```\n```toml\na = 1\n```\n"
    )
    assert run_readme.blocks(md) == [
        ("bash", 2, ["make tune   # set up", "", "fusiontune passes"]),
        ("toml", 7, ["a = 1"]),
    ]
    cmds = run_readme.commands([md], tmp_path, tmp_path)
    assert [(c.source, c.text) for c in cmds] == [
        ("README.md:3", "make tune"),
        ("README.md:5", "fusiontune passes"),
    ]


def test_comments_are_cut_outside_quotes_only() -> None:
    assert run_readme.split_comment('run --flags "--a=#b" # why') == (
        'run --flags "--a=#b"',
        "# why",
    )
    assert run_readme.split_comment("a#b") == ("a#b", "")


@pytest.mark.parametrize(
    ("text", "run"),
    [
        ("make tune", "make tune TUNE_ARGS='--trials 3'"),
        (
            "fusiontune tune s.toml --trials 200 --timeout 8h",
            "fusiontune tune s.toml --trials 3 --timeout 8h",
        ),
        ("fusiontune tune s.toml --workers 0", "fusiontune tune s.toml --workers 0 --trials 3"),
        (
            "python benchmarks/real_exports.py --markdown",
            "python benchmarks/real_exports.py --markdown --only bert.dynamo.",
        ),
        ("fusiontune run mlp", "fusiontune run mlp"),
    ],
)
def test_substitutions_keep_sweeps_small(text: str, run: str) -> None:
    c = run_readme.Command("README.md:1", text)
    run_readme.substitute(c, 3, None, False)
    assert (c.run, c.skip) == (run, "")


@pytest.mark.parametrize(
    "text",
    [
        "make test",
        "ray start --head",
        "RAY_AUTH_MODE=token fusiontune tune s.toml --workers 8 --ray-address HEAD:6379",
        "pip install -e '.[postgres]'",
        "fusiontune tune s.toml --storage postgresql://u@h/db",
    ],
)
def test_what_cannot_run_here_is_skipped_with_a_reason(text: str) -> None:
    c = run_readme.Command("README.md:1", text)
    run_readme.substitute(c, 3, None, False)
    assert c.skip


def test_a_postgres_url_runs_the_postgres_lines() -> None:
    c = run_readme.Command("README.md:1", "fusiontune tune s.toml --storage postgresql://u@h/db")
    run_readme.substitute(c, 3, "postgresql://me@127.0.0.1/t", False)
    assert not c.skip and "--storage postgresql://me@127.0.0.1/t" in c.run


def test_bisect_may_exit_1_as_documented() -> None:
    c = run_readme.Command("README.md:1", "fusiontune bisect s.toml")
    run_readme.substitute(c, 3, None, False)
    assert c.expect == (0, 1)
