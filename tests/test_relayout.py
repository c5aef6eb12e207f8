"""A store whose tree still follows the repo's directories (the layout from before
buckets) is brought to the bucket layout by the next sync, without losing a row: the
same machine re-sends from its cache, and a machine without vectors pulls the old rows
instead of embedding."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync import crypto
from sync.config import load_config, state_path, store_path
from sync.keys import WorkspaceKey, load_key
from sync.local_client import LocalClient
from sync.merkle import LEVELS, ROOT
from sync.records import ChunkRecord, FileUpdate
from sync.store.contents import workspace_contents
from tests.conftest import write_repo


def _repo(root: Path) -> Path:
    files = {f"pkg{i % 4}/sub{i % 3}/mod_{i}.py":
             f"def handler_{i}(value):\n    '''Handle case {i}.'''\n    return value + {i}\n"
             for i in range(30)}
    files["top.py"] = "def top_level():\n    return 0\n"
    return write_repo(root, files)


def _directory_ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return [ROOT] + ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _rewrite_in_directory_layout(repo: Path, key: WorkspaceKey, workspace_id: str,
                                 paths: list[str]) -> None:
    """Move every file of the store under the repo's directories, rows and leaf values as
    they are, and remove the buckets: the tree an older client left."""
    with contextlib.closing(LocalClient.open(store_path(repo), workspace_id)) as client:
        keys = {crypto.node_key(key, p): p for p in paths}
        leaves: dict[bytes, bytes | None] = {}
        frontier = [crypto.node_key(key, ROOT)]
        buckets = []
        while frontier:
            answer = client.children(frontier)
            frontier = [n.key for kids in answer.values() for n in kids if n.is_dir]
            buckets += frontier
            leaves.update({n.key: n.value for kids in answer.values() for n in kids
                           if not n.is_dir})
        rows = client.file_rows(list(keys))
        client.apply([FileUpdate(
            file_key=k,
            ancestors=tuple(crypto.node_key(key, a) for a in _directory_ancestors(p)),
            value=leaves[k] or b"",
            chunks=tuple(ChunkRecord(cid, None, meta) for cid, meta in rows[k]))
            for k, p in keys.items()], [])
        level_one = [n.key for n in client.children([crypto.node_key(key, ROOT)])[
            crypto.node_key(key, ROOT)] if n.key in buckets]
        client.apply([], level_one)


def _tree(repo: Path, workspace_id: str, key: WorkspaceKey) -> dict[bytes, bytes | None]:
    """node key -> parent key of every node of the store."""
    _root, _rows, nodes = workspace_contents(store_path(repo), workspace_id, key)
    return {k: p for k, p, _v, _d in nodes}


def _depth(parents: dict[bytes, bytes | None], node: bytes) -> int:
    depth = 0
    while parents[node] is not None:
        node, depth = parents[node], depth + 1  # type: ignore[assignment]
    return depth


def _rows(repo: Path, workspace_id: str, key: WorkspaceKey) -> list[tuple]:
    _root, rows, _nodes = workspace_contents(store_path(repo), workspace_id, key)
    return sorted(r[1:] for r in rows)


@pytest.mark.parametrize("fresh_machine", [False, True])
def test_a_directory_layout_store_is_relaid_without_losing_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_machine: bool) -> None:
    repo = _repo(tmp_path / "repo")
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index()
    config = load_config(repo)
    key = load_key(config.workspace_id)
    paths = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.py"))
    before = _rows(repo, config.workspace_id, key)
    _rewrite_in_directory_layout(repo, key, config.workspace_id, paths)
    old = _tree(repo, config.workspace_id, key)
    assert crypto.node_key(key, "pkg1/sub2") in old  # the directories are in the store
    assert _rows(repo, config.workspace_id, key) == before

    if fresh_machine:  # no vectors here: a new laptop, or a teammate's clone
        monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "empty-cache"))
        state_path(repo).unlink()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        report = idx.index()
        assert report.files_changed == len(paths)
        assert report.chunks_embedded == 0  # from the cache, or pulled from the old rows
        if fresh_machine:
            assert report.chunks_pulled == report.chunks_total > 0
        assert idx.index().requests == 1
        assert idx.search("handler_17", k=1)[0].path == "pkg1/sub2/mod_17.py"

    assert _rows(repo, config.workspace_id, key) == before
    new = _tree(repo, config.workspace_id, key)
    dirs = {crypto.node_key(key, d) for p in paths for d in _directory_ancestors(p)[1:]}
    assert not dirs & new.keys()  # no directory of the repo is left
    assert {_depth(new, crypto.node_key(key, p)) for p in paths} == {LEVELS + 1}
