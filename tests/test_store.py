"""The store contract (sync.store.core.backend), run against both backends over both
interfaces: the embedded store and PostgreSQL, each through `LocalClient` (in-process)
and through `HttpClient` against a real `python -m sync.server.app --data DIR | --store URL`
on loopback. Crash tests drive the embedded store's write steps one by one in-process
(and kill a PostgreSQL writer inside its transaction), then look at the result through
each interface."""

from __future__ import annotations

import hashlib
import random
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from sync.client import StoreClient
from sync.records import ChunkRecord, DirValue, FileUpdate, NodeInfo, children_digest
from sync.store import Store, StoreOptions
from sync.store.core.backend import StoreBackend
from sync.store.embedded.options import WRITE_POINTS
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient
from sync.wire import BadRequest
from tests.pg_fixtures import other_database
from tests.server_fixtures import ServerProcess

DIM = 8
MODEL = "test-model"
CHECK = b"key-check-123456"


# -- a tiny client-side tree: names stand in for the client's keyed hashes ------------------


def key(path: str) -> bytes:
    return hashlib.sha256(b"key:" + path.encode()).digest()[:16]


def value(text: str) -> bytes:
    return hashlib.sha256(b"value:" + text.encode()).digest()[:16]


def ancestors(path: str) -> tuple[bytes, ...]:
    """Keys of the directories above `path`, the root ("") first."""
    parts = path.split("/")[:-1]
    return tuple(key("/".join(parts[:i])) for i in range(len(parts) + 1))


def meta(path: str, i: int, version: str) -> bytes:
    return f"sealed:{path}#{i}@{version}".encode()


def update(path: str, vectors: np.ndarray, version: str = "1") -> FileUpdate:
    return FileUpdate(
        file_key=key(path),
        ancestors=ancestors(path),
        value=value(f"{path}@{version}"),
        chunks=tuple(
            ChunkRecord(key(f"{path}#{i}@{version}"), v.astype(np.float32), meta(path, i, version))
            for i, v in enumerate(vectors)
        ),
    )


def rand(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def metas_found(client: StoreClient, k: int = 1000) -> set[bytes]:
    return {h.meta for h in client.search(np.zeros(DIM, np.float32), k)}


def by_key(nodes: list[NodeInfo]) -> dict[bytes, NodeInfo]:
    return {n.key: n for n in nodes}


PENDING_HERE = value("a child the client knows but the store holds pending")


def set_dirs(client: StoreClient, pairs: list[tuple[bytes, bytes]]) -> None:
    """Send directory values as a client whose tree agrees with the store's leaves would:
    each with the digest of its children's values (those set in the same call included)."""
    given = dict(pairs)
    kids = client.children(list(given))
    client.set_dir_values([
        DirValue(k, v, children_digest(
            (n.key, given.get(n.key, n.value if n.value is not None else PENDING_HERE))
            for n in kids[k]
        ))
        for k, v in pairs
    ])


# -- backends -------------------------------------------------------------------------------


class _InProcess:
    """A store run in this process, through `LocalClient`."""

    store: StoreBackend

    def create(self, dim: int = DIM, workspace_id: str | None = None) -> StoreClient:
        return LocalClient.create_workspace(
            self.store, workspace_id, dim=dim, model_id=MODEL, key_check=CHECK
        )

    def reopen(self, client: StoreClient) -> StoreClient:
        assert isinstance(client, LocalClient)
        return LocalClient(self.store, client.workspace_id)

    def close(self) -> None:
        self.store.close()


class LocalBackend(_InProcess):
    kind = "local"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.store = Store(data_dir)

    def stop(self) -> None:
        self.store.close()

    def start(self) -> None:
        self.store = Store(self.data_dir)


class PgBackend(_InProcess):
    """The store in PostgreSQL (sync.store.postgres)."""

    kind = "postgres"

    def __init__(self, url: str) -> None:
        from sync.store.postgres.registry import PgStore

        self.url = url
        self.store = PgStore(url)


class HttpBackend:
    """A store behind a real server: `kind` "http" serves a data dir, "postgres-http" a
    PostgreSQL database (the server's `store`)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.kind = "http" if server.store is None else "postgres-http"
        self.tokens: dict[str, str] = {}
        self.clients: list[HttpClient] = []

    def create(self, dim: int = DIM, workspace_id: str | None = None) -> StoreClient:
        workspace_id = workspace_id or secrets.token_hex(8)
        token = HttpClient.create_workspace(
            self.server.url, workspace_id, dim=dim, model_id=MODEL, key_check=CHECK
        )
        self.tokens[workspace_id] = token
        return self._client(workspace_id)

    def reopen(self, client: StoreClient) -> StoreClient:
        assert isinstance(client, HttpClient)
        return self._client(client.workspace_id)

    @property
    def data_dir(self) -> Path:
        return self.server.data_dir

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def _client(self, workspace_id: str) -> HttpClient:
        client = HttpClient(self.server.url, workspace_id, self.tokens[workspace_id])
        self.clients.append(client)
        return client


Backend = LocalBackend | HttpBackend | PgBackend


@pytest.fixture(params=["local", "http", "postgres", "postgres-http"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        b: Backend = LocalBackend(tmp_path / "store")
    elif request.param == "postgres":
        b = PgBackend(request.getfixturevalue("pg_url"))
    elif request.param == "postgres-http":
        b = HttpBackend(request.getfixturevalue("pg_live_server"))
    else:
        b = HttpBackend(request.getfixturevalue("live_server"))
    yield b
    b.close()


@pytest.fixture(params=["local", "http", "postgres-http"])
def restartable(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    server_factory: Callable[..., ServerProcess],
) -> Iterator[Backend]:
    """Like `backend`, with a server of the test's own, which it may stop and start (on
    PostgreSQL, a replica of its own on a database of its own)."""
    if request.param == "local":
        b: Backend = LocalBackend(tmp_path / "store")
    elif request.param == "postgres-http":
        url = other_database(request.getfixturevalue("pg_url"), "codeveil_restarted")
        b = HttpBackend(server_factory(tmp_path / "replica", store=url))
    else:
        b = HttpBackend(server_factory(tmp_path / "server-data"))
    yield b
    b.close()


# -- round trips ----------------------------------------------------------------------------


def test_empty_workspace(backend: Backend) -> None:
    client = backend.create()
    info = client.info()
    assert (info.dim, info.model_id, info.key_check) == (DIM, MODEL, CHECK)
    assert (info.chunks, info.nodes) == (0, 0)
    assert info.extra["limits"]["max_k"] == 1000
    assert client.root() is None
    assert client.children([key("")]) == {key(""): []}
    assert client.search(np.ones(DIM, np.float32), 5) == []
    assert client.stats.requests == 4


def test_apply_children_root_search_round_trip(backend: Backend) -> None:
    client = backend.create()
    files = {"a/b/one.py": rand(3, 1), "a/two.py": rand(2, 2), "top.md": rand(1, 3)}
    client.apply([update(p, v) for p, v in files.items()], [])

    root = client.root()
    assert root is not None and root.key == key("") and root.is_dir
    assert root.value is None  # pending until the client sets directory values
    kids = client.children([key(""), key("a"), key("a/b"), key("nope")])
    assert set(by_key(kids[key("")])) == {key("a"), key("top.md")}
    assert set(by_key(kids[key("a")])) == {key("a/b"), key("a/two.py")}
    leaf = by_key(kids[key("a/b")])[key("a/b/one.py")]
    assert leaf == NodeInfo(key("a/b/one.py"), value("a/b/one.py@1"), False)
    assert kids[key("nope")] == []
    assert by_key(kids[key("")])[key("a")].is_dir

    info = client.info()
    assert (info.chunks, info.nodes) == (6, 6)
    for path, vectors in files.items():
        for i, v in enumerate(vectors):
            hit = client.search(v, 1)[0]
            assert hit.meta == meta(path, i, "1")
            assert hit.chunk_id == key(f"{path}#{i}@1")
            assert hit.distance == pytest.approx(0.0, abs=1e-3)


def test_directory_values_wait_for_pending_children(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("a/x.py", rand(1, 1)), update("y.py", rand(1, 2))], [])
    set_dirs(client, [(key("a"), value("dir a")), (key(""), value("root")),
                           (key("ghost"), value("unknown keys are ignored"))])
    assert client.root() == NodeInfo(key(""), value("root"), True)

    # A new file marks its path pending; the root cannot be set while "b" is pending,
    # whatever the order of the pairs.
    client.apply([update("b/z.py", rand(1, 3))], [])
    assert client.root().value is None
    set_dirs(client, [(key(""), value("root 2"))])
    assert client.root().value is None
    set_dirs(client, [(key(""), value("root 2")), (key("b"), value("dir b"))])
    assert client.root().value == value("root 2")
    assert by_key(client.children([key("")])[key("")])[key("a")].value == value("dir a")


def test_directory_values_are_set_only_over_the_children_they_came_from(
    backend: Backend,
) -> None:
    client = backend.create()
    client.apply([update("a/x.py", rand(1, 1), "mine"), update("y.py", rand(1, 2))], [])
    # A teammate replaced a/x.py after this value was computed over "mine".
    client.apply([update("a/x.py", rand(1, 3), "theirs")], [])
    mine = [(key("a/x.py"), value("a/x.py@mine"))]
    client.set_dir_values([DirValue(key("a"), value("dir a, mine"), children_digest(mine))])
    assert by_key(client.children([key("")])[key("")])[key("a")].value is None
    # The same value over the children the store does hold is taken.
    theirs = [(key("a/x.py"), value("a/x.py@theirs"))]
    client.set_dir_values([DirValue(key("a"), value("dir a"), children_digest(theirs))])
    assert by_key(client.children([key("")])[key("")])[key("a")].value == value("dir a")
    # A root claiming a child the store lacks (or missing one it has) is refused.
    only_a = [(key("a"), value("dir a"))]
    client.set_dir_values([DirValue(key(""), value("root"), children_digest(only_a))])
    assert client.root().value is None
    both = [*only_a, (key("y.py"), value("y.py@1"))]
    client.set_dir_values([DirValue(key(""), value("root"), children_digest(both))])
    assert client.root().value == value("root")
    with pytest.raises(BadRequest, match=r"triple|values\.0\.2"):
        client.set_dir_values([(key(""), value("root"))])  # type: ignore[list-item]


@pytest.mark.parametrize("order", ["children first", "parent first"])
def test_a_directory_value_is_checked_after_the_values_the_call_gives_its_children(
    backend: Backend, order: str
) -> None:
    """A pending root, and a call that sets its child "a" anew and the root over a's
    old value: the root is checked against a as the call leaves it, so it stays pending
    rather than claim a child the store no longer holds."""
    client = backend.create()
    client.apply([update("a/x.py", rand(1, 1)), update("y.py", rand(1, 2))], [])
    set_dirs(client, [(key("a"), value("a")), (key(""), value("root"))])
    client.apply([update("y.py", rand(1, 3), "2")], [])  # the root is pending again
    child = DirValue(key("a"), value("a, again"),
                     children_digest([(key("a/x.py"), value("a/x.py@1"))]))
    parent = DirValue(key(""), value("root over the old a"), children_digest(
        [(key("a"), value("a")), (key("y.py"), value("y.py@2"))]))
    client.set_dir_values([child, parent] if order == "children first" else [parent, child])
    assert by_key(client.children([key("")])[key("")])[key("a")].value == value("a, again")
    assert client.root().value is None


def test_replacing_a_file_replaces_its_chunks(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("f.py", rand(3, 1), "1"), update("g.py", rand(2, 2))], [])
    client.apply([update("f.py", rand(2, 9), "2")], [])
    found = metas_found(client)
    assert {meta("f.py", i, "2") for i in range(2)} <= found
    assert not any(m.startswith(b"sealed:f.py#") and m.endswith(b"@1") for m in found)
    assert client.info().chunks == 4
    leaf = by_key(client.children([key("")])[key("")])[key("f.py")]
    assert leaf.value == value("f.py@2")
    # A file whose new version has no chunks keeps its leaf and loses its rows.
    client.apply([update("f.py", rand(0, 0), "3")], [])
    assert client.info().chunks == 2
    assert by_key(client.children([key("")])[key("")])[key("f.py")].value == value("f.py@3")


def test_deleting_a_file_and_a_subtree_removes_their_chunks(backend: Backend) -> None:
    client = backend.create()
    paths = ["keep.py", "src/a.py", "src/lib/b.py", "src/lib/deep/c.py", "src/d.py"]
    client.apply([update(p, rand(2, i)) for i, p in enumerate(paths)], [])
    set_dirs(client, [(key("src/lib/deep"), value("1")), (key("src/lib"), value("2")),
                           (key("src"), value("3")), (key(""), value("4"))])

    client.apply([], [key("src/d.py")])
    assert key("src/d.py") not in by_key(client.children([key("src")])[key("src")])
    assert client.root().value is None  # the path above a delete is pending
    assert by_key(client.children([key("src")])[key("src")])[key("src/lib")].value == value("2")

    client.apply([], [key("src/lib")])
    kids = client.children([key("src"), key("src/lib"), key("src/lib/deep")])
    assert set(by_key(kids[key("src")])) == {key("src/a.py")}
    assert kids[key("src/lib")] == [] and kids[key("src/lib/deep")] == []
    found = metas_found(client)
    assert found == {meta(p, i, "1") for p in ("keep.py", "src/a.py") for i in range(2)}
    assert client.info().nodes == 4  # root, keep.py, src, src/a.py

    client.apply([], [key("")])  # the client's tree became empty
    assert client.root() is None
    assert client.search(np.zeros(DIM, np.float32), 10) == []
    assert client.info().nodes == 0


def test_deleting_unknown_keys_is_a_no_op(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("a.py", rand(1, 1))], [])
    client.apply([], [key("never"), key("never")])
    assert client.info().chunks == 1


def test_file_becomes_directory_and_back(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("x", rand(2, 1))], [])
    # As the client's diff sends it: delete the node, upload what is now below it.
    client.apply([update("x/inner.py", rand(1, 2))], [key("x")])
    node = by_key(client.children([key("")])[key("")])[key("x")]
    assert node.is_dir and node.value is None
    assert set(by_key(client.children([key("x")])[key("x")])) == {key("x/inner.py")}
    assert metas_found(client) == {meta("x/inner.py", 0, "1")}

    # And back, without the delete this time: the store drops the old subtree itself.
    client.apply([update("x", rand(1, 3), "2")], [])
    node = by_key(client.children([key("")])[key("")])[key("x")]
    assert not node.is_dir and node.value == value("x@2")
    assert client.children([key("x")])[key("x")] == []
    assert metas_found(client) == {meta("x", 0, "2")}
    assert client.info().nodes == 2


def test_same_chunk_id_in_two_files(backend: Backend) -> None:
    # Chunk ids are the client's business; rows of one file never take another's along.
    client = backend.create()
    same = ChunkRecord(key("shared"), rand(1, 1)[0], b"m")
    for name in ("one.py", "two.py"):
        client.apply([FileUpdate(key(name), ancestors(name), value(name), (same,))], [])
    client.apply([], [key("one.py")])
    hits = client.search(same.vector, 5)
    assert [h.chunk_id for h in hits] == [key("shared")]


def test_reapplying_a_batch_is_harmless(backend: Backend) -> None:
    client = backend.create()
    batch = [update("a/x.py", rand(3, 1)), update("b.py", rand(2, 2))]
    client.apply(batch, [])
    client.apply(batch, [])
    assert client.info().chunks == 5
    assert len(client.search(np.zeros(DIM, np.float32), 100)) == 5


def test_the_root_key_is_fixed(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("a.py", rand(1, 1))], [])
    stranger = FileUpdate(key("b.py"), (key("another root"),), value("b"), ())
    with pytest.raises(BadRequest, match="root"):
        client.apply([stranger], [])
    assert client.info().nodes == 2


# -- search ---------------------------------------------------------------------------------


def test_search_equals_brute_force(backend: Backend) -> None:
    client = backend.create(dim=16)
    rng = np.random.default_rng(7)
    rows: list[tuple[bytes, np.ndarray]] = []
    updates = []
    for f in range(30):
        vecs = rng.standard_normal((10, 16)).astype(np.float32)
        u = FileUpdate(
            key(f"f{f}"), (key(""),), value(f"f{f}"),
            tuple(ChunkRecord(key(f"f{f}#{i}"), v, b"m%d" % i) for i, v in enumerate(vecs)),
        )
        updates.append(u)
        rows += [(c.chunk_id, c.vector) for c in u.chunks]
    client.apply(updates, [])
    client.apply([], [key("f3")])  # removals must be reflected too
    rows = [(c, v) for c, v in rows if not any(c == key(f"f3#{i}") for i in range(10))]
    ids = [c for c, _ in rows]
    matrix = np.stack([v for _, v in rows])
    for q in rng.standard_normal((5, 16)):
        expected = np.sqrt(((matrix - q.astype(np.float32)) ** 2).sum(axis=1))
        order = np.argsort(expected, kind="stable")[:25]
        hits = client.search(q, 25)
        assert [h.chunk_id for h in hits] == [ids[i] for i in order]
        assert [h.distance for h in hits] == pytest.approx(expected[order].tolist(), rel=1e-4)


def test_k_bounds(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("a.py", rand(5, 1))], [])
    assert len(client.search(np.zeros(DIM), 1000)) == 5  # k above the row count
    for k in (0, -1, 1001):
        with pytest.raises(BadRequest, match="k must be between 1 and 1000"):
            client.search(np.zeros(DIM), k)


def test_huge_finite_vectors_are_refused_not_silently_dropped(backend: Backend) -> None:
    client = backend.create()
    client.apply([update("a.py", rand(3, 1))], [])
    with pytest.raises(BadRequest, match=r"norm .* over the limit"):
        client.search(np.full(DIM, 1e20, np.float32), 3)
    # Within the bound every neighbour comes back, however far.
    assert len(client.search(np.full(DIM, 1e8, np.float32), 3)) == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: update("a.py", rand(1, 1, dim=DIM + 1)), "8 values"),
        (lambda: update("a.py", np.full((1, DIM), np.nan)), "NaN or infinite"),
        (  # beyond float32's range
            lambda: FileUpdate(key("a"), (key(""),), value("v"),
                               (ChunkRecord(key("c"), np.full(DIM, 1e39), b"m"),)),
            "NaN or infinite",
        ),
        (  # finite, but its squared distances overflow float32
            lambda: update("a.py", np.full((1, DIM), 1e20, np.float32)),
            "norm 2.83e\\+20, over the limit",
        ),
        (lambda: FileUpdate(b"short", (key(""),), value("v")), "16 bytes"),
        (lambda: FileUpdate(key("a"), (), value("v")), "ancestors"),
        (lambda: FileUpdate(key("a"), (key(""), key("")), value("v")), "appears twice"),
    ],
)
def test_bad_updates_are_refused_alike(
    backend: Backend, make: Callable[[], FileUpdate], message: str
) -> None:
    client = backend.create()
    with pytest.raises(BadRequest, match=message):
        client.apply([make()], [])
    assert client.info().nodes == 0


# -- restarts and crashes ---------------------------------------------------------------


class Killed(BaseException):
    """The process dies here (a BaseException, as no `except Exception` catches a kill)."""


def kill_at(point: str) -> Callable[[str], None]:
    """A `StoreOptions.crash_hook` that stops an apply at `point` of its write order."""
    assert point in WRITE_POINTS, point

    def hook(reached: str) -> None:
        if reached == point:
            raise Killed(point)

    return hook


def _crash_after(data_dir: Path, workspace_id: str, updates: list[FileUpdate],
                 deletes: list[bytes], steps: int) -> None:
    """Run the first `steps` write steps of an apply, then stop as a killed process would."""
    store = Store(data_dir, options=StoreOptions(crash_hook=kill_at(WRITE_POINTS[steps - 1])))
    with pytest.raises(Killed):
        LocalClient(store, workspace_id).apply(updates, deletes)
    store.close()


@pytest.mark.parametrize("steps", [1, 2])
def test_crash_mid_apply_leaves_pending_values_then_converges(tmp_path: Path, steps: int) -> None:
    store = Store(tmp_path / "store")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    client.apply([update("a/x.py", rand(2, 1), "1"), update("b.py", rand(1, 2))], [])
    set_dirs(client, [(key("a"), value("a")), (key(""), value("root"))])

    _crash_after(tmp_path / "store", "ws", [update("a/x.py", rand(3, 3), "2")], [], steps)
    store.close()  # the process died here; nothing else ran

    store = Store(tmp_path / "store")
    client = LocalClient(store, "ws")
    # Every node on the path is pending: none claims content, old or new.
    assert client.root().value is None
    assert by_key(client.children([key("")])[key("")])[key("a")].value is None
    assert client.children([key("a")])[key("a")][0].value is None
    assert by_key(client.children([key("")])[key("")])[key("b.py")].value == value("b.py@1")
    found = metas_found(client)
    new = {meta("a/x.py", i, "2") for i in range(3)}
    old = {meta("a/x.py", i, "1") for i in range(2)}
    assert (new <= found) == (steps == 2) and (old <= found) == (steps == 1)

    # The next sync re-sends what the pending path leads to, and all converges.
    client.apply([update("a/x.py", rand(3, 3), "2")], [])
    set_dirs(client, [(key("a"), value("a2")), (key(""), value("root2"))])
    assert client.root().value == value("root2")
    assert metas_found(client) == new | {meta("b.py", 0, "1")}
    assert client.info().chunks == 4
    store.close()


def test_crash_mid_delete_keeps_nodes_pending_then_converges(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    client.apply([update("d/x.py", rand(2, 1)), update("d/e/y.py", rand(2, 2)),
                  update("z.py", rand(1, 3))], [])
    set_dirs(client, [(key("d/e"), value("e")), (key("d"), value("d")),
                           (key(""), value("r"))])
    _crash_after(tmp_path / "store", "ws", [], [key("d")], steps=2)
    store.close()

    store = Store(tmp_path / "store")
    client = LocalClient(store, "ws")
    # The rows are gone, so every node of the subtree must be pending (a client that
    # restored the folder must not find its old leaves matching).
    kids = client.children([key(""), key("d"), key("d/e")])
    assert all(n.value is None for k in (key("d"), key("d/e")) for n in kids[k])
    assert by_key(kids[key("")])[key("d")].value is None
    assert client.root().value is None
    assert metas_found(client) == {meta("z.py", 0, "1")}
    client.apply([], [key("d")])
    assert set(by_key(client.children([key("")])[key("")])) == {key("z.py")}
    assert client.info().nodes == 2
    store.close()


def test_failing_row_write_leaves_pending_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "store")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    client.apply([update("a.py", rand(2, 1))], [])
    ws = store.workspace("ws")

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError("no space left on device")

    # Fault injection: step 2's LanceDB add fails after its delete went through.
    monkeypatch.setattr(ws.rows.index.table.handle, "add", disk_full)
    with pytest.raises(OSError, match="no space"):
        client.apply([update("a.py", rand(3, 2), "2")], [])
    monkeypatch.undo()
    leaf = client.children([key("")])[key("")][0]
    assert leaf.value is None
    assert client.search(np.zeros(DIM), 10) == []  # index rebuilt from what LanceDB holds
    client.apply([update("a.py", rand(3, 2), "2")], [])
    assert client.children([key("")])[key("")][0].value == value("a.py@2")
    assert client.info().chunks == 3
    store.close()


def _pg_crash_mid_apply(url: str, workspace_id: str, updates: list[FileUpdate]) -> None:
    """Stop an apply inside its transaction once its rows are replaced (its crash hook,
    PgOptions.crash_hook), as a killed replica stops: the database rolls it back.
    Meanwhile every other reader sees the last committed state."""
    from sync.store.postgres.options import PgOptions
    from sync.store.postgres.registry import PgStore

    with PgStore(url) as reader:
        before = reader.workspace(workspace_id).root()
        seen: list[NodeInfo | None] = []

        def hook(point: str) -> None:
            if point == "rows":
                seen.append(reader.workspace(workspace_id).root())
                raise Killed(point)

        with PgStore(url, options=PgOptions(crash_hook=hook)) as store, pytest.raises(Killed):
            store.workspace(workspace_id).apply(updates, [])
        assert seen == [before]  # no reader sees half an apply


def crash_mid_apply(backend: Backend, workspace_id: str, updates: list[FileUpdate]) -> bool:
    """While the store is down, a writer dies partway through an apply of `updates`.
    True if what it wrote stays (the embedded store's committed first step), False if the
    store undid it (PostgreSQL rolls back the transaction of a dead connection)."""
    if isinstance(backend, HttpBackend) and backend.server.store is not None:
        _pg_crash_mid_apply(backend.server.store, workspace_id, updates)
        return False
    _crash_after(backend.data_dir, workspace_id, updates, [], steps=1)
    return True


def test_restart_after_a_crash_mid_apply(restartable: Backend) -> None:
    """Data survives a restart; a crash state written while the store was down is served
    as it must be: pending (None) values on the path of the embedded store's half-done
    apply, the last committed state on PostgreSQL; the next sync converges."""
    client = restartable.create()
    client.apply([update(f"d{i % 3}/f{i}.py", rand(4, i)) for i in range(12)], [])
    set_dirs(client, [(key(f"d{i}"), value(f"d{i}")) for i in range(3)]
                          + [(key(""), value("root"))])
    query = rand(1, 99)[0]
    kids_before = client.children([key(""), key("d1"), key("d2")])
    hits_before = client.search(query, 10)

    restartable.stop()
    # While it is down, a writer dies partway through an apply adding d2/new.py.
    kept = crash_mid_apply(restartable, client.workspace_id, [update("d2/new.py", rand(2, 50))])
    restartable.start()

    again = restartable.reopen(client)
    kids = again.children([key(""), key("d1"), key("d2")])
    assert kids[key("d1")] == kids_before[key("d1")]  # untouched: values intact
    if kept:
        assert again.root() == NodeInfo(key(""), None, True)
        assert {n.key: n.value for n in kids[key("")]} == {
            key("d0"): value("d0"), key("d1"): value("d1"), key("d2"): None,
        }
        assert by_key(kids[key("d2")])[key("d2/new.py")].value is None
    else:
        assert again.root() == NodeInfo(key(""), value("root"), True)
        assert kids == kids_before
    assert again.search(query, 10) == hits_before
    assert again.info().chunks == 48

    again.apply([update("d2/new.py", rand(2, 50))], [])
    set_dirs(again, [(key("d2"), value("d2'")), (key(""), value("root'"))])
    assert again.root().value == value("root'")
    assert again.info().chunks == 50
    again.apply([], [key("d0")])
    assert again.info().chunks == 34


# -- several users of one data dir --------------------------------------------------------


def test_two_stores_on_one_dir_see_each_others_writes(tmp_path: Path) -> None:
    # The embedded store is opened by the daemon and the CLI at once.
    one, two = Store(tmp_path / "s"), Store(tmp_path / "s")
    a = LocalClient.create_workspace(one, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    b = LocalClient(two, "ws")
    a.apply([update("x.py", rand(2, 1))], [])
    assert len(b.search(np.zeros(DIM), 10)) == 2  # builds b's index
    b.apply([update("y.py", rand(3, 2))], [key("x.py")])
    assert metas_found(a) == {meta("y.py", i, "1") for i in range(3)}
    a.apply([update("z.py", rand(1, 3))], [])
    assert len(b.search(np.zeros(DIM), 10)) == 4
    assert a.info().chunks == b.info().chunks == 4
    one.close()
    two.close()


def test_compaction_keeps_results(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", options=StoreOptions(compact_every=3))
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    for i in range(10):
        client.apply([update(f"f{i % 4}.py", rand(3, i), str(i))], [])
    expected = {meta(f"f{i % 4}.py", j, str(i)) for i in range(6, 10) for j in range(3)}
    assert metas_found(client) == expected
    stats = store.workspace("ws").rows.index.table.handle.stats()
    assert stats["fragment_stats"]["num_fragments"] <= 4
    store.close()
    store = Store(tmp_path / "s")
    assert metas_found(LocalClient(store, "ws")) == expected
    store.close()


def test_searches_run_during_applies(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    client = LocalClient.create_workspace(store, "ws", dim=DIM, model_id=MODEL, key_check=CHECK)
    client.apply([update("base.py", rand(5, 0))], [])
    errors: list[BaseException] = []
    stop = threading.Event()

    def searcher() -> None:
        try:
            while not stop.is_set():
                hits = client.search(rand(1, 1)[0], 20)
                assert len({h.chunk_id for h in hits}) == len(hits) >= 5
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(15):
        client.apply([update(f"f{i % 3}.py", rand(4, i), str(i))], [])
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert client.info().chunks == 5 + 12
    store.close()


# -- both backends alike ----------------------------------------------------------------

TREE_PATHS = ["a", "a/x", "a/x/y", "a/x/z", "a/b", "a/b/c", "a/b/d", "e", "e/f", "e/f/h", "g"]


def observed(client: StoreClient) -> tuple:
    """Everything a client can see of a workspace: the tree level by level, every file's
    rows, the counts, and a search over all rows."""
    root = client.root()
    tree: dict[bytes, list[NodeInfo]] = {}
    frontier = [] if root is None else [root.key]
    while frontier:
        tree.update(client.children(frontier))
        frontier = [n.key for k in frontier for n in tree[k] if n.is_dir]
    files = sorted({key(p) for p in TREE_PATHS} | {n.key for ns in tree.values() for n in ns})
    info = client.info()
    hits = client.search(np.full(DIM, 0.1, np.float32), 1000)
    return (root, tree, client.file_rows(files), (info.chunks, info.nodes),
            sorted((h.chunk_id, round(h.distance, 4), h.meta) for h in hits))


def random_call(rng: random.Random, step: int, view: StoreClient) -> tuple[str, tuple]:
    """An apply (files, some becoming folders or back; deletes) or directory values (over
    the children `view` shows, now and then stale), as a client might send them."""
    if rng.random() < 0.5:
        ups = [update(p, rand(rng.randint(0, 3), step * 10 + i), str(step))
               for i, p in enumerate(rng.sample(TREE_PATHS, rng.randint(0, 3)))]
        gone = [key(p) for p in rng.sample([*TREE_PATHS, ""], rng.randint(0, 2))]
        return "apply", (ups, gone if not ups or rng.random() < 0.3 else [])
    dirs = sorted(rng.sample(["", *TREE_PATHS], rng.randint(2, 6)),
                  key=lambda p: -(p.count("/") + (p != "")))  # bottom-up, as a client sends
    kids = view.children([key(p) for p in dirs])
    values = []
    for p in dirs:
        pairs = [(n.key, n.value or PENDING_HERE) for n in kids[key(p)]]
        if pairs and rng.random() < 0.2:
            pairs.pop()  # computed over other children
        values.append(DirValue(key(p), value(f"dir {p}@{step}"), children_digest(pairs)))
    return "set_dir_values", (values,)


def test_random_calls_leave_both_backends_alike(tmp_path: Path, pg_url: str) -> None:
    """The same random calls to the embedded store and to PostgreSQL: after each, both
    answer every read alike, and a refused call is refused alike."""
    embedded, postgres = LocalBackend(tmp_path / "store"), PgBackend(pg_url)
    for seed in range(6):
        rng = random.Random(seed)
        workspace_id = f"alike-{secrets.token_hex(4)}"
        one, two = embedded.create(workspace_id=workspace_id), postgres.create(
            workspace_id=workspace_id)
        for step in range(40):
            name, args = random_call(rng, step, one)
            outcomes = []
            for client in (one, two):
                try:
                    getattr(client, name)(*args)
                    outcomes.append(None)
                except BadRequest as exc:
                    outcomes.append(str(exc))
            assert outcomes[0] == outcomes[1], (seed, step, name)
            assert observed(one) == observed(two), (seed, step, name)
    embedded.close()
    postgres.close()


def _sharing_prefix(of: bytes, tail: str) -> bytes:
    """A key with the first 8 bytes of `of` (a file key colliding by chance)."""
    return of[:8] + hashlib.sha256(tail.encode()).digest()[:8]


def _file(file_key: bytes, path: str, n: int = 2) -> FileUpdate:
    return FileUpdate(file_key, ancestors(path), value(f"{path}@1"), tuple(
        ChunkRecord(key(f"{path}#{i}"), v, meta(path, i, "1"))
        for i, v in enumerate(rand(n, 5))))


def test_two_files_whose_keys_share_their_row_group_are_refused(backend: Backend) -> None:
    # A file's rows are grouped by its key's first 8 bytes: a second file with the same
    # 8 would take the first one's rows with it on every replace and delete.
    client = backend.create()
    first = _file(key("a.py"), "a.py", 3)
    client.apply([first], [])
    twin = _file(_sharing_prefix(key("a.py"), "twin"), "b.py")
    with pytest.raises(BadRequest, match="first 8 bytes"):
        client.apply([twin], [])
    with pytest.raises(BadRequest, match="first 8 bytes"):  # within one apply too
        client.apply([_file(key("c.py"), "c.py"),
                      _file(_sharing_prefix(key("c.py"), "x"), "d.py")], [])
    rows = client.file_rows([key("a.py")])
    assert len(rows[key("a.py")]) == 3  # the first file kept its rows
    assert set(by_key(client.children([key("")])[key("")])) == {key("a.py")}
    # Once the first file is deleted, its key's group is free again.
    client.apply([twin], [key("a.py")])
    assert len(client.file_rows([twin.file_key])[twin.file_key]) == 2
