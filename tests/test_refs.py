"""Refs and the blob pool of the embedded store (sync.store.embedded.pool) beyond the contract
that tests/test_sealed_store.py runs on both backends: a malformed ref on the wire and
the migration of a one-tree data dir (store format 3 -> 4)."""

from __future__ import annotations

import secrets
import sqlite3
from pathlib import Path

from sync.records import DEFAULT_REF, MODE_SEALED
from sync.store import Store
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient
from tests.test_sealed_store import CHECK, DIM, MODEL, REF_A, blob, link, rows_of, sealed_update
from tests.test_store import key, set_dirs, value


def pool_rows(data: Path, workspace_id: str) -> int:
    with sqlite3.connect(data / "workspaces" / workspace_id / "tree.sqlite") as db:
        return int(db.execute("SELECT COUNT(*) FROM rows").fetchone()[0])


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
    from sync.store.embedded.pool import tree_to_4

    db.execute("BEGIN IMMEDIATE")
    tree_to_4(db)  # inside the caller's transaction, which dies before its commit
    db.execute("ROLLBACK")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    assert {len(k) for (k,) in db.execute("SELECT key FROM nodes")} == {16}
    db.close()
    with Store(data) as store:  # the next open migrates it whole
        assert LocalClient(store, "ws").file_rows([key("b.py")]) == {
            key("b.py"): rows_of(sealed_update("b.py", 3))}
