"""Refs and the blob pool of a sealed workspace (sync.store.pool): one tree per ref over
shared rows, links, pulls by content, crashes, the GC and the migration of a one-tree
workspace; in-process and behind a real `codeveil serve`. The PostgreSQL backend keeps
one tree and says so (409)."""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sync.client import StoreClient
from sync.http_client import HttpClient
from sync.local_client import LocalClient
from sync.records import DEFAULT_REF, MODE_SEALED, MODE_SERVER_SEARCH, FileUpdate
from sync.store import Store, StoreOptions
from sync.store.options import WRITE_POINTS
from sync.wire import BadRequest, RefNotFound, StoreError
from tests.test_sealed_store import CHECK, DIM, MODEL, rows_of, sealed_update
from tests.test_store import Killed, ancestors, key, kill_at, set_dirs, value

REF_A = b"A" * 16
REF_B = b"B" * 16


def link(path: str, version: str = "1") -> FileUpdate:
    return FileUpdate(file_key=key(path), ancestors=ancestors(path),
                      value=value(f"{path}@{version}"), link=True)


def blob(path: str, version: str = "1") -> tuple[bytes, bytes]:
    return key(path), value(f"{path}@{version}")


def pool_rows(data: Path, workspace_id: str) -> int:
    with sqlite3.connect(data / "workspaces" / workspace_id / "tree.sqlite") as db:
        return int(db.execute("SELECT COUNT(*) FROM rows").fetchone()[0])


class Clients:
    """Clients of one workspace on several refs, in-process or over HTTP."""

    def __init__(self, data: Path, server_url: str | None, workspace_id: str) -> None:
        self.data, self.url, self.workspace_id = data, server_url, workspace_id
        self.store = Store(data) if server_url is None else None
        self.opened: list[StoreClient] = []
        if server_url is None:
            assert self.store is not None
            LocalClient.create_workspace(self.store, workspace_id, dim=DIM, model_id=MODEL,
                                         key_check=CHECK, mode=MODE_SEALED)
        else:
            self.token = HttpClient.create_workspace(server_url, workspace_id, dim=DIM,
                                                     model_id=MODEL, key_check=CHECK,
                                                     mode=MODE_SEALED)

    def on(self, ref: bytes) -> StoreClient:
        client: StoreClient
        if self.store is not None:
            client = LocalClient(self.store, self.workspace_id, ref=ref)
        else:
            assert self.url is not None
            client = HttpClient(self.url, self.workspace_id, self.token, ref=ref)
        self.opened.append(client)
        return client

    def close(self) -> None:
        for c in self.opened:
            c.close()
        if self.store is not None:
            self.store.close()


@pytest.fixture(params=["local", "http"])
def clients(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Clients]:
    if request.param == "local":
        c = Clients(tmp_path / "store", None, "ws")
    else:
        server = request.getfixturevalue("live_server")
        c = Clients(server.data_dir, server.url, secrets.token_hex(8))
    yield c
    c.close()


def test_two_refs_keep_their_own_trees_over_one_pool(clients: Clients) -> None:
    a, b = clients.on(REF_A), clients.on(REF_B)
    shared, only_a = sealed_update("lib.py", 3), sealed_update("main.py", 2, "a")
    assert a.apply([shared, only_a], []) == []
    # b finds lib.py by its content: the pool holds it, so b links and uploads no row.
    held = b.blob_rows([blob("lib.py"), blob("main.py", "b")])
    assert held.rows == {key("lib.py"): rows_of(shared)} and held.missing == [key("main.py")]
    only_b = sealed_update("main.py", 4, "b")
    assert b.apply([link("lib.py"), only_b], []) == []
    assert clients.data is not None and pool_rows(clients.data, clients.workspace_id) == 3 + 2 + 4
    # Each ref reads its own tree; neither disturbed the other's.
    assert a.file_rows([key("main.py")]) == {key("main.py"): rows_of(only_a)}
    assert b.file_rows([key("main.py"), key("lib.py")]) == {
        key("main.py"): rows_of(only_b), key("lib.py"): rows_of(shared)}
    assert {n.value for n in a.children([key("")])[key("")]} != {
        n.value for n in b.children([key("")])[key("")]}
    assert a.root() is not None and b.root() is not None
    refs = {r.ref: r for r in a.refs()}
    assert set(refs) == {REF_A, REF_B}
    assert (refs[REF_A].files, refs[REF_A].rows) == (2, 5)
    assert (refs[REF_B].files, refs[REF_B].rows) == (2, 7)
    # a deletes lib.py: b still names its blob, so nothing of it goes.
    a.apply([], [key("lib.py")])
    assert b.file_rows([key("lib.py")]) == {key("lib.py"): rows_of(shared)}
    assert a.file_rows([key("lib.py")]) == {key("lib.py"): []}


def test_a_link_to_a_blob_the_pool_lacks_stays_pending(clients: Clients) -> None:
    a = clients.on(REF_A)
    a.apply([sealed_update("x.py", 1)], [])
    set_dirs(a, [(key(""), value("root"))])
    assert a.apply([link("ghost.py")], []) == [key("ghost.py")]
    kids = {n.key: n.value for n in a.children([key("")])[key("")]}
    assert kids[key("ghost.py")] is None  # never claims a blob the pool lacks
    assert a.root() is not None and a.root().value is None  # type: ignore[union-attr]
    assert a.file_rows([key("ghost.py")]) == {key("ghost.py"): []}


def test_bad_refs_are_refused(clients: Clients) -> None:
    a = clients.on(REF_A)
    with pytest.raises(RefNotFound):
        a.drop_ref(REF_B)
    with pytest.raises(StoreError):
        clients.on(b"short").root()
    with pytest.raises(BadRequest, match="carries no chunks"):
        a.apply([FileUpdate(key("f.py"), ancestors("f.py"), value("v"),
                            sealed_update("f.py", 1).chunks, link=True)], [])


def test_a_malformed_ref_in_a_path_is_a_400(live_server) -> None:  # type: ignore[no-untyped-def]
    import httpx

    ws = secrets.token_hex(8)
    token = HttpClient.create_workspace(live_server.url, ws, dim=DIM, model_id=MODEL,
                                        key_check=CHECK, mode=MODE_SEALED)
    answer = httpx.get(f"{live_server.url}/v1/workspaces/{ws}/refs/not-a-ref/tree/root",
                       headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 400 and "malformed ref id" in answer.json()["error"]
    answer = httpx.delete(f"{live_server.url}/v1/workspaces/{ws}/refs/{'A' * 22}",
                          headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 404 and "has no ref" in answer.json()["error"]


def test_a_server_search_workspace_refuses_a_second_ref(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                     mode=MODE_SERVER_SEARCH)
        with pytest.raises(BadRequest, match="keeps one tree") as caught:
            LocalClient(store, "ws", ref=REF_A).root()
        assert caught.value.http_status == 409
        assert LocalClient(store, "ws").root() is None


def test_dropping_a_ref_and_the_gc(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with Store(data, options=StoreOptions(blob_grace_s=3600)) as store:
        LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                     mode=MODE_SEALED)
        a, b = LocalClient(store, "ws", ref=REF_A), LocalClient(store, "ws", ref=REF_B)
        a.apply([sealed_update("x.py", 2), sealed_update("y.py", 3)], [])
        b.apply([link("x.py")], [])
        a.apply([sealed_update("y.py", 1, "2")], [])  # y@1 is named by no ref now
        assert pool_rows(data, "ws") == 2 + 3 + 1  # two refs: it waits out the grace
        assert a.collect_garbage() == {"refs": 0, "blobs": 0, "rows": 0}
        assert a.collect_garbage(grace_s=0) == {"refs": 0, "blobs": 1, "rows": 3}
        assert pool_rows(data, "ws") == 3
        a.drop_ref(REF_A)  # y@2 goes with it (b is left alone, so at once); x.py stays
        assert [r.ref for r in b.refs()] == [REF_B]
        assert pool_rows(data, "ws") == 2
        assert b.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}
        # A ref not synced for N days is dropped, then its blobs after the grace period.
        ws = store.workspace("ws")
        with ws.files.wconn:  # age the ref as if its last sync were 10 days ago
            ws.files.wconn.execute("UPDATE refs SET synced = ?", (time.time() - 10 * 86_400,))
        assert b.collect_garbage(max_ref_age_days=30, grace_s=0)["refs"] == 0
        assert b.collect_garbage(max_ref_age_days=5, grace_s=0) == {
            "refs": 1, "blobs": 0, "rows": 2}
        assert b.refs() == [] and pool_rows(data, "ws") == 0


@pytest.mark.parametrize("steps", [1, 2])
def test_a_crash_in_a_linking_apply_loses_nothing_and_claims_nothing(tmp_path: Path,
                                                                     steps: int) -> None:
    data = tmp_path / "s"
    with Store(data) as store:
        LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                     mode=MODE_SEALED)
        LocalClient(store, "ws", ref=REF_A).apply([sealed_update("x.py", 2)], [])
    killed = Store(data, options=StoreOptions(crash_hook=kill_at(WRITE_POINTS[steps - 1])))
    with pytest.raises(Killed):
        LocalClient(killed, "ws", ref=REF_B).apply([link("x.py"), sealed_update("n.py", 3)],
                                                   [])
    killed.close()
    with Store(data) as store:
        a, b = LocalClient(store, "ws", ref=REF_A), LocalClient(store, "ws", ref=REF_B)
        assert a.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}
        assert b.file_rows([key("x.py"), key("n.py")]) == {key("x.py"): [], key("n.py"): []}
        assert store.workspace("ws").check() == []
        assert b.apply([link("x.py"), sealed_update("n.py", 3)], []) == []
        assert b.file_rows([key("n.py")]) == {key("n.py"): rows_of(sealed_update("n.py", 3))}
        assert store.workspace("ws").check() == []


def _format_3_workspace(data: Path) -> None:
    """A sealed workspace as store format 3 wrote it: one tree, rows grouped by fid."""
    with Store(data) as store:
        c = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL,
                                         key_check=CHECK, mode=MODE_SEALED)
        c.apply([sealed_update("a/x.py", 2), sealed_update("b.py", 3)], [])
        set_dirs(c, [(key("a"), value("a")), (key(""), value("root"))])
    db = sqlite3.connect(data / "workspaces" / "ws" / "tree.sqlite")
    db.executescript(
        "UPDATE nodes SET key = substr(key, 17), parent = substr(parent, 17);"
        " DROP TABLE refs; DROP TABLE blobs; DROP INDEX rows_blob; DROP INDEX nodes_value;"
        " ALTER TABLE rows DROP COLUMN value;"
        " CREATE INDEX rows_fid ON rows (fid); PRAGMA user_version = 3;")
    db.close()
    reg = sqlite3.connect(data / "registry.sqlite")
    reg.execute("PRAGMA user_version = 3")
    reg.close()


def test_a_format_3_workspace_becomes_a_one_ref_workspace(tmp_path: Path) -> None:
    data = tmp_path / "s"
    _format_3_workspace(data)
    with Store(data) as store:
        old = LocalClient(store, "ws")
        assert old.root() is not None and old.root().value == value("root")  # type: ignore[union-attr]
        assert old.file_rows([key("a/x.py"), key("b.py")]) == {
            key("a/x.py"): rows_of(sealed_update("a/x.py", 2)),
            key("b.py"): rows_of(sealed_update("b.py", 3))}
        assert [r.ref for r in old.refs()] == [DEFAULT_REF]
        assert store.workspace("ws").check() == []
        # A client of a ref finds every file in the pool: it links, uploads nothing.
        mine = LocalClient(store, "ws", ref=REF_A)
        assert mine.blob_rows([blob("a/x.py"), blob("b.py")]).missing == []
        assert mine.apply([link("a/x.py"), link("b.py")], []) == []
        mine.drop_ref(DEFAULT_REF)
        assert pool_rows(data, "ws") == 5
        assert [r.ref for r in mine.refs()] == [REF_A]


def test_a_migration_killed_before_its_commit_leaves_format_3(tmp_path: Path) -> None:
    data = tmp_path / "s"
    _format_3_workspace(data)
    tree = data / "workspaces" / "ws" / "tree.sqlite"
    db = sqlite3.connect(tree, isolation_level=None)
    from sync.store.pool import tree_to_4

    db.execute("BEGIN IMMEDIATE")
    tree_to_4(db)  # inside the caller's transaction, which dies before its commit
    db.execute("ROLLBACK")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    assert {len(k) for (k,) in db.execute("SELECT key FROM nodes")} == {16}
    db.close()
    with Store(data) as store:  # the next open migrates it whole
        assert LocalClient(store, "ws").file_rows([key("b.py")]) == {
            key("b.py"): rows_of(sealed_update("b.py", 3))}
