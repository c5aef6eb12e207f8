"""Each chunk's second vector, of its `path > symbol` header alone: embedded by the index,
kept by the client's vector index, ranked by search; filled in for an older index."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from indexer.embed_cache import cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from retrieval.search.options import SearchOptions
from sync.checkout.config import state_path

# Only the header vectors vote: what a search ranks then comes from them alone.
HEADERS_ONLY = replace(SearchOptions(), w_vector=0.0, hybrid=False, evidence=False,
                       w_header_vector=1.0, w_header_vector_prose=1.0, w_static=0.0,
                       w_static_meaning=0.0)


def _headers(root: Path) -> set[str]:
    db = open_state_db(state_path(root))
    try:
        return LocalChunks(db).headers()
    finally:
        db.close()


def _cached(idx: Index, texts: set[str]) -> set[str]:
    model = idx.embedder.model_id
    known = idx.embedder.cache.known([cache_key(model, t) for t in texts])
    return {t for t in texts if cache_key(model, t) in known}


@pytest.fixture
def indexed(sample_repo: Path, real_embedder) -> Index:
    idx = Index(sample_repo, embedder=real_embedder)
    idx.index(wait=True)  # the cache is shared by the tests: its headers may be there already
    yield idx
    idx.close()


def test_the_index_embeds_every_chunks_header(indexed: Index, sample_repo: Path) -> None:
    headers = _headers(sample_repo)
    assert headers and _cached(indexed, headers) == headers
    assert "net/upload.py > Uploader" in headers
    # Nothing changed: no header is embedded again.
    assert indexed.index(wait=True).headers_embedded == 0


def test_search_ranks_by_the_header_vectors(indexed: Index) -> None:
    indexed.search("anything", k=1)
    vectors = indexed._vectors
    assert vectors is not None and vectors.header_count == vectors.count > 0
    indexed.search_options = HEADERS_ONLY
    # The words of a path and a symbol, not of any code: the header vectors find them.
    assert indexed.search("geo distance", k=1, group="file")[0].path == "geo/distance.go"
    assert indexed.search("auth password", k=1, group="file")[0].path == "auth/password.py"


def test_an_index_made_before_header_vectors_gets_them(sample_repo: Path,
                                                       real_embedder) -> None:
    with Index(sample_repo, embedder=real_embedder) as idx:
        idx.index(wait=True)
        headers = _headers(sample_repo)
        model = idx.embedder.model_id
        cache_path = idx.embedder.cache.path
    # What an older version left: no header vectors in the cache, no mark in the state.
    cache = sqlite3.connect(cache_path)
    with cache:
        cache.executemany("DELETE FROM embeddings WHERE key = ?",
                          [(cache_key(model, h),) for h in headers])
    cache.close()
    state = sqlite3.connect(state_path(sample_repo))
    with state:
        state.execute("DROP TABLE embedded_headers")
    state.close()

    with Index(sample_repo, embedder=real_embedder) as idx:
        idx.search_options = HEADERS_ONLY
        # Search still answers; with no header vectors their vote is off.
        assert idx.search("geo distance", k=1) == []
        assert idx._vectors is not None and idx._vectors.header_count == 0
        report = idx.index(wait=True)  # nothing changed in the tree: the headers are filled in
        assert report.files_changed == 0 and report.chunks_embedded == 0
        assert report.headers_embedded == len(headers)
        assert _cached(idx, headers) == headers
        assert idx.search("geo distance", k=1, group="file")[0].path == "geo/distance.go"
        assert idx._vectors.header_count == idx._vectors.count
        assert idx.index(wait=True).headers_embedded == 0
