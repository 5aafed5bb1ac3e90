"""The db tier: a real PostgreSQL server, started once per session, a fresh database per test.

The server is the machine's own PostgreSQL (``benchmarks/_postgres.py``: ``initdb`` into a
temporary folder, 127.0.0.1, a free port, trust authentication), stopped and deleted at the end.
Where none can be started the tests skip, naming why; with ``FUSIONTUNE_REQUIRE_DB=1`` (set by
``.ci/run``) they fail instead, so that CI never passes a tier it did not run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

HELPER = Path(__file__).resolve().parents[2] / "benchmarks" / "_postgres.py"


def load_helper() -> ModuleType:
    """``benchmarks/_postgres.py``, shared with ``benchmarks/fault_injection.py``."""
    if "fusiontune_pg_server" in sys.modules:
        return sys.modules["fusiontune_pg_server"]
    spec = importlib.util.spec_from_file_location("fusiontune_pg_server", HELPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _unavailable(reason: str) -> None:
    if os.environ.get("FUSIONTUNE_REQUIRE_DB") == "1":
        pytest.fail(f"FUSIONTUNE_REQUIRE_DB=1 and no PostgreSQL server: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL server: {reason}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A running throwaway server (``PostgresServer``), shared by the whole session."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the psycopg driver is not installed: pip install -e '.[postgres]'")
    helper = load_helper()
    server, reason = None, ""
    try:
        server = helper.PostgresServer.start()
    except helper.ServerUnavailable as e:
        reason = str(e)  # failed or skipped outside the except: one message, no chained traceback
    if server is None:
        _unavailable(reason)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server, request) -> str:
    """``postgresql://postgres@127.0.0.1:PORT/<fresh database>``: empty, no optuna tables yet."""
    return postgres_server.create_database(request.node.name)
