"""The parts of a ranking that read what a file is from its path: the small file a
question names by its own name (the module's face) is returned, and an old copy,
declarations or a barrel rank below the implementation unless asked for. Real files, a
real index (the hashing embedder: these parts read paths, not meaning)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.embedder import HashingEmbedder
from indexer.location import ChunkLocation
from indexer.tokens import default_counter
from retrieval import Index
from retrieval.indexes.lexical import LexicalIndex
from retrieval.search.fusion import HybridRanker
from retrieval.search.options import SearchOptions
from retrieval.search.path_vote import path_words, query_words
from retrieval.search.ranking_parts import RESCORING, VOTES, Ballots, LexicalVote
from retrieval.search.signals import is_secondary
from tests.conftest import write_repo


def _ranker(chunks: list[Chunk]) -> HybridRanker:
    model = HashingEmbedder()
    lexical = LexicalIndex.from_chunks(chunks)
    vectors = model.embed([c.embed_text for c in chunks])
    docs = [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language)
            for c in chunks]

    def nearest(v: np.ndarray, n: int, *, keep=None) -> list[tuple[ChunkLocation, float]]:
        s = vectors @ v
        return [(docs[i], float(s[i])) for i in np.argsort(-s)[:n]]

    return HybridRanker(lexical, model.embed, nearest, default_counter().count, 200)


def _worker(i: int, j: int) -> str:
    return (f"export function schedule{i}_{j}(pool, job) {{\n"
            f"  // take a worker from the pool and run the job on it\n"
            f"  const worker = pool.take();\n  return worker.run(job, {j});\n}}\n")


def test_the_small_file_a_question_names_gets_the_path_vote() -> None:
    chunks = [Chunk(f"src/workers/pool/runner{i}.ts", 1 + 6 * j, 5 + 6 * j, "typescript",
                    f"schedule{i}_{j}", _worker(i, j)) for i in range(12) for j in range(6)]
    # The module's face: it only re-exports; its lines match none of the words.
    face = Chunk("src/workers/pool.ts", 1, 1, "typescript", "", 'export * from "./impl";\n')
    chunks.append(face)
    ranker = _ranker(chunks)
    query = "how does the worker pool work"
    on = ranker.rank(query, SearchOptions())
    off = ranker.rank(query, SearchOptions(w_path=0.0))
    assert on.sources["path"] == 1  # one small file is named by its stem: the face
    assert "path" not in off.sources
    score = {d.path: s for d, s in on.chunks if d.path == face.path}
    before = {d.path: s for d, s in off.chunks if d.path == face.path}
    o = SearchOptions()
    assert score[face.path] - before.get(face.path, 0.0) == pytest.approx(
        o.w_path / (o.rrf_k + 1))
    # An issue text keeps the ranking it was tuned with: no path vote.
    issue = query + " when the job fails" * (o.short_query_words // 4)
    assert "path" not in ranker.rank(issue, o).sources


def test_the_implementation_ranks_above_its_legacy_copy(tmp_path: Path) -> None:
    impl = ("class Client:\n    def send(self, request):\n"
            "        return self.transport.send(request)\n")
    # The old copy says "request" once more: on words alone it would lead.
    old = ("class Client:\n    def send(self, request):\n"
           "        # send the request\n        return self.transport.send(request)\n")
    repo = write_repo(tmp_path / "repo", {"http/client.py": impl,
                                          "http/legacy/client.py": old})
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
        query = "send a request with the client"
        assert idx.search(query, k=2)[0].path == "http/client.py"
        # Asked for, the old copy is not held back.
        assert idx.search("the legacy client's send request", k=2)[0].path == \
            "http/legacy/client.py"
        idx.search_options = replace(idx.search_options, w_secondary=1.0)
        assert idx.search(query, k=2)[0].path == "http/legacy/client.py"


def test_what_stands_beside_an_implementation() -> None:
    for path in ("src/v1/client.ts", "lib/legacy/pool.py", "types/index.d.ts",
                 "src/types/options.ts", "src/index.ts", "src/config.ts",
                 "pkg/compat/io.go"):
        assert is_secondary(path), path
    for path in ("src/client.ts", "src/index.py", "lib/pool.py", "src/indexer.ts",
                 "src/api/v2/client.ts"):
        assert not is_secondary(path), path


def test_path_words() -> None:
    assert path_words("src/tablib/formats/_xls.py") == ({"xls"}, {"tablib", "formats"})
    stem, folders = path_words("clikt/parameters/options/RetryPolicy.kt")
    assert stem == {"retrypolicy", "retry", "policy"}
    assert "parameters" in folders
    assert path_words("types/index.d.ts")[0] == frozenset()  # "index" names nothing
    assert query_words("Tablib - XLS Support.") == {"tablib", "xls", "support"}


def test_a_ranker_is_composed_of_named_parts() -> None:
    assert [v.name for v in VOTES] == ["vector", "header_vector", "static", "lexical",
                                       "path", "file", "evidence"]
    assert [r.name for r in RESCORING] == ["prefer_code", "prefer_primary"]


def test_a_questions_frame_words_are_not_searched() -> None:
    # "how" and "does" are rare in code: a comment that holds them must not lead.
    chunks = [Chunk("notes.py", 1, 2, "python", "",
                    "# how does this work? nobody knows how it does\nx = 1\n"),
              Chunk("cache/evict.py", 1, 3, "python", "evict_oldest",
                    "def evict_oldest(cache):\n    # drop the least recently used entry\n"
                    "    cache.pop(next(iter(cache)))\n")]
    ranker = _ranker(chunks)
    words = SearchOptions(w_vector=0.0, w_header_vector=0.0, w_path=0.0, w_file_vote=0.0)
    query = "how does eviction work"
    assert ranker.rank(query, words).chunks[0][0].path == "cache/evict.py"
    kept = ranker.rank(query, replace(words, question_words_out=False))
    assert kept.chunks[0][0].path == "notes.py"


def test_bm25_votes_in_full_for_plain_words_while_no_vector_votes() -> None:
    chunks = [Chunk(f"m{i}.py", 1, 2, "python", f"f{i}", f"def f{i}():\n    return {i}\n")
              for i in range(3)]
    chunks.append(Chunk("retry.py", 1, 2, "python", "again",
                        "def again(call):\n    # retry the call after a failure\n"))
    ranker = _ranker(chunks)
    o = SearchOptions(w_lexical_prose_peaked=None)

    def weight(options: SearchOptions) -> float:
        ballots = Ballots()
        LexicalVote().cast(ranker, ranker.view("retry after failure", options, None, None),
                           ballots)
        return ballots.weights[ballots.voters.index("lexical")]

    assert weight(o) == pytest.approx(o.w_lexical_prose or 0.0)  # every vector votes
    none = replace(o, w_vector=0.0, meaning_share=0.0)  # none built yet
    assert weight(none) == pytest.approx(o.w_lexical)
    half = weight(replace(o, w_vector=0.5, meaning_share=0.5))  # half of them built
    assert (o.w_lexical_prose or 0.0) < half < o.w_lexical


def test_a_file_whose_words_are_spread_over_its_chunks_gets_the_file_vote() -> None:
    # No one chunk of the answer holds both "token" and "expiry"; its file holds both.
    chunks = [Chunk("auth/session.py", 1, 2, "python", "issue", "def issue():\n    token()\n"),
              Chunk("auth/session.py", 4, 5, "python", "ttl", "def ttl():\n    expiry()\n")]
    chunks += [Chunk(f"other{i}.py", 1, 2, "python", f"g{i}",
                     f"def g{i}():\n    {'token' if i % 2 else 'expiry'}()\n")
               for i in range(6)]
    ranker = _ranker(chunks)
    words = SearchOptions(w_vector=0.0, w_header_vector=0.0, w_path=0.0, meaning_share=0.0)
    ranking = ranker.rank("token expiry", words)
    assert ranking.sources["file"] >= 1
    assert ranking.chunks[0][0].path == "auth/session.py"
    assert "file" not in ranker.rank("token expiry", replace(words, w_file_vote=0.0)).sources
    # Once every vector votes, the file vote has yielded to meaning.
    assert "file" not in ranker.rank("token expiry", SearchOptions(w_path=0.0)).sources


def test_the_static_vote_yields_to_the_vectors_as_they_land() -> None:
    from retrieval.indexes.local_vectors import LocalVectorIndex
    from retrieval.indexes.local_vectors.docs import VectorDocs
    from retrieval.indexes.local_vectors.index import no_vectors

    chunks = [Chunk(f"m{i}.py", 1, 2, "python", f"compute_total_{i}",
                    f"def compute_total_{i}():\n    return {i}\n") for i in range(8)]
    ranker = _ranker(chunks)
    model = HashingEmbedder()
    planes = np.stack([model.embed([c.embed_text for c in chunks]),
                       model.embed([c.header for c in chunks])])
    docs = VectorDocs.of([ChunkLocation(c.path, c.start_line, c.end_line, c.symbol,
                                        c.language) for c in chunks], [True] * len(chunks))
    static = LocalVectorIndex(planes, docs, np.zeros(len(chunks), dtype=bool),
                              no_vectors(model.dim), VectorDocs.empty(), 0)
    o = SearchOptions(w_static=0.75, w_static_meaning=0.25)

    def voted(options: SearchOptions) -> bool:
        return "static" in ranker.rank("return a number", options).sources

    assert not voted(o)  # no static side given: no vote
    ranker.use_static(static, model.embed)
    assert voted(o)
    assert ranker.view("return a number", replace(o, meaning_share=0.0), None, None).w_static \
        == pytest.approx(0.75)
    assert ranker.view("return a number", o, None, None).w_static == pytest.approx(0.25)
    assert ranker.view("return a number", replace(o, meaning_share=0.5), None, None).w_static \
        == pytest.approx(0.5)
    # A bare name the repo defines is found by name: no vote by meaning, static or not.
    name = ranker.view("compute_total_3", replace(o, meaning_share=0.0), None, None)
    assert name.evidence is not None and name.w_static == 0.0
    ranker.use_static(None, model.embed)
    assert not voted(o)
