"""A throwaway PostgreSQL server for the db test tier and ``benchmarks/fault_injection.py``.

The server is the real thing, the binaries of the machine's PostgreSQL (Debian's ``postgresql``
package puts them in ``/usr/lib/postgresql/<version>/bin``): a fresh cluster in a temporary
folder, listening on 127.0.0.1 on a free port, trust authentication, stopped and deleted at the
end. ``initdb`` and ``postgres`` refuse to run as root, so under root the cluster belongs to the
``postgres`` system user (created by the package), or ``nobody`` when there is none.

Durability is switched off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the faults
injected are killed clients, never a killed server or host, so what a commit guarantees to other
sessions is unchanged and the tests run faster.

    server = PostgresServer.start()          # raises ServerUnavailable(reason)
    url = server.create_database("study1")   # postgresql://postgres@127.0.0.1:PORT/study1
    server.stop()
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SUPERUSER = "postgres"
_SEARCH = ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/opt/homebrew/opt/postgresql*/bin")
_SERVER_OPTIONS = (
    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    " -c max_connections=300 -c shared_buffers=32MB"
)


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why, in one sentence."""


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Looked for on ``PATH`` (symlinks resolved), then in Debian's, the source build's and
    Homebrew's places; the newest version wins.

    Raises:
        ServerUnavailable: no PostgreSQL server binaries are installed.
    """
    found = shutil.which("initdb")
    if found:
        bindir = Path(found).resolve().parent
        if (bindir / "pg_ctl").is_file():
            return bindir
    candidates = [Path(p) for pattern in _SEARCH for p in glob.glob(pattern)]
    candidates = [p for p in candidates if (p / "initdb").is_file() and (p / "pg_ctl").is_file()]
    if not candidates:
        raise ServerUnavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin:"
            " apt-get install postgresql"
        )
    return max(candidates, key=_version_key)


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", str(path))) or (0,)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A running throwaway server; :meth:`start` makes one, :meth:`stop` removes it entirely.

    Attributes:
        root: the temporary folder (data folder ``root/data``, log ``root/server.log``, socket).
        port: the TCP port on 127.0.0.1.
        bindir: where its binaries are.
    """

    def __init__(self, root: Path, port: int, bindir: Path, run_as: str | None) -> None:
        self.root = root
        self.port = port
        self.bindir = bindir
        self.run_as = run_as
        self._created = 0

    # ---- lifecycle -------------------------------------------------------------------------
    @classmethod
    def start(cls, attempts: int = 3) -> PostgresServer:
        """Create a cluster in a temporary folder and start it.

        Args:
            attempts: ports tried (another process may take a free port before the server does).

        Returns:
            The running server.

        Raises:
            ServerUnavailable: no binaries, no unprivileged user to run them as, or the server
                did not start (the end of its log is in the message).
        """
        bindir = find_bindir()
        run_as = _unprivileged_user()
        root = Path(tempfile.mkdtemp(prefix="fusiontune-pg-"))
        try:
            if run_as is not None:
                entry = pwd.getpwnam(run_as)
                os.chown(root, entry.pw_uid, entry.pw_gid)
            server = cls(root, 0, bindir, run_as)
            server._initdb()
            last = ""
            for _ in range(attempts):
                server.port = free_port()
                last = server._pg_ctl_start()
                if not last:
                    return server
            raise ServerUnavailable(f"postgres did not start: {last}")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def stop(self) -> None:
        """Stop the server (immediately: nothing in it is kept) and delete its folder."""
        try:
            self._run(
                [self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"],
                timeout=60,
            )
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- databases ---------------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:PORT/<database>``: the README's form of the URL."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, hint: str = "db") -> str:
        """Create a new, empty database and return its URL.

        Args:
            hint: made into the database name (lower case letters, digits, underscores) with a
                counter, so that every call gets a fresh database.
        """
        import psycopg

        self._created += 1
        base = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")[:40] or "db"
        name = f"{base}_{self._created}"
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _dsn(self, database: str) -> str:
        return (
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database} connect_timeout=10"
        )

    # ---- the binaries -----------------------------------------------------------------------
    def _initdb(self) -> None:
        proc = self._run(
            [
                self.bindir / "initdb",
                "-D",
                self.data,
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            timeout=120,
        )
        if proc.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {_tail(proc.stdout + proc.stderr)}")

    def _pg_ctl_start(self) -> str:
        """Start on ``self.port``; '' when it runs, else why not."""
        log = self.root / "server.log"
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} {_SERVER_OPTIONS}"
        proc = self._run(
            [
                self.bindir / "pg_ctl",
                "-D",
                self.data,
                "-l",
                log,
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            timeout=90,
        )
        if proc.returncode == 0:
            return ""
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
        return _tail(text or proc.stdout + proc.stderr)

    def _run(self, argv: list[Any], timeout: float) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self.run_as is not None:  # root: the server's own user (Popen switches before exec)
            entry = pwd.getpwnam(self.run_as)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        if self.run_as is not None:
            env["HOME"] = str(self.root)
        return subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            env=env,
            **kwargs,
        )


def _unprivileged_user() -> str | None:
    """Who runs the server: None (this user) unless this is root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise ServerUnavailable(
        "running as root, and there is no 'postgres' or 'nobody' user to run the server as"
    )


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
