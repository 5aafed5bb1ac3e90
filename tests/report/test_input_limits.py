"""``fusiontune report`` on a file that is not a fusiontune study: one line, rc 2, nothing written.

optuna's ``RDBStorage`` writes its schema into whatever it is pointed at: an empty file or another
program's SQLite database used to come back from a refused report 100 KB bigger. The check runs
before optuna touches the file, through a read-only connection, so the file's bytes and mtime
are exactly as they were.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import optuna
import pytest

from fusiontune.cli import main
from fusiontune.errors import UserError
from fusiontune.report.tables import open_study


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, assert it refused in one stderr line (rc 2, no traceback), return the line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fusiontune: error: ")
    return err.strip()


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder``: its bytes and its mtime in nanoseconds."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def foreign_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('not a study')")
    conn.close()


def other_programs_study(path: Path) -> None:
    """An optuna study another program made: its own attributes, a trial, no fusiontune info."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="theirs", storage=f"sqlite:///{path}")
    study.set_user_attr("owner", "someone else")
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 0.1},
            distributions={"lr": optuna.distributions.FloatDistribution(0.0, 1.0)},
            value=1.0,
        )
    )


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_bytes(b""), "an empty file"),
        (lambda p: p.write_text("id,value\n1,2\n"), "not an SQLite file"),
        (foreign_sqlite, "no optuna tables: studies, trials"),
    ],
    ids=["empty", "text", "foreign-sqlite"],
)
def test_report_on_a_file_that_is_not_an_optuna_database_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, make, why: str
) -> None:
    out = tmp_path / "results" / "x"
    out.mkdir(parents=True)
    db = out / "study.db"
    make(db)
    old = os.stat(db).st_mtime_ns - 10**9  # a second back, so any write would move it
    os.utime(db, ns=(old, old))
    before = snapshot(out)
    line = refused(capsys, "report", str(out))
    assert line.startswith(
        f"fusiontune: error: cannot open storage {db}: not a fusiontune study database ({why}"
    )
    assert line.endswith("; nothing was written")
    assert snapshot(out) == before  # same files (no journal left), same bytes, same mtimes


def test_report_on_another_programs_optuna_study_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "theirs"
    out.mkdir()
    other_programs_study(out / "study.db")
    before = snapshot(out)
    line = refused(capsys, "report", str(out))
    assert "study 'theirs' is not a fusiontune study (no 'space_toml' user attribute)" in line
    assert snapshot(out) == before


def test_open_study_checks_an_sqlite_url_before_optuna_opens_it(tmp_path: Path) -> None:
    db = tmp_path / "study.db"
    foreign_sqlite(db)
    before = db.read_bytes()
    with pytest.raises(UserError, match="not a fusiontune study database"):
        open_study(f"sqlite:///{db}")
    assert db.read_bytes() == before


def test_a_study_interrupted_before_its_info_still_opens(tmp_path: Path) -> None:
    """Created, then killed before the StudyInfo was written: no attributes, no trials."""
    db = tmp_path / "study.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="x", storage=f"sqlite:///{db}")
    assert open_study(f"sqlite:///{db}").study_name == "x"
