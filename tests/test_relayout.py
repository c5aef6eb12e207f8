"""A store whose tree still follows the repo's directories (the layout from before
buckets) is brought to the bucket layout by the next sync, without losing a row: the
same machine re-sends from its cache, and a machine without vectors pulls the old rows
instead of embedding."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from bench.store_contents import Contents, pg_workspace_contents, workspace_contents
from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_config, load_token, state_path, store_path
from sync.checkout.refs import ref_id, ref_name
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey, load_key
from sync.crypto.merkle import LEVELS, ROOT
from sync.crypto.pages import opened_rows
from sync.crypto.sealed_rows import RowSealer, new_row_id
from sync.records import ChunkRecord, FileUpdate
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess


def _repo(root: Path) -> Path:
    files = {f"pkg{i % 4}/sub{i % 3}/mod_{i}.py":
             f"def handler_{i}(value):\n    '''Handle case {i}.'''\n    return value + {i}\n"
             for i in range(30)}
    files["top.py"] = "def top_level():\n    return 0\n"
    return write_repo(root, files)


def _directory_ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return [ROOT] + ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _client(repo: Path, workspace_id: str, server: ServerProcess | None) -> StoreClient:
    # Either backend keeps a tree per ref: this checkout's.
    ref = ref_id(load_key(workspace_id), ref_name(repo))
    if server is None:
        return LocalClient.open(store_path(repo), workspace_id, ref=ref)
    return HttpClient(server.url, workspace_id, load_token(workspace_id), ref=ref)


def _contents(repo: Path, workspace_id: str, key: WorkspaceKey,
              server: ServerProcess | None) -> Contents:
    if server is None:
        return workspace_contents(store_path(repo), workspace_id, key)
    assert server.store is not None
    return pg_workspace_contents(server.store, workspace_id, key)


def _rewrite_in_directory_layout(client: StoreClient, key: WorkspaceKey, sealer: RowSealer,
                                 paths: list[str]) -> None:
    """Move every file of the store under the repo's directories, leaf values as they
    are and each file's rows under its leaf (opened from the pages, sealed again as rows
    were before pages), and remove the buckets: the tree an older client left."""
    keys = {ciphers.node_key(key, p): p for p in paths}
    leaves: dict[bytes, bytes | None] = {}
    root = ciphers.node_key(key, ROOT)
    frontier = [root]
    buckets = []
    while frontier:
        answer = client.children(frontier)
        frontier = [n.key for kids in answer.values() for n in kids if n.is_dir]
        buckets += frontier
        leaves.update({n.key: n.value for kids in answer.values() for n in kids
                       if not n.is_dir})
    pages = [k for k, v in leaves.items() if v == ciphers.page_value(key, k)]
    rows: dict[bytes, list[ChunkRecord]] = {k: [] for k in keys}
    for page, stored in client.file_rows(pages).items():
        for row in opened_rows(sealer, key, page, stored):
            if row.value == leaves[row.file_key]:
                rid = new_row_id()
                rows[row.file_key].append(ChunkRecord(
                    rid, None, sealer.seal(rid, row.file_key, row.meta, row.vector)))
    client.apply([FileUpdate(
        file_key=k,
        ancestors=tuple(ciphers.node_key(key, a) for a in _directory_ancestors(p)),
        value=leaves[k] or b"",
        chunks=tuple(rows[k]))
        for k, p in keys.items()], [])
    client.apply([], [n.key for n in client.children([root])[root] if n.key in buckets])


def _tree(contents: Contents) -> dict[bytes, bytes | None]:
    """node key -> parent key of every node of the store."""
    return {k: p for k, p, _v, _d in contents[2]}


def _depth(parents: dict[bytes, bytes | None], node: bytes) -> int:
    depth = 0
    while parents[node] is not None:
        node, depth = parents[node], depth + 1  # type: ignore[assignment]
    return depth


def _rows(contents: Contents) -> list[tuple]:
    return sorted(r[1:] for r in contents[1])


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
@pytest.mark.parametrize("fresh_machine", [False, True])
def test_a_directory_layout_store_is_relaid_without_losing_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_machine: bool, backend: str,
        request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("pg_live_server") if backend == "postgres" else None
    repo = _repo(tmp_path / "repo")
    with Index(repo, embedder=HashingEmbedder()) as idx:
        if server is not None:
            idx.init(server=server.url)
        idx.index(wait=True)
    ws = load_config(repo).workspace_id
    key = load_key(ws)
    paths = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.py"))
    before = _rows(_contents(repo, ws, key, server))
    with contextlib.closing(_client(repo, ws, server)) as client:
        sealer = RowSealer(key, ws, load_config(repo).dim)
        _rewrite_in_directory_layout(client, key, sealer, paths)
    old = _contents(repo, ws, key, server)
    assert ciphers.node_key(key, "pkg1/sub2") in _tree(old)  # the directories are stored
    assert _rows(old) == before

    if fresh_machine:  # no vectors here: a new laptop, or a teammate's clone
        monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "empty-cache"))
        state_path(repo).unlink()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        report = idx.index(wait=True)
        assert report.files_changed == len(paths)
        assert report.chunks_embedded == 0  # from the cache, or pulled from the old rows
        if fresh_machine:
            assert report.chunks_pulled == report.chunks_total > 0
        assert idx.index(wait=True).requests == 1
        assert idx.search("handler_17", k=1)[0].path == "pkg1/sub2/mod_17.py"

    new = _contents(repo, ws, key, server)
    assert _rows(new) == before
    parents = _tree(new)
    dirs = {ciphers.node_key(key, d) for p in paths for d in _directory_ancestors(p)[1:]}
    assert not dirs & parents.keys()  # no directory of the repo is left
    assert {_depth(parents, ciphers.node_key(key, p)) for p in paths} == {LEVELS + 1}
