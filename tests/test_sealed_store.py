"""Sealed workspaces (rows of chunk id and envelope only, search on the client) and
`file_rows`, run against both backends over both interfaces: the embedded store and
PostgreSQL, each through `LocalClient` in-process and through `HttpClient` against a real
`python -m sync.server.app` on loopback."""

from __future__ import annotations

import base64
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from sync.client import StoreClient
from sync.records import (
    MODE_SEALED,
    MODE_SERVER_SEARCH,
    ChunkRecord,
    FileUpdate,
)
from sync.store import STORE_FORMAT, Store, StoreOptions
from sync.store.core.backend import StoreBackend
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient
from sync.wire import (
    BadRequest,
    Limits,
    PermissionDenied,
    RefNotFound,
    SealedWorkspaceError,
    StoreError,
    update_to_json,
)
from tests.pg_fixtures import other_database
from tests.server_fixtures import ServerProcess
from tests.test_store import _crash_after, ancestors, key, set_dirs, value

DIM = 8
MODEL = "test-model"
CHECK = b"key-check-123456"


def envelope(path: str, i: int, version: str) -> bytes:
    # Stands in for the AES-GCM envelope of vector and metadata: opaque bytes to the store.
    return f"envelope:{path}#{i}@{version}:".encode() + bytes(range(256))


def sealed_update(path: str, n: int, version: str = "1", marker: bytes = b"") -> FileUpdate:
    return FileUpdate(
        file_key=key(path),
        ancestors=ancestors(path),
        value=value(f"{path}@{version}"),
        chunks=tuple(
            ChunkRecord(key(f"{path}#{i}@{version}"), None, envelope(path, i, version) + marker)
            for i in range(n)
        ),
    )


def vector_update(path: str, n: int, version: str = "1", marker: bytes = b"") -> FileUpdate:
    vectors = np.random.default_rng(n).standard_normal((n, DIM)).astype(np.float32)
    return FileUpdate(
        file_key=key(path),
        ancestors=ancestors(path),
        value=value(f"{path}@{version}"),
        chunks=tuple(
            ChunkRecord(key(f"{path}#{i}@{version}"), v, envelope(path, i, version) + marker)
            for i, v in enumerate(vectors)
        ),
    )


def rows_of(update: FileUpdate) -> list[tuple[bytes, bytes]]:
    return [(c.chunk_id, c.meta) for c in update.chunks]


# -- backends -------------------------------------------------------------------------------


class Backend:
    """Creates workspaces in-process or on a server; `data_dir` holds them either way."""

    def __init__(self, kind: str, data_dir: Path, server: ServerProcess | None = None,
                 *, pg_url: str | None = None) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.server = server
        self.pg_url = pg_url
        self.store: StoreBackend | None = None
        if pg_url is not None:
            from sync.store.postgres.registry import PgStore

            self.store = PgStore(pg_url)
        elif server is None:
            self.store = Store(data_dir)
        self.tokens: dict[str, str] = {}
        self.clients: list[StoreClient] = []

    def create(self, mode: str = MODE_SEALED, workspace_id: str | None = None) -> StoreClient:
        workspace_id = workspace_id or secrets.token_hex(8)
        if self.server is None:
            assert self.store is not None
            client: StoreClient = LocalClient.create_workspace(
                self.store, workspace_id, dim=DIM, model_id=MODEL, key_check=CHECK, mode=mode
            )
        else:
            self.tokens[workspace_id] = HttpClient.create_workspace(
                self.server.url, workspace_id, dim=DIM, model_id=MODEL, key_check=CHECK,
                mode=mode,
            )
            client = HttpClient(self.server.url, workspace_id, self.tokens[workspace_id])
        self.clients.append(client)
        return client

    def on(self, workspace_id: str, ref: bytes) -> StoreClient:
        """A client of `ref`'s tree of the workspace."""
        client: StoreClient
        if self.server is None:
            assert self.store is not None
            client = LocalClient(self.store, workspace_id, ref=ref)
        else:
            client = HttpClient(self.server.url, workspace_id, self.tokens[workspace_id],
                                ref=ref)
        self.clients.append(client)
        return client

    def age_refs(self, workspace_id: str, days: float) -> None:
        """Date every ref's last write `days` back, in the store's own tables."""
        url = self.pg_url or (self.server.store if self.server is not None else None)
        if url is not None:
            import psycopg

            from sync.store.postgres.schema import SCHEMA

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"UPDATE {SCHEMA}.refs SET synced = synced - %s"
                             " WHERE workspace = %s", (days * 86_400, workspace_id))
            return
        with sqlite3.connect(self.data_dir / "workspaces" / workspace_id / "tree.sqlite") as db:
            db.execute("UPDATE refs SET synced = synced - ?", (days * 86_400,))

    def reopen(self, workspace_id: str) -> StoreClient:
        if self.server is None:
            assert self.store is not None
            client: StoreClient = LocalClient(self.store, workspace_id)
        else:
            client = HttpClient(self.server.url, workspace_id, self.tokens[workspace_id])
        self.clients.append(client)
        return client

    def restart(self) -> None:
        if self.server is None:
            assert self.store is not None
            self.store.close()
            if self.pg_url is not None:
                from sync.store.postgres.registry import PgStore

                self.store = PgStore(self.pg_url)
            else:
                self.store = Store(self.data_dir)
        else:
            self.server.restart()

    def close(self) -> None:
        for c in self.clients:
            c.close()
        if self.store is not None:
            self.store.close()


@pytest.fixture(params=["local", "http", "postgres", "postgres-http"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        b = Backend("local", tmp_path / "store")
    elif request.param == "postgres":
        b = Backend("postgres", tmp_path, pg_url=request.getfixturevalue("pg_url"))
    else:
        server = request.getfixturevalue(
            "pg_live_server" if request.param == "postgres-http" else "live_server")
        b = Backend(request.param, server.data_dir, server)
    yield b
    b.close()


# -- round trips ----------------------------------------------------------------------------


def test_a_sealed_workspace_round_trips_apply_and_file_rows(backend: Backend) -> None:
    client = backend.create(MODE_SEALED)
    info = client.info()
    assert (info.mode, info.dim, info.chunks) == (MODE_SEALED, DIM, 0)
    files = {"a/b/one.py": 3, "a/two.py": 2, "top.md": 1, "empty.txt": 0}
    updates = {p: sealed_update(p, n) for p, n in files.items()}
    client.apply(list(updates.values()), [])
    assert client.info().chunks == 6
    assert client.file_rows([key(p) for p in files]) == {
        key(p): rows_of(u) for p, u in updates.items()
    }
    # The tree works as in a server-search workspace: directory values, compare-and-set.
    set_dirs(client, [(key("a/b"), value("dir a/b")), (key("a"), value("dir a")),
                      (key(""), value("root"))])
    root = client.root()
    assert root is not None and root.value == value("root")

    replaced = sealed_update("a/two.py", 4, "2")
    client.apply([replaced], [key("top.md")])
    answer = client.file_rows([key("a/two.py"), key("top.md"), key("a/b/one.py")])
    assert answer == {key("a/two.py"): rows_of(replaced), key("top.md"): [],
                      key("a/b/one.py"): rows_of(updates["a/b/one.py"])}
    assert client.info().chunks == 7


def test_file_rows_in_a_server_search_workspace(backend: Backend) -> None:
    client = backend.create(MODE_SERVER_SEARCH)
    assert client.info().mode == MODE_SERVER_SEARCH
    u = vector_update("src/x.py", 3)
    client.apply([u], [])
    assert client.file_rows([key("src/x.py")]) == {key("src/x.py"): rows_of(u)}
    assert len(client.search(np.zeros(DIM, np.float32), 5)) == 3


def test_file_rows_of_unknown_and_directory_keys_are_empty(backend: Backend) -> None:
    client = backend.create(MODE_SEALED)
    client.apply([sealed_update("d/f.py", 2)], [])
    asked = [key("nope"), key("d"), key(""), key("d/f.py")]
    answer = client.file_rows(asked)
    assert list(answer) == asked
    assert answer[key("nope")] == answer[key("d")] == answer[key("")] == []
    assert len(answer[key("d/f.py")]) == 2
    assert client.file_rows([]) == {}


def test_file_rows_of_a_pending_leaf_are_empty(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL,
                                          key_check=CHECK, mode=MODE_SEALED)
    client.apply([sealed_update("f.py", 2)], [])
    # An apply that died after its first step: the leaf is pending, its old rows remain.
    _crash_after(tmp_path / "s", "ws", [sealed_update("f.py", 3, "2")], [], steps=1)
    assert client.file_rows([key("f.py")]) == {key("f.py"): []}
    client.apply([sealed_update("f.py", 3, "2")], [])
    assert client.file_rows([key("f.py")]) == {key("f.py"): rows_of(sealed_update("f.py", 3, "2"))}
    store.close()


def test_a_long_file_list_is_split_into_bounded_calls(tmp_path: Path) -> None:
    limits = Limits(max_row_files=3, max_row_bytes=600)
    store = Store(tmp_path / "s", options=StoreOptions(limits=limits))
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL,
                                          key_check=CHECK, mode=MODE_SEALED)
    updates = [sealed_update(f"f{i}.py", 2) for i in range(7)]  # ~600 bytes a file
    client.apply(updates, [])
    ws = store.workspace("ws")
    with pytest.raises(BadRequest, match="too many files: 4 > 3"):
        ws.file_rows([u.file_key for u in updates[:4]])
    first = ws.file_rows([u.file_key for u in updates[:3]])
    assert list(first) == [updates[0].file_key]  # past the byte bound: asked again
    before = client.stats.requests
    answer = client.file_rows([u.file_key for u in updates])
    assert answer == {u.file_key: rows_of(u) for u in updates}
    assert client.stats.requests - before == 7
    store.close()


@pytest.mark.parametrize("steps", [1, 2])
def test_a_sealed_apply_killed_after_a_step_leaves_pending_values(tmp_path: Path,
                                                                  steps: int) -> None:
    store = Store(tmp_path / "s")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL,
                                          key_check=CHECK, mode=MODE_SEALED)
    old, gone = sealed_update("a/x.py", 2), sealed_update("b.py", 1)
    client.apply([old, gone], [])
    set_dirs(client, [(key("a"), value("a")), (key(""), value("root"))])
    new = sealed_update("a/x.py", 3, "2")
    _crash_after(tmp_path / "s", "ws", [new], [key("b.py")], steps)
    store.close()  # the process died here; nothing else ran

    store = Store(tmp_path / "s")
    client = LocalClient(store, "ws")
    root = client.root()
    assert root is not None and root.value is None
    kids = client.children([key(""), key("a")])
    assert {n.key: n.value for n in kids[key("")]} == {key("a"): None, key("b.py"): None}
    assert kids[key("a")][0].value is None
    # Pending leaves hand out no rows, whichever rows are stored.
    assert client.file_rows([key("a/x.py"), key("b.py")]) == {key("a/x.py"): [],
                                                              key("b.py"): []}
    stored = {c for _, cids in store.workspace("ws").rows_by_file().values() for c in cids}
    assert stored == {c for c, _ in (rows_of(new) if steps == 2 else rows_of(old) + rows_of(gone))}

    client.apply([new], [key("b.py")])
    assert client.file_rows([key("a/x.py")]) == {key("a/x.py"): rows_of(new)}
    assert client.info().chunks == 3
    assert store.workspace("ws").check() == []
    store.close()


# -- refusals -------------------------------------------------------------------------------


def test_search_on_a_sealed_workspace_is_refused(backend: Backend) -> None:
    client = backend.create(MODE_SEALED)
    with pytest.raises(SealedWorkspaceError, match="is sealed: search runs on the client"):
        client.search(np.zeros(DIM, np.float32), 5)
    if backend.server is not None:
        assert isinstance(client, HttpClient)
        r = httpx.post(
            f"{backend.server.url}/v1/workspaces/{client.workspace_id}/search",
            json={"vector": b64(np.zeros(DIM, "<f4").tobytes()), "k": 5},
            headers={"Authorization": f"Bearer {backend.tokens[client.workspace_id]}"},
        )
        assert r.status_code == 409
        assert r.json()["error"] == (
            f"workspace {client.workspace_id} is sealed: search runs on the client"
        )


def test_rows_of_the_other_mode_are_400s(backend: Backend) -> None:
    sealed = backend.create(MODE_SEALED)
    with pytest.raises(BadRequest, match="is sealed: it stores no vectors") as info:
        sealed.apply([vector_update("f.py", 1)], [])
    assert info.value.http_status == 400
    searched = backend.create(MODE_SERVER_SEARCH)
    with pytest.raises(BadRequest, match="vector is missing") as info:
        searched.apply([sealed_update("f.py", 1)], [])
    assert info.value.http_status == 400
    assert sealed.info().nodes == searched.info().nodes == 0


def test_an_unknown_mode_is_a_400(backend: Backend) -> None:
    with pytest.raises(BadRequest, match="unknown workspace mode 'plain'") as info:
        backend.create("plain")
    assert info.value.http_status == 400


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_the_rows_route_on_the_wire(live_server: ServerProcess) -> None:
    url = live_server.url
    ws = secrets.token_hex(8)
    token = HttpClient.create_workspace(url, ws, dim=DIM, model_id=MODEL, key_check=CHECK,
                                        mode=MODE_SEALED)
    auth = {"Authorization": f"Bearer {token}"}
    rows = f"{url}/v1/workspaces/{ws}/rows"
    u = sealed_update("f.py", 2)
    chunk = update_to_json(u)["chunks"][0]
    assert set(chunk) == {"chunk_id", "meta"}  # a sealed row carries no vector field
    # A create request without a mode (an older client) makes a server-search workspace.
    old = secrets.token_hex(8)
    r = httpx.post(f"{url}/v1/workspaces", json={"dim": DIM, "model_id": MODEL,
                                                 "key_check": b64(CHECK), "workspace_id": old})
    assert r.status_code == 201
    with HttpClient(url, old, r.json()["token"]) as c:
        assert c.info().mode == MODE_SERVER_SEARCH
    with HttpClient(url, ws, token) as c:
        before = c.stats.requests
        c.apply([u], [])
        assert c.file_rows([u.file_key]) == {u.file_key: rows_of(u)}
        assert c.stats.requests - before == 2 and c.stats.bytes_received > 0

    r = httpx.post(rows, json={"files": [b64(u.file_key)]}, headers=auth)
    assert r.status_code == 200
    assert r.json() == {"files": {b64(u.file_key): [[b64(cid), b64(m)] for cid, m in rows_of(u)]}}
    # A null vector is no vector.
    body = update_to_json(sealed_update("g.py", 1))
    body["chunks"][0]["vector"] = None
    r = httpx.post(f"{url}/v1/workspaces/{ws}/apply", json={"updates": [body]}, headers=auth)
    assert r.status_code == 200
    bad = {
        "not base64": ({"files": ["**"]}, "files.0: not base64url"),
        "wrong length": ({"files": [b64(b"short")]}, "files.0: must be 16 bytes, got 5"),
        "too many": ({"files": [b64(key(str(i))) for i in range(2049)]},
                     "files: List should have at most 2048 items"),
        "not a list": ({"files": "x"}, "files: Input should be a valid array"),
        "missing": ({}, "files: Field required"),
    }
    for what, (payload, message) in bad.items():
        r = httpx.post(rows, json=payload, headers=auth)
        assert 400 <= r.status_code < 500, what
        assert message in r.json()["error"], (what, r.json())
    r = httpx.post(rows, content=b"{", headers=auth)
    assert r.status_code == 400


def test_a_token_reads_its_own_workspace_rows_only(live_server: ServerProcess) -> None:
    url = live_server.url
    a, b = secrets.token_hex(8), secrets.token_hex(8)
    tokens = {
        w: HttpClient.create_workspace(url, w, dim=DIM, model_id=MODEL, key_check=CHECK,
                                       mode=MODE_SEALED)
        for w in (a, b)
    }
    with HttpClient(url, a, tokens[a]) as ca:
        ca.apply([sealed_update("secret.py", 1)], [])
    with HttpClient(url, a, tokens[b]) as intruder, pytest.raises(
        PermissionDenied, match="another workspace"
    ):
        intruder.file_rows([key("secret.py")])
    r = httpx.post(f"{url}/v1/workspaces/{a}/rows", json={"files": [b64(key("secret.py"))]})
    assert r.status_code == 401


# -- storage --------------------------------------------------------------------------------


def test_a_sealed_workspace_stores_no_vector_and_no_index(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with LocalClient.create_workspace(data, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                      mode=MODE_SEALED) as client:
        u = sealed_update("f.py", 3)
        client.apply([u], [])
        client.file_rows([key("f.py")])
    folder = data / "workspaces" / "ws"
    # The rows are in tree.sqlite, beside the tree; there is no LanceDB table at all.
    assert sorted(p.name for p in folder.iterdir()) == ["tree.sqlite", "writer.lock"]
    db = sqlite3.connect(folder / "tree.sqlite")
    columns = [(name, kind) for _, name, kind, *_ in db.execute("PRAGMA table_info(rows)")]
    stored = db.execute("SELECT chunk_id, meta FROM rows ORDER BY rid").fetchall()
    db.close()
    # value: the row's blob is (fid, value), one version of one file (sync.store.embedded.pool)
    assert columns == [("rid", "INTEGER"), ("fid", "INTEGER"), ("chunk_id", "BLOB"),
                       ("meta", "BLOB"), ("value", "BLOB")]
    assert stored == rows_of(u)
    with Store(data) as store:
        problems = store.workspace("ws").check()
        store.workspace("ws").verify()
    assert problems == []


@pytest.mark.parametrize("kind", ["local", "http", "postgres-http"])
def test_the_mode_survives_a_restart(
    request: pytest.FixtureRequest, tmp_path: Path,
    server_factory: Callable[..., ServerProcess], kind: str,
) -> None:
    server = None
    if kind == "http":
        server = server_factory(tmp_path / "server-data")
    elif kind == "postgres-http":
        url = other_database(request.getfixturevalue("pg_url"), "codeveil_modes")
        server = server_factory(tmp_path / "replica", store=url)
    b = Backend(kind, tmp_path / "data" if server is None else server.data_dir, server)
    sealed, searched = b.create(MODE_SEALED, "s1"), b.create(MODE_SERVER_SEARCH, "s2")
    u = sealed_update("f.py", 2)
    sealed.apply([u], [])
    searched.apply([vector_update("f.py", 2)], [])
    for c in (sealed, searched):
        c.close()
    b.clients.clear()
    b.restart()
    assert b.reopen("s1").info().mode == MODE_SEALED
    assert b.reopen("s2").info().mode == MODE_SERVER_SEARCH
    assert b.reopen("s1").file_rows([key("f.py")]) == {key("f.py"): rows_of(u)}
    with pytest.raises(SealedWorkspaceError):
        b.reopen("s1").search(np.zeros(DIM, np.float32), 1)
    b.close()


def test_a_registry_from_before_modes_opens_as_server_search(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with LocalClient.create_workspace(data, "old", dim=DIM, model_id=MODEL,
                                      key_check=CHECK) as client:
        client.apply([vector_update("f.py", 2)], [])
    # Format 1: the registry as it was before the mode column, and both files stamped 1.
    db = sqlite3.connect(data / "registry.sqlite")
    db.executescript(
        """
        CREATE TABLE w1 AS SELECT id, token_sha256, dim, model_id, key_check, created_at
            FROM workspaces;
        DROP TABLE workspaces;
        ALTER TABLE w1 RENAME TO workspaces;
        PRAGMA user_version = 1;
        """
    )
    db.close()
    tree = sqlite3.connect(data / "workspaces" / "old" / "tree.sqlite")
    tree.execute("PRAGMA user_version = 1")
    tree.close()
    with Store(data) as store:
        client = LocalClient(store, "old")
        assert client.info().mode == MODE_SERVER_SEARCH
        assert len(client.search(np.zeros(DIM, np.float32), 5)) == 2
        created = LocalClient.create_workspace(store, "new", dim=DIM, model_id=MODEL,
                                               key_check=CHECK, mode=MODE_SEALED)
        assert created.info().mode == MODE_SEALED
    for path in (data / "registry.sqlite", data / "workspaces" / "old" / "tree.sqlite"):
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA user_version").fetchone()[0] == STORE_FORMAT
        db.close()


def _files_holding(folder: Path, marker: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and marker in p.read_bytes()]


@pytest.mark.parametrize("mode", [MODE_SEALED, MODE_SERVER_SEARCH])
def test_superseded_rows_leave_the_data_dir(tmp_path: Path, mode: str) -> None:
    make = sealed_update if mode == MODE_SEALED else vector_update
    data = tmp_path / "s"
    replaced, deleted = b"MARKER-" + secrets.token_bytes(12), b"MARKER-" + secrets.token_bytes(12)
    kept = b"KEPT-" + secrets.token_bytes(12)
    store = Store(data)
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL,
                                          key_check=CHECK, mode=mode)
    # One apply: the first snapshot of a server-search workspace is written by it.
    client.apply([make(f"bulk{i}.py", 3, marker=kept) for i in range(40)]
                 + [make("f.py", 2, marker=replaced), make("g.py", 2, marker=deleted)], [])
    assert _files_holding(data, replaced) and _files_holding(data, deleted)  # not vacuous
    client.apply([make("f.py", 2, "2")], [])  # replaced: rows deleted and added
    client.apply([], [key("g.py")])  # deleted alone: no rows added
    if mode == MODE_SEALED:
        # Not left to the build's default (SQLite's is off; this machine's is on).
        assert store.workspace("ws").files.wconn.execute("PRAGMA secure_delete").fetchone() == (1,)
    # Gone at once, while the store is open: a sealed workspace's log is cut, a
    # server-search one's table purged and its search snapshot (written by the first
    # apply, not due again for a minute) removed.
    assert _files_holding(data, replaced) == []
    assert _files_holding(data, deleted) == []
    client.close()
    store.close()  # a server-search workspace's search snapshot is rewritten here
    assert _files_holding(data, replaced) == []
    assert _files_holding(data, deleted) == []
    assert _files_holding(data, kept)
    with Store(data) as store:
        answer = LocalClient(store, "ws").file_rows([key("f.py"), key("g.py"), key("bulk0.py")])
        assert answer[key("f.py")] == rows_of(make("f.py", 2, "2"))
        assert answer[key("g.py")] == []
        assert len(answer[key("bulk0.py")]) == 3
        assert store.workspace("ws").check() == []


def test_purging_an_emptied_table(tmp_path: Path) -> None:
    data = tmp_path / "s"
    marker = b"MARKER-" + secrets.token_bytes(12)
    with LocalClient.create_workspace(data, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                      mode=MODE_SEALED) as client:
        client.apply([sealed_update("only.py", 2, marker=marker)], [])
        client.apply([], [key("only.py")])
        assert client.info().chunks == 0
    assert _files_holding(data, marker) == []


# -- rows written by store format 2 (in LanceDB) ---------------------------------------------


def write_format_2(data: Path, workspace_id: str, superseded: list[FileUpdate]) -> None:
    """Put a sealed workspace back in the layout of store format 2, as that codeveil left
    it: its rows in a LanceDB table `chunks` (rid, chunk_id, fid, meta), added apply by
    apply, `superseded`'s rows deleted there but not purged (their deletion files kept),
    no rows in tree.sqlite, and both files stamped 2."""
    import lancedb
    import pyarrow as pa

    from sync.store import fid_of
    from sync.store.core.rows import table_schema

    folder = data / "workspaces" / workspace_id
    db = sqlite3.connect(folder / "tree.sqlite")
    rows = db.execute("SELECT rid, chunk_id, fid, meta FROM rows ORDER BY rid").fetchall()
    db.executescript("DROP TABLE rows; PRAGMA user_version = 2;")
    db.close()
    db = sqlite3.connect(data / "registry.sqlite")
    db.execute("PRAGMA user_version = 2")
    db.close()
    schema = table_schema(DIM, MODE_SEALED)
    stale = [(-1 - i, c.chunk_id, fid_of(u.file_key), c.meta)
             for i, (u, c) in enumerate((u, c) for u in superseded for c in u.chunks)]
    table = lancedb.connect(folder).create_table("chunks", schema=schema)
    for batch in (stale, rows[: len(rows) // 2], rows[len(rows) // 2 :]):
        table.add(pa.Table.from_arrays(
            [pa.array([r[0] for r in batch], pa.int64()),
             pa.array([bytes(r[1]) for r in batch], pa.binary()),
             pa.array([r[2] for r in batch], pa.int64()),
             pa.array([bytes(r[3]) for r in batch], pa.binary())], schema=schema))
    table.delete("rid < 0")


def _format_2_workspace(data: Path) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """A sealed workspace in format 2's layout; returns the rows `file_rows` must give."""
    updates = [sealed_update(f"d{i % 3}/f{i}.py", i % 4) for i in range(9)]
    with LocalClient.create_workspace(data, "ws", dim=DIM, model_id=MODEL, key_check=CHECK,
                                      mode=MODE_SEALED) as client:
        client.apply(updates, [])
    write_format_2(data, "ws", [sealed_update("d0/f0.py", 2, "0")])
    assert (data / "workspaces" / "ws" / "chunks.lance").is_dir()
    return {u.file_key: rows_of(u) for u in updates}


def _assert_moved(data: Path, expected: dict[bytes, list[tuple[bytes, bytes]]]) -> None:
    folder = data / "workspaces" / "ws"
    with Store(data) as store:
        client = LocalClient(store, "ws")
        assert client.file_rows(list(expected)) == expected
        assert client.info().chunks == sum(len(r) for r in expected.values())
        assert store.workspace("ws").check() == []
        client.apply([sealed_update("new.py", 2)], [])  # rids go on from the counter
        assert client.info().chunks == sum(len(r) for r in expected.values()) + 2
    assert not (folder / "chunks.lance").exists()
    for path in (data / "registry.sqlite", folder / "tree.sqlite"):
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA user_version").fetchone()[0] == STORE_FORMAT == 4
        db.close()


def test_rows_of_a_format_2_sealed_workspace_move_into_the_tree(tmp_path: Path) -> None:
    data = tmp_path / "s"
    expected = _format_2_workspace(data)
    _assert_moved(data, expected)


_DIE_DURING_MOVE = """
import contextlib, os, sys
import sync.store.embedded.workspace_files as files
from sync.store import Store

@contextlib.contextmanager
def dying(conn):
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    os._exit(9)  # killed with every row inserted, before the commit

def die(*_args, **_kwargs):
    os._exit(9)  # killed after the commit, before the table is removed

if sys.argv[2] == "before-commit":
    files.transaction = dying
else:
    files.shutil.rmtree = die
Store(sys.argv[1]).workspace("ws")
"""


@pytest.mark.parametrize("when", ["before-commit", "before-removal"])
def test_a_move_killed_midway_is_finished_by_the_next_open(tmp_path: Path, when: str) -> None:
    import subprocess
    import sys

    data = tmp_path / "s"
    expected = _format_2_workspace(data)
    root = Path(__file__).resolve().parent.parent
    killed = subprocess.run([sys.executable, "-c", _DIE_DURING_MOVE, str(data), when],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert killed.returncode == 9, killed.stderr
    folder = data / "workspaces" / "ws"
    assert (folder / "chunks.lance").is_dir()  # the table is intact either way
    db = sqlite3.connect(folder / "tree.sqlite")
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert ("rows" in tables) == (when == "before-removal")
    _assert_moved(data, expected)  # moved once: no row twice, none lost


# -- refs and the blob pool (sync.store.embedded.pool, sync.store.postgres.pool) ---------

REF_A = b"A" * 16
REF_B = b"B" * 16


def link(path: str, version: str = "1") -> FileUpdate:
    return FileUpdate(file_key=key(path), ancestors=ancestors(path),
                      value=value(f"{path}@{version}"), link=True)


def blob(path: str, version: str = "1") -> tuple[bytes, bytes]:
    return key(path), value(f"{path}@{version}")


def test_two_refs_keep_their_own_trees_over_one_pool(backend: Backend) -> None:
    ws = backend.create(MODE_SEALED).workspace_id
    a, b = backend.on(ws, REF_A), backend.on(ws, REF_B)
    assert a.info().extra["pool"] is True  # the client syncs refs and links here
    shared, only_a = sealed_update("lib.py", 3), sealed_update("main.py", 2, "a")
    assert a.apply([shared, only_a], []) == []
    # b finds lib.py by its content: the pool holds it, so b links and uploads no row.
    held = b.blob_rows([blob("lib.py"), blob("main.py", "b")])
    assert held.rows == {key("lib.py"): rows_of(shared)} and held.missing == [key("main.py")]
    assert b.blob_rows([blob("lib.py")], rows=False).rows == {key("lib.py"): []}
    only_b = sealed_update("main.py", 4, "b")
    assert b.apply([link("lib.py"), only_b], []) == []
    assert b.info().chunks == 3 + 2 + 4  # lib.py's rows are stored once
    # Each ref reads its own tree; neither disturbed the other's.
    assert a.file_rows([key("main.py")]) == {key("main.py"): rows_of(only_a)}
    assert b.file_rows([key("main.py"), key("lib.py")]) == {
        key("main.py"): rows_of(only_b), key("lib.py"): rows_of(shared)}
    assert {n.value for n in a.children([key("")])[key("")]} != {
        n.value for n in b.children([key("")])[key("")]}
    assert a.root() is not None and b.root() is not None
    assert backend.reopen(ws).root() is None  # the default ref never synced
    refs = {r.ref: r for r in a.refs()}
    assert set(refs) == {REF_A, REF_B}
    assert (refs[REF_A].files, refs[REF_A].rows) == (2, 5)
    assert (refs[REF_B].files, refs[REF_B].rows) == (2, 7)
    # a deletes lib.py: b still names its blob, so nothing of it goes.
    a.apply([], [key("lib.py")])
    assert b.file_rows([key("lib.py")]) == {key("lib.py"): rows_of(shared)}
    assert a.file_rows([key("lib.py")]) == {key("lib.py"): []}
    # Directory values are set per ref, each over its own children.
    set_dirs(a, [(key(""), value("root a"))])
    assert a.root().value == value("root a")  # type: ignore[union-attr]
    assert b.root().value is None  # type: ignore[union-attr]


def test_a_link_to_a_blob_the_pool_lacks_stays_pending(backend: Backend) -> None:
    a = backend.on(backend.create(MODE_SEALED).workspace_id, REF_A)
    a.apply([sealed_update("x.py", 1)], [])
    set_dirs(a, [(key(""), value("root"))])
    assert a.apply([link("ghost.py"), link("x.py")], []) == [key("ghost.py")]
    kids = {n.key: n.value for n in a.children([key("")])[key("")]}
    assert kids[key("ghost.py")] is None  # never claims a blob the pool lacks
    assert kids[key("x.py")] == value("x.py@1")  # a link to a held blob is set
    assert a.root() is not None and a.root().value is None  # type: ignore[union-attr]
    assert a.file_rows([key("ghost.py")]) == {key("ghost.py"): []}
    assert a.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 1))}


def test_bad_refs_are_refused(backend: Backend) -> None:
    ws = backend.create(MODE_SEALED).workspace_id
    a = backend.on(ws, REF_A)
    with pytest.raises(RefNotFound):
        a.drop_ref(REF_B)
    with pytest.raises(StoreError):
        backend.on(ws, b"short").root()
    with pytest.raises(BadRequest, match="carries no chunks"):
        a.apply([FileUpdate(key("f.py"), ancestors("f.py"), value("v"),
                            sealed_update("f.py", 1).chunks, link=True)], [])
    assert a.info().nodes == 0


def test_a_server_search_workspace_refuses_a_second_ref(backend: Backend) -> None:
    ws = backend.create(MODE_SERVER_SEARCH).workspace_id
    # (over HTTP a 409 of a tree route comes back as a StoreError of that status)
    with pytest.raises(StoreError, match="keeps one tree") as caught:
        backend.on(ws, REF_A).root()
    assert caught.value.http_status == 409
    assert backend.server is not None or isinstance(caught.value, BadRequest)
    with pytest.raises(StoreError, match="no blob pool") as caught:
        backend.reopen(ws).blob_rows([blob("x.py")])
    assert caught.value.http_status == 409
    assert "pool" not in backend.reopen(ws).info().extra
    assert backend.reopen(ws).root() is None


def test_dropping_a_ref_and_the_gc(backend: Backend) -> None:
    ws = backend.create(MODE_SEALED).workspace_id
    a, b = backend.on(ws, REF_A), backend.on(ws, REF_B)
    a.apply([sealed_update("x.py", 2), sealed_update("y.py", 3)], [])
    b.apply([link("x.py")], [])
    a.apply([sealed_update("y.py", 1, "2")], [])  # y@1 is named by no ref now
    assert a.info().chunks == 2 + 3 + 1  # two refs: it waits out the grace (an hour)
    assert a.collect_garbage() == {"refs": 0, "blobs": 0, "rows": 0}
    assert a.collect_garbage(grace_s=0) == {"refs": 0, "blobs": 1, "rows": 3}
    assert a.info().chunks == 3
    a.drop_ref(REF_A)  # y@2 goes with it (b is left alone, so at once); x.py stays
    assert [r.ref for r in b.refs()] == [REF_B]
    assert b.info().chunks == 2
    assert b.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}
    # A ref not synced for N days is dropped, then its blobs after the grace period.
    backend.age_refs(ws, 10)
    assert b.collect_garbage(max_ref_age_days=30, grace_s=0)["refs"] == 0
    assert b.collect_garbage(max_ref_age_days=5, grace_s=0) == {
        "refs": 1, "blobs": 0, "rows": 2}
    assert b.refs() == [] and b.info().chunks == 0 and b.info().nodes == 0
    with pytest.raises(BadRequest, match="grace_s"):
        b.collect_garbage(grace_s=-1)


def test_an_orphaned_blob_is_named_again_before_the_gc(backend: Backend) -> None:
    ws = backend.create(MODE_SEALED).workspace_id
    a, b = backend.on(ws, REF_A), backend.on(ws, REF_B)
    a.apply([sealed_update("x.py", 2)], [])
    b.apply([link("x.py")], [])
    a.apply([], [key("x.py")])
    b.apply([], [key("x.py")])  # x@1 is orphaned: no ref names it
    assert a.apply([link("x.py")], []) == []  # within the grace, a link takes it back
    assert a.collect_garbage(grace_s=0) == {"refs": 0, "blobs": 0, "rows": 0}
    assert a.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}


def test_a_blob_sent_again_keeps_one_copy_of_its_rows(backend: Backend) -> None:
    ws = backend.create(MODE_SEALED).workspace_id
    a, b = backend.on(ws, REF_A), backend.on(ws, REF_B)
    a.apply([sealed_update("x.py", 3)], [])
    again = sealed_update("x.py", 3, marker=b"again")  # the same blob, uploaded by b
    assert b.apply([again], []) == []
    assert a.info().chunks == 3  # its rows replaced, not added
    assert a.file_rows([key("x.py")]) == b.file_rows([key("x.py")]) == {
        key("x.py"): rows_of(again)}


def _in_process(kind: str, tmp_path: Path, pg_url: Callable[[], str],
                hook: Callable[[str], None] | None = None) -> StoreBackend:
    if kind == "postgres":
        from sync.store.postgres.options import PgOptions
        from sync.store.postgres.registry import PgStore

        return PgStore(pg_url(), options=PgOptions(crash_hook=hook))
    return Store(tmp_path / "s", options=StoreOptions(crash_hook=hook))


@pytest.mark.parametrize("kind", ["local", "postgres"])
@pytest.mark.parametrize("steps", [1, 2])
def test_a_crash_in_a_linking_apply_loses_nothing_and_claims_nothing(
        request: pytest.FixtureRequest, tmp_path: Path, kind: str, steps: int) -> None:
    """Killed after step 1 or 2 of its write order (the embedded store keeps those steps;
    PostgreSQL rolls its one transaction back), a ref's apply of a link and an upload."""
    from sync.store.embedded.options import WRITE_POINTS
    from tests.test_store import Killed, kill_at

    def url() -> str:
        return str(request.getfixturevalue("pg_url"))

    ws = secrets.token_hex(8)
    with _in_process(kind, tmp_path, url) as store:
        LocalClient.create_workspace(store, ws, dim=DIM, model_id=MODEL, key_check=CHECK,
                                     mode=MODE_SEALED)
        LocalClient(store, ws, ref=REF_A).apply([sealed_update("x.py", 2)], [])
    killed = _in_process(kind, tmp_path, url, kill_at(WRITE_POINTS[steps - 1]))
    with pytest.raises(Killed):
        LocalClient(killed, ws, ref=REF_B).apply([link("x.py"), sealed_update("n.py", 3)], [])
    killed.close()
    with _in_process(kind, tmp_path, url) as store:
        a, b = LocalClient(store, ws, ref=REF_A), LocalClient(store, ws, ref=REF_B)
        assert a.file_rows([key("x.py")]) == {key("x.py"): rows_of(sealed_update("x.py", 2))}
        assert b.file_rows([key("x.py"), key("n.py")]) == {key("x.py"): [], key("n.py"): []}
        assert store.workspace(ws).check() == []
        assert b.apply([link("x.py"), sealed_update("n.py", 3)], []) == []
        assert b.file_rows([key("n.py")]) == {key("n.py"): rows_of(sealed_update("n.py", 3))}
        assert store.workspace(ws).check() == []
