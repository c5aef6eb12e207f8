"""One search's view (retrieval.search.searcher): the vector side behind one protocol, the
ranker bound to the index it searches, and coverage as a typed result; over a real
repo indexed in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexer.embedder import HashingEmbedder
from indexer.local_chunks import open_state_db
from retrieval import Coverage, Index
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.local_vectors import LocalVectorIndex
from retrieval.search.fusion import group_ranking
from sync.checkout.config import state_path
from tests.conftest import write_repo


@pytest.fixture
def indexed(tmp_path: Path) -> Index:
    idx = Index(write_repo(tmp_path / "repo"), embedder=HashingEmbedder())
    idx.index(wait=True)
    return idx


def _searcher(idx: Index):
    root, config, key, client = idx.workspace.open()
    db = open_state_db(state_path(root))
    return idx._reader.searcher(root, db, config, key, client), db


def test_a_searcher_ranks_what_index_search_returns(indexed: Index) -> None:
    searcher, db = _searcher(indexed)
    try:
        ranking = searcher.rank("retry failed uploads", indexed.search_options, 5, None)
        shown = [g.best.path for g in group_ranking(ranking, "chunk")][:5]
        hits = indexed.search("retry failed uploads", k=5)
        assert [h.path for h in hits] == shown and shown
        kept = searcher.rank("retry failed uploads", indexed.search_options, 5,
                             HitFilter.of("auth/*", None, None))
        assert kept.chunks and all(d.path.startswith("auth/") for d, _ in kept.chunks)
    finally:
        db.close()


def test_the_ranker_calls_the_vector_index_it_was_given_not_the_api(indexed: Index) -> None:
    searcher, db = _searcher(indexed)
    try:
        vectors = searcher.vectors
        assert isinstance(vectors, LocalVectorIndex) and vectors.headers
        ranker = searcher.ranker
        assert ranker.nearest.__self__ is vectors  # type: ignore[attr-defined]
        assert ranker.nearest_each.__self__ is vectors  # type: ignore[attr-defined]
        assert ranker.nearest_header is not None and ranker.nearest_header_each is not None
        q = indexed._query_vectors(["hash a password"])
        assert ranker.nearest_header(q[0], 3) == vectors.nearest(q[0], 3, header=True)
        # A refreshed index is searched by the next searcher, through the same ranker.
        (indexed.root / "auth" / "tokens.py").write_text("def new_token():\n    return 1\n")
        indexed.index(wait=True)
        again, db2 = _searcher(indexed)
        db2.close()
        assert again.ranker is ranker and again.vectors is not vectors
        assert ranker.nearest.__self__ is again.vectors  # type: ignore[attr-defined]
    finally:
        db.close()


def test_coverage_is_typed_and_reads_as_it_did(indexed: Index) -> None:
    indexed.search("upload", k=3)
    cov = indexed.coverage()
    assert isinstance(cov, Coverage)
    assert cov.partial is False and cov.chunks == cov.chunks_with_vectors > 0
    assert cov["chunks"] == cov.chunks and cov.get("partial") is False
    assert cov == {"partial": False, "chunks": cov.chunks, "chunks_with_vectors": cov.chunks}
    assert json.dumps(cov.to_dict()) == json.dumps(
        {"partial": False, "chunks": cov.chunks, "chunks_with_vectors": cov.chunks})
    with pytest.raises(KeyError):
        cov["missing"]
    assert np.isclose(Coverage.of(10, 4).chunks_with_vectors / 10, 0.4)
    assert Coverage.of(10, 4).partial and not Coverage.of(4, 4).partial
