"""The ten results `codeveil search` prints: as many good files as deserve a place (a
chunk of a file already shown counts less), and the same ten however many results are
asked for. Real source files (this project's own), a real index (the hashing embedder:
the ordering rules under test do not depend on the model)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.location import ChunkLocation
from retrieval import Index
from retrieval.search.grouping import diversify

PROJECT = Path(__file__).resolve().parent.parent
QUERIES = (
    "how are search results grouped per file",
    "where is the lexical index merged",
    "HybridRanker",
    "read the lines of a hit from disk and check the chunk hash",
    "split a long query into parts that fit the window",
    "reciprocal rank fusion",
    "which files are skipped when walking the repository",
    "tree-sitter definitions of a file",
)


@pytest.fixture
def index(tmp_path: Path) -> Index:
    repo = tmp_path / "repo"
    for package in ("retrieval", "indexer"):
        shutil.copytree(PROJECT / package, repo / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    idx = Index(repo, embedder=HashingEmbedder())
    idx.index(wait=True)
    return idx


def _key(hit) -> tuple[str, int, int]:
    return hit.path, hit.start_line, hit.end_line


def test_the_first_ten_do_not_depend_on_k(index: Index) -> None:
    for query in QUERIES:
        ten = [_key(h) for h in index.search(query, k=10)]
        hundred = [_key(h) for h in index.search(query, k=100)]
        assert len(ten) == 10
        assert len(hundred) > 10
        assert hundred[:10] == ten, query


def test_the_ten_printed_cover_more_files_than_the_plain_chunk_order(index: Index) -> None:
    shipped = index.search_options
    assert shipped.saturation < 1.0
    plain = replace(shipped, saturation=1.0, file_first=False)
    distinct = {}
    for name, options in (("shipped", shipped), ("plain", plain)):
        index.search_options = options
        distinct[name] = sum(len({h.path for h in index.search(q, k=10)}) for q in QUERIES)
    index.search_options = shipped
    assert distinct["shipped"] > distinct["plain"]


def _doc(path: str, line: int) -> ChunkLocation:
    return ChunkLocation(path, line, line + 9, "", "python")


def test_a_file_already_shown_counts_less() -> None:
    ranking = [(_doc("big.h", i * 10 + 1), 1.0 - i * 0.01) for i in range(5)]
    ranking.append((_doc("small.c", 1), 0.9))
    out = diversify(ranking, 0.5)
    # big.h's second chunk (0.99 * 0.5) now ranks below small.c's first (0.9).
    assert [d.path for d, _ in out[:2]] == ["big.h", "small.c"]
    assert sorted(d.key for d, _ in out) == sorted(d.key for d, _ in ranking)
    scores = [s for _, s in out]
    assert scores == sorted(scores, reverse=True)
    assert diversify(ranking, 1.0) == ranking


def test_a_files_first_chunk_can_stand_for_the_file() -> None:
    # a.py has one chunk slightly above b.py's best, b.py has three good symbols.
    ranking = [(_doc("a.py", 1), 0.50)]
    ranking += [(ChunkLocation("b.py", i * 10 + 1, i * 10 + 9, f"f{i}", "python"), 0.49)
                for i in range(3)]
    assert diversify(ranking, 0.5)[0][0].path == "a.py"
    assert diversify(ranking, 0.5, file_first=True)[0][0].path == "b.py"


def test_a_limit_places_the_first_chunks_exactly_and_keeps_every_chunk() -> None:
    import random

    rng = random.Random(7)
    ranking = sorted(((_doc(f"f{rng.randrange(12)}.py", i * 10 + 1), rng.random())
                      for i in range(300)), key=lambda x: -x[1])
    whole = diversify(ranking, 0.5, file_first=True)
    for limit in (1, 10, 20, 100):
        cut = diversify(ranking, 0.5, file_first=True, limit=limit)
        assert cut[:limit] == whole[:limit], limit
        assert sorted(d.key for d, _ in cut) == sorted(d.key for d, _ in ranking)
        scores = [s for _, s in cut]
        assert scores == sorted(scores, reverse=True), limit  # the tail never outranks
