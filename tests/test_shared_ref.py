"""Two clones of one repo joined to one sealed workspace with one key, syncing one ref
(told to by `CODEVEIL_REF` set alike: each checkout otherwise has a ref of its own),
on a real server on loopback. Each round both edit
and index at once; after the round, and after a last index by each, the rows the
server's tree holds are those of a clean index of the tree it holds: no file of the
tree lacks a row of one of its chunks, and `doctor` finds nothing. The race is also
forced (the other clone's whole sync inside one's, before its apply or its directory
values), and a gap made by hand is named by `doctor` and sent by the next index. On
the embedded store, PostgreSQL, and two PostgreSQL replicas. The hashing embedder:
what is tested is where rows are, not what they mean."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from retrieval.faces.doctor import doctor
from sync.checkout.config import load_config, load_token, state_path
from sync.checkout.refs import ref_id, ref_name
from sync.crypto.keys import WorkspaceKey, load_key
from sync.crypto.sealed_rows import RowSealer
from sync.syncer.syncer import Syncer
from sync.syncer.tree_rows import TreeRows, read_tree_rows
from sync.transport.http_client import HttpClient
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess

N = 24


def _body(i: int, version: int) -> str:
    return "\n\n".join(f"def f_{i}_{j}_{version}(x):\n"
                       + "".join(f"    x = x * {j} + {k}\n" for k in range(25))
                       + f"    return x + {i}\n" for j in range(1 + (i + version) % 4)) + "\n"


FILES = {f"pkg/mod_{i}.py": _body(i, 0) for i in range(N)}


BACKENDS = ["embedded", "postgresql", "postgresql-replicas"]


@pytest.fixture(params=BACKENDS)
def servers(request: pytest.FixtureRequest, tmp_path: Path
            ) -> tuple[ServerProcess, ServerProcess]:
    """The server each clone talks to: one on the embedded store, one on PostgreSQL,
    or two replicas of one PostgreSQL database (one per clone)."""
    if request.param == "embedded":
        server = request.getfixturevalue("live_server")
        return server, server
    server = request.getfixturevalue("pg_live_server")
    if request.param == "postgresql":
        return server, server
    replica = request.getfixturevalue("server_factory")(tmp_path / "replica",
                                                        store=server.store)
    return server, replica


@pytest.fixture
def clones(tmp_path: Path, servers: tuple[ServerProcess, ServerProcess],
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Index, Index]]:
    """Two clones indexed into one workspace (the second joined with the first's
    token), on one ref."""
    monkeypatch.setenv("CODEVEIL_REF", "ci:shared")
    a = Index(write_repo(tmp_path / "a", FILES), embedder=HashingEmbedder())
    b = Index(write_repo(tmp_path / "b", FILES), embedder=HashingEmbedder())
    try:
        config = a.init(server=servers[0].url)
        a.index(wait=True)
        b.init(server=servers[1].url, workspace_id=config.workspace_id,
               token=load_token(config.workspace_id))
        b.index(wait=True)
        assert ref_name(a.root) == ref_name(b.root)
        yield a, b
    finally:
        a.close()
        b.close()


@contextmanager
def ref_tree(idx: Index) -> Iterator[tuple[HttpClient, WorkspaceKey, TreeRows]]:
    """A client of the server on the clone's ref, the workspace key, and the ref's tree
    with its pages' rows, as the server holds them."""
    config = load_config(idx.root)
    key = load_key(config.workspace_id)
    client = HttpClient(config.server or "", config.workspace_id,
                        load_token(config.workspace_id))
    client.ref = ref_id(key, ref_name(idx.root))
    try:
        yield client, key, read_tree_rows(client, key, RowSealer(key, config.workspace_id,
                                                                 HashingEmbedder().dim))
    finally:
        client.close()


def gaps(idx: Index) -> dict[str, int]:
    """path -> chunks without a row, for every file of the server's tree of the ref
    (whichever clone's version it holds: each clone's chunk table has its own)."""
    out: dict[str, int] = {}
    with ref_tree(idx) as (_client, key, tree):
        for repo in (idx.root, idx.root.parent / ("b" if idx.root.name == "a" else "a")):
            db = open_state_db(state_path(repo))
            try:
                local = LocalChunks(db)
                digests, places = local.file_digests(), local.places()
            finally:
                db.close()
            for path, n in tree.gaps(key, digests, places).items():
                out[f"{repo.name}:{path}"] = n
    in_tree = sum(1 for _ in tree.leaves)
    assert in_tree == len(FILES)  # every file's leaf, in one clone's version or the other's
    return out


def edit(idx: Index, i: int, version: int) -> None:
    (idx.root / f"pkg/mod_{i}.py").write_text(_body(i, version))


def at_once(*syncs: Callable[[], object]) -> None:
    failed: list[BaseException] = []

    def run(sync: Callable[[], object]) -> None:
        try:
            sync()
        except BaseException as exc:  # re-raised in the test's thread
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in syncs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def rounds(a: Index, b: Index, n: int, *, same: bool,
           together: Callable[[], None]) -> list[dict[str, int]]:
    """`n` rounds: both clones edit (one file each, or the same file alike), sync
    `together`, then each once more alone; the gaps after each of the three."""
    found = []
    for r in range(1, n + 1):
        i = r * 7 % N
        edit(a, i, r)
        edit(b, i if same else (i + 5) % N, r)
        together()
        found.append(gaps(a))
        a.index(wait=True)
        found.append(gaps(a))
        b.index(wait=True)
        found.append(gaps(a))
    return found


def _clean(idx: Index) -> None:
    """After a sync of its own: `doctor` finds nothing, and every local chunk has a row
    (`status`)."""
    idx.index(wait=True)
    report = doctor(idx.root)
    assert report.healthy, report.lines()
    status = idx.status()
    assert status.server_chunks == status.chunks


@pytest.mark.parametrize("same", [False, True], ids=["different-edits", "same-edits"])
def test_two_clones_syncing_one_ref_at_once_leave_no_file_without_rows(
        clones: tuple[Index, Index], same: bool) -> None:
    a, b = clones
    found = rounds(a, b, 10, same=same,
                   together=lambda: at_once(lambda: a.index(wait=True),
                                            lambda: b.index(wait=True)))
    assert found == [{}] * 30
    _clean(a)
    _clean(b)


@pytest.mark.parametrize("servers", BACKENDS[:2], indirect=True)
@pytest.mark.parametrize("at", ["_apply", "set_dir_values"])
def test_a_whole_sync_of_the_other_clone_inside_one_leaves_no_gap(
        clones: tuple[Index, Index], monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    """The interleaving forced: the other clone syncs whole just before this one's
    first apply (its diff is then stale), or before its directory values."""
    a, b = clones
    real = Syncer._apply if at == "_apply" else HttpClient.set_dir_values
    fired = threading.local()

    def between(self: object, *args: object) -> object:
        if getattr(fired, "on", False) is False and getattr(fired, "armed", False):
            fired.on = True
            b.index(wait=True)
        return real(self, *args)  # type: ignore[arg-type]

    def together() -> None:
        fired.armed, fired.on = True, False
        try:
            a.index(wait=True)
        finally:
            fired.armed = False

    monkeypatch.setattr(Syncer if at == "_apply" else HttpClient, at, between)
    assert rounds(a, b, 6, same=False, together=together) == [{}] * 18
    _clean(a)
    _clean(b)


@pytest.mark.parametrize("servers", BACKENDS[:2], indirect=True)
def test_doctor_names_a_gap_and_the_next_index_sends_it(
        clones: tuple[Index, Index]) -> None:
    a, _ = clones
    for repair in (False, True):
        drop_a_page(a)
        report = doctor(a.root)
        assert not report.healthy
        assert any(f.problem and "without all their rows" in f.problem
                   for f in report.findings), report.lines()
        assert gaps(a)
        if repair:
            doctor(a.root, repair=True)
        else:
            a.index(wait=True)
        assert gaps(a) == {}
        _clean(a)


def drop_a_page(idx: Index) -> None:
    """Delete a page of the ref's tree behind the clone's back, as another checkout of
    the ref does that holds other versions of the files whose rows it held."""
    with ref_tree(idx) as (client, _key, tree):
        client.apply([], [tree.pages[0]])
