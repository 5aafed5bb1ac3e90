"""Study storage: open an optuna RDB storage, lock a study, and tell live drivers from dead ones.

This is the store's private part (:mod:`fusiontune.tune.store` is the public one).

The storage is optuna's plain ``RDBStorage`` (SQLite by default, any SQLAlchemy URL), so
``optuna-dashboard <url>`` opens it as is. A driver stamps every trial it asks with who it is
(host, pid, process start time, run token) and, while the trial is in flight, a heartbeat (wall
clock). A trial still RUNNING when a driver starts belongs to a dead driver when its process is
gone (same host) or its heartbeat is stale (another host), or when it carries no stamp at all.
optuna's own heartbeat (``RDBStorage(heartbeat_interval=...)``) is meant for ``study.optimize``
and warns on every ``ask``; this is the same idea for an ask/tell loop.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from fusiontune.errors import UserError

DRIVER_ATTR = "fusiontune:driver"
HEARTBEAT_ATTR = "fusiontune:heartbeat"
HEARTBEAT_INTERVAL_S = 20.0
# A driver on another host is presumed dead after this long without a heartbeat (clock skew
# between hosts included).
STALE_AFTER_S = 180.0
# Run tokens of the drivers alive in this process (run_tune may run twice in one process).
_ACTIVE_TOKENS: set[str] = set()


def display_url(url: str) -> str:
    """``url`` with any password masked, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Open (creating when needed) the RDB storage at ``url``.

    For a SQLite file URL the parent folder is created. Network databases get a 10 s connect
    timeout so that an unreachable host fails fast.

    Args:
        url: a SQLAlchemy URL, e.g. ``sqlite:///results/mlp/study.db`` or
            ``postgresql://user@host/db``.

    Returns:
        The storage.

    Raises:
        UserError: the URL is malformed, its driver is not installed, or the database cannot be
            reached or created; one line naming the URL.
    """
    shown = display_url(url)
    engine_kwargs: dict[str, Any] = {}
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception as e:
        raise UserError(f"storage {shown}: not a database URL ({_reason(e)})") from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            try:
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(
                    f"storage {shown}: cannot create {Path(database).parent}: {e.strerror}"
                ) from None
    elif parsed.get_backend_name() in ("postgresql", "mysql"):
        engine_kwargs = {"connect_args": {"connect_timeout": 10}}
    try:
        with _schema_lock(url, parsed, engine_kwargs):
            storage = _create_storage(url, engine_kwargs)
            if parsed.get_backend_name() == "sqlite":
                _use_wal(storage)
        return storage
    except ImportError as e:
        backend = parsed.get_backend_name()
        raise UserError(
            f"storage {shown}: the Python driver for {backend} is not installed ({e})"
        ) from None
    except Exception as e:  # bad dialect, unreachable host, unwritable file: all one line
        raise UserError(f"storage {shown}: cannot connect ({_reason(e)})") from None


def _create_storage(url: str, engine_kwargs: dict[str, Any]) -> optuna.storages.RDBStorage:
    """optuna's storage; a schema another process created meanwhile is retried, not an error."""
    import sqlalchemy.exc

    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs or None)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


@contextmanager
def _schema_lock(url: str, parsed: Any, engine_kwargs: dict[str, Any]) -> Iterator[None]:
    """Hold a lock while optuna creates its tables, so two drivers on an empty database don't race.

    SQLite: a file lock beside the database. PostgreSQL / MySQL: a server-side advisory lock on a
    connection of its own (released when it closes, also if the process dies). Anything else:
    no lock (the retry in :func:`_create_storage` remains).
    """
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            yield
            return
        with file_lock(Path(database + ".lock")):
            yield
        return
    if backend not in ("postgresql", "mysql"):
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, **engine_kwargs)
    try:
        with engine.connect() as connection, _advisory_lock(connection, "fusiontune:schema"):
            yield
    finally:
        engine.dispose()


@contextmanager
def study_lock(storage: optuna.storages.BaseStorage, study_name: str) -> Iterator[None]:
    """A lock over one study, held across processes and, on a database server, across machines.

    The tuning loop holds it to fail stale trials, to enqueue the baselines once, and to give
    out its share of the budget (ask and stamp trials) atomically. SQLite: a file lock beside the
    database; PostgreSQL and MySQL: an advisory lock named after the study; an in-memory or other
    storage: a lock within this process.
    """
    # A study's storage is optuna's cache in front of the RDB storage: lock on the RDB one.
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is None:
        with _PROCESS_LOCKS.setdefault(study_name, threading.Lock()):
            yield
        return
    backend = engine.dialect.name
    database = engine.url.database or ""
    if backend == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        with file_lock(Path(database + ".lock")):
            yield
    elif backend in ("postgresql", "mysql"):
        with engine.connect() as connection, _advisory_lock(connection, "fusiontune:study:" + study_name):
            yield
    else:
        with _PROCESS_LOCKS.setdefault(study_name, threading.Lock()):
            yield


_PROCESS_LOCKS: dict[str, threading.Lock] = {}


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created when missing); released when the process dies.

    Each call opens the file anew: two threads of one process exclude each other too.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextmanager
def _advisory_lock(connection: Any, name: str) -> Iterator[None]:
    """A session-level advisory lock on ``connection``: PostgreSQL's ``pg_advisory_lock`` on a
    64-bit key from ``name``, MySQL's ``GET_LOCK``."""
    import sqlalchemy

    if connection.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        connection.commit()
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            connection.commit()
    else:
        connection.execute(sqlalchemy.text("SELECT GET_LOCK(:n, -1)"), {"n": name[:64]})
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text("SELECT RELEASE_LOCK(:n)"), {"n": name[:64]})


def _use_wal(storage: optuna.storages.RDBStorage) -> None:
    """Write-ahead logging for a SQLite study.

    In the default rollback mode every commit is an fsync (about 10 ms: most of a fast trial's
    cost) and a writer locks readers out, so optuna-dashboard sees "database is locked" while a
    sweep runs. WAL lets readers in during writes, and with ``synchronous=NORMAL`` a commit
    survives the process being killed (only an OS crash can lose the last ones).
    """
    import sqlalchemy

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # pooled connections were made before the listener
    with storage.engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")  # persistent: stored in the file


def _reason(e: BaseException) -> str:
    text = " ".join(str(getattr(e, "orig", None) or e).split())
    text = text.split(" (Background on this error")[0]
    return f"{type(e).__name__}: {text}"[:300]


# ---- the driver's identity, and stale trials ---------------------------------------------
def _process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch, or boot ticks), None if gone."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except ImportError:
        pass
    except Exception:
        return None
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return -1.0  # alive, start time unknown


class Driver:
    """This driver's identity, stamped on every trial it asks, and its heartbeat thread."""

    def __init__(self, storage: optuna.storages.BaseStorage) -> None:
        self.storage = storage
        self.token = uuid.uuid4().hex[:12]
        self.stamp: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": _process_start(os.getpid()),
            "token": self.token,
        }
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Driver:
        _ACTIVE_TOKENS.add(self.token)
        self._thread = threading.Thread(target=self._beat, name="fusiontune-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        _ACTIVE_TOKENS.discard(self.token)

    def claim(self, trial_id: int) -> None:
        """Stamp a trial just asked as this driver's, with a first heartbeat."""
        self.storage.set_trial_system_attr(trial_id, DRIVER_ATTR, self.stamp)
        self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
        with self._lock:
            self._in_flight.add(trial_id)

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._in_flight.discard(trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            with self._lock:
                ids = list(self._in_flight)
            for trial_id in ids:
                try:
                    self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
                except Exception:  # told meanwhile (finished trials refuse attrs), or a DB hiccup
                    pass


def driver_alive(system_attrs: dict[str, Any]) -> bool:
    """Whether the driver that stamped a RUNNING trial may still be running it."""
    stamp = system_attrs.get(DRIVER_ATTR)
    if not isinstance(stamp, dict):
        return False  # asked by something that is not a fusiontune driver, or died before stamping
    if stamp.get("host") == socket.gethostname():
        pid = int(stamp.get("pid", -1))
        start = _process_start(pid) if pid > 0 else None
        if start is None:
            return False
        if (
            stamp.get("start") is not None
            and start != -1.0
            and abs(start - float(stamp["start"])) > 1.0
        ):
            return False  # the pid was reused by another process
        if pid == os.getpid():
            return stamp.get("token") in _ACTIVE_TOKENS
        return True
    beat = system_attrs.get(HEARTBEAT_ATTR)
    return isinstance(beat, (int, float)) and time.time() - float(beat) < STALE_AFTER_S


def quiet_optuna() -> None:
    """optuna's per-trial INFO lines would drown the progress bar; warnings stay."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
