"""A teammate joins a sealed workspace on a real server on loopback and pulls the
vectors instead of embedding them. Each teammate has a config dir (keys, tokens) and an
embedding cache of their own, as two machines do; the model is the real one.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.embedder import SentenceTransformerEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from retrieval.faces.api import WrongKeyError
from sync.checkout.config import RepoConfig, load_config, load_token, state_path
from sync.crypto.keys import WorkspaceKey, export_key, import_key, load_key
from sync.syncer.syncer import SyncReport
from tests.conftest import write_repo

QUERIES = [
    "retry failed uploads with backoff",
    "hash and verify a password",
    "distance between two points on earth",
    "route handler for the web server",
]

BOB_ONLY = {
    "tools/bob_notes.py": '''
        def summarize_release_notes(lines):
            """Bob's helper: the first sentence of each release note."""
            return [line.split(".")[0] for line in lines if line.strip()]
    ''',
}


class Machine:
    """One teammate's machine: their own config dir and embedding cache."""

    def __init__(self, tmp: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.config = tmp / f"{name}-config"
        self.cache = tmp / f"{name}-cache"
        self.monkeypatch = monkeypatch

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self.monkeypatch.context() as m:
            m.setenv("CODEVEIL_CONFIG_DIR", str(self.config))
            m.setenv("CODEVEIL_CACHE_DIR", str(self.cache))
            yield


def two_machines(tmp: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]
                 ) -> tuple[Machine, Machine, Path, Path]:
    """Alice's and Bob's machines, each with a checkout of `files`."""
    return (Machine(tmp, "alice", monkeypatch), Machine(tmp, "bob", monkeypatch),
            write_repo(tmp / "alice", files), write_repo(tmp / "bob", files))


def _top(idx: Index, query: str) -> list[tuple[str, int, int]]:
    return [(h.path, h.start_line, h.end_line) for h in idx.search(query, k=10)]


def _vectors(root: Path, cache_dir: Path, model_id: str, dim: int) -> dict[str, np.ndarray]:
    """embedded text -> the vector this machine's cache holds for it."""
    db = open_state_db(state_path(root))
    cache = EmbeddingCache(cache_dir / "embeddings.sqlite")
    try:
        keys = {c.embed_text: cache_key(model_id, c.embed_text)
                for _, c in LocalChunks(db).iter_all()}
        found = cache.get_many(list(keys.values()), dim)
        return {text: found[key] for text, key in keys.items() if key in found}
    finally:
        cache.close()
        db.close()


def _share(machine: Machine, repo: Path, server_url: str,
           embedder: SentenceTransformerEmbedder) -> tuple[Index, RepoConfig, SyncReport, str]:
    """On `machine`: a new sealed workspace on the server for `repo`, indexed; the open
    index, its config, the report and the workspace token (to hand to a teammate)."""
    with machine.active():
        idx = Index(repo, embedder=embedder)
        config = idx.init(server=server_url)
        report = idx.index(wait=True)
        return idx, config, report, load_token(config.workspace_id)


def test_a_teammate_pulls_vectors_and_gets_the_same_answers(
        tmp_path: Path, server_url: str, real_embedder: SentenceTransformerEmbedder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    alice, bob = Machine(tmp_path, "alice", monkeypatch), Machine(tmp_path, "bob", monkeypatch)
    alice_repo = write_repo(tmp_path / "alice")
    a, config, first, token = _share(alice, alice_repo, server_url, real_embedder)
    with alice.active():
        assert config.sealed
        assert first.chunks_pulled == 0 and first.chunks_embedded > 0
        key_text = export_key(load_key(config.workspace_id))
        alice_top = {q: _top(a, q) for q in QUERIES}
        a.close()

    bob_repo = tmp_path / "bob"
    shutil.copytree(alice_repo, bob_repo, ignore=shutil.ignore_patterns(".codeveil"))
    with bob.active():
        import_key(config.workspace_id, key_text)
        b = Index(bob_repo, embedder=real_embedder)
        joined = b.init(server=server_url, workspace_id=config.workspace_id, token=token)
        assert joined.sealed  # the workspace's mode, recorded on the server
        report = b.index(wait=True)
        # Every chunk came from the workspace; the model ran for none of them.
        assert report.chunks_embedded == 0
        assert report.chunks_pulled == first.chunks_total
        # Nothing was sent back but the leaves of bob's own ref, linked to alice's pages.
        assert report.files_linked == report.files_changed
        for q in QUERIES:
            assert _top(b, q) == alice_top[q], q
        b.close()

    model_id = load_config(alice_repo).model_id
    mine = _vectors(alice_repo, alice.cache, model_id, real_embedder.dim)
    pulled = _vectors(bob_repo, bob.cache, model_id, real_embedder.dim)
    assert pulled.keys() == mine.keys()
    for text, vec in mine.items():  # float16 in the envelope: equal to ~1e-4
        assert float(vec @ pulled[text]) > 0.9999

    # Bob's own file is embedded (only it), sent, and searchable; Alice's private file,
    # which his clone lacks, never shows in his results.
    write_repo(bob_repo, BOB_ONLY)
    (bob_repo / "auth" / "password.py").unlink()
    with bob.active():
        b = Index(bob_repo, embedder=real_embedder)
        again = b.index(wait=True)
        db = open_state_db(state_path(bob_repo))
        bobs = len(LocalChunks(db).for_file("tools/bob_notes.py"))
        db.close()
        assert bobs > 0 and again.chunks_embedded == bobs and again.chunks_pulled == 0
        hits = b.search("hash and verify a password", k=10)
        assert hits and all(h.path != "auth/password.py" for h in hits)
        assert b.search("first sentence of each release note", k=1)[0].path == (
            "tools/bob_notes.py")
        b.close()


def test_a_wrong_key_is_refused_before_anything_is_pulled(
        tmp_path: Path, server_url: str, real_embedder: SentenceTransformerEmbedder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    alice, eve = Machine(tmp_path, "alice", monkeypatch), Machine(tmp_path, "eve", monkeypatch)
    repo = write_repo(tmp_path / "alice")
    a, config, _, token = _share(alice, repo, server_url, real_embedder)
    a.close()
    clone = tmp_path / "eve"
    shutil.copytree(repo, clone, ignore=shutil.ignore_patterns(".codeveil"))
    with eve.active():
        import_key(config.workspace_id, export_key(WorkspaceKey.generate()))
        with pytest.raises(WrongKeyError):
            Index(clone, embedder=real_embedder).init(
                server=server_url, workspace_id=config.workspace_id, token=token)
        cache_file = eve.cache / "embeddings.sqlite"
        if cache_file.exists():  # nothing was pulled into it
            assert len(EmbeddingCache(cache_file)) == 0
