"""A large index leaves the search side built: the first search after it (or during it,
from another process) loads the lexical and vector indexes instead of building them;
a small re-index does not pay for that."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval.faces.api import Index
from retrieval.indexes.search_ready import FOLLOW_FILES, SearchReady
from tests.conftest import write_repo


def _repo(root: Path, files: int) -> Path:
    return write_repo(root, {
        f"pkg/mod_{i:03d}.py": f"def handler_{i}(value):\n    return value * {i}\n"
        for i in range(files)
    })


def test_a_large_index_leaves_the_search_side_built(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    repo = _repo(tmp_path / "repo", FOLLOW_FILES + 20)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        report = idx.index(wait=True)
    assert (repo / ".codeveil" / "lexical").is_dir()
    assert 0 < report.seconds_search_ready < report.seconds
    with Index(repo, embedder=HashingEmbedder()) as idx:
        hits = idx.search("handler_7", k=1)
        assert hits[0].path == "pkg/mod_007.py"
        lexical, vectors = idx._lexical_store, idx._vector_store
        assert lexical is not None and vectors is not None
        # Loaded as saved by the index: nothing counted, nothing read from the cache.
        assert lexical.last_refresh == {} and vectors.last_refresh == {}
        assert idx.grep("handler_7").matches
        assert idx.tools.trigrams(repo).last_refresh == {}


def test_a_small_reindex_leaves_it_to_the_search(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    repo = _repo(tmp_path / "repo", 5)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.index(wait=True).seconds_search_ready == 0
    assert not (repo / ".codeveil" / "lexical").exists()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.search("handler_3", k=1)[0].path == "pkg/mod_003.py"
        assert idx._lexical_store is not None
        assert idx._lexical_store.last_refresh["mode"] == "rebuild"


def test_the_daemons_large_sync_leaves_the_search_side_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's target (a branch switch is one large sync) with the follower the CLI
    gives it, which keeps vectors of its own rather than an Index's."""
    from sync.daemon import WorkspaceSync
    from sync.workspace.workspace import Workspace

    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    repo = _repo(tmp_path / "repo", FOLLOW_FILES + 20)
    workspace = Workspace(repo, embedder=HashingEmbedder())
    target = WorkspaceSync(workspace, follower=lambda: SearchReady(workspace))
    try:
        assert target.server == "embedded"
        report = target.sync()
    finally:
        target.close()
    assert report.files_changed == FOLLOW_FILES + 20
    assert 0 < report.seconds_search_ready < report.seconds
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.search("handler_7", k=1)[0].path == "pkg/mod_007.py"
        lexical, vectors = idx._lexical_store, idx._vector_store
        assert lexical is not None and vectors is not None
        assert lexical.last_refresh == {} and vectors.last_refresh == {}
        # grep's index too: the daemon keeps it in step like the lexical one.
        assert [m.path for m in idx.grep(r"handler_7\b").matches] == ["pkg/mod_007.py"]
        assert idx.tools.trigrams(repo).last_refresh == {}
