"""Reciprocal-rank fusion, the hybrid ranker, and grouping at chunk, symbol and file level."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.embedder import HashingEmbedder
from indexer.location import ChunkLocation
from indexer.tokens import default_counter
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.lexical import LexicalIndex
from retrieval.search.fusion import HybridRanker, Ranking, group_ranking
from retrieval.search.grouping import group
from retrieval.search.options import SearchOptions, ranked, rrf


def test_rrf_by_hand() -> None:
    fused = rrf([["a", "b", "c"], ["b", "d"]], k=60)
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    assert [key for key, _ in ranked(fused)] == ["b", "a", "d", "c"]


def test_rrf_weights_k_and_repeats() -> None:
    fused = rrf([["a", "b"], ["b", "a"]], k=1, weights=[2.0, 1.0])
    assert fused["a"] == pytest.approx(2 / 2 + 1 / 3)
    assert fused["b"] == pytest.approx(2 / 3 + 1 / 2)
    assert rrf([["a", "a", "b"]], k=0)["a"] == pytest.approx(1.0)  # best rank only
    assert rrf([["a"], []], weights=[0.0, 1.0]) == {}
    with pytest.raises(ValueError):
        rrf([["a"]], weights=[1.0, 2.0])


def _doc(path: str, symbol: str, start: int) -> ChunkLocation:
    return ChunkLocation(path, start, start + 9, symbol, "python")


RANKING = [
    (_doc("a.py", "A > f", 1), 0.9),
    (_doc("b.py", "g", 1), 0.8),
    (_doc("a.py", "A > f", 11), 0.7),
    (_doc("b.py", "h", 11), 0.6),
    (_doc("a.py", "A > k", 21), 0.5),
    (_doc("c.py", "", 1), 0.4),
]


def test_group_chunks_keeps_the_ranking() -> None:
    groups = group(RANKING, "chunk")
    assert [(g.best.path, g.best.start_line, g.score) for g in groups] == [
        (d.path, d.start_line, s) for d, s in RANKING]


def test_group_symbols() -> None:
    groups = group(RANKING, "symbol", "max")
    assert [g.key for g in groups] == [("a.py", "A > f"), ("b.py", "g"), ("b.py", "h"),
                                       ("a.py", "A > k"), ("c.py", "")]
    first = groups[0]
    assert first.best.start_line == 1 and first.score == 0.9
    assert [m.start_line for m in first.members] == [1, 11]
    summed = group(RANKING, "symbol", "sum")
    assert summed[0].score == pytest.approx(1.6)


@pytest.mark.parametrize(("agg", "scores"), [
    ("max", {"a.py": 0.9, "b.py": 0.8, "c.py": 0.4}),
    # a.py's second chunk of `A > f` (0.7, rank 3) does not count again.
    ("sum", {"a.py": 1.4, "b.py": 1.4, "c.py": 0.4}),
    ("topm", {"a.py": 1.4, "b.py": 1.4, "c.py": 0.4}),
    ("decay", {"a.py": 0.9 + 0.25, "b.py": 0.8 + 0.3, "c.py": 0.4}),
    ("rrf", {"a.py": 1 / 61 + 1 / 65, "b.py": 1 / 62 + 1 / 64, "c.py": 1 / 66}),
])
def test_group_files(agg: str, scores: dict[str, float]) -> None:
    groups = group(RANKING, "file", agg)  # type: ignore[arg-type]
    assert {g.key[0]: g.score for g in groups} == pytest.approx(scores)
    assert [g.key[0] for g in groups] == sorted(scores, key=lambda p: -scores[p])
    a = next(g for g in groups if g.key == ("a.py",))
    assert a.best.start_line == 1 and len(a.members) == 3


def test_a_symbol_cut_into_many_chunks_counts_once_for_its_file() -> None:
    split = [(_doc("long.py", "parse", i * 10), 0.5 - i * 0.01) for i in range(5)]
    ranking = [split[0], (_doc("two.py", "a", 1), 0.45), (_doc("two.py", "b", 11), 0.44),
               *split[1:]]
    files = group(ranking, "file", "decay")
    assert [g.key[0] for g in files] == ["two.py", "long.py"]
    assert files[1].score == pytest.approx(0.5) and len(files[1].members) == 5


def test_top_m_caps_a_long_file() -> None:
    long_file = [(_doc("long.py", f"f{i}", i * 10), 0.3) for i in range(10)]
    ranking = [(_doc("short.py", "s", 1), 0.85), (_doc("short.py", "t", 11), 0.2), *long_file]
    assert group(ranking, "file", "sum")[0].key == ("long.py",)
    assert group(ranking, "file", "topm", top_m=2)[0].key == ("short.py",)


def test_file_level_rankings_are_fused_when_grouping_files() -> None:
    only_lexical = _doc("d.py", "z", 1)
    ranking = Ranking(list(RANKING), file_lists=[(["d.py", "c.py"], 1.0)],
                      file_best={"d.py": only_lexical}, rrf_k=60)
    files = group_ranking(ranking, "file", "max")
    scores = {g.key[0]: g.score for g in files}
    # Chunk-based order a, b, c; file list d, c: c is in both.
    assert scores["c.py"] == pytest.approx(1 / 63 + 1 / 62)
    assert scores["d.py"] == pytest.approx(1 / 61)
    assert scores["a.py"] == pytest.approx(1 / 61)
    assert files[0].key == ("c.py",)
    assert next(g for g in files if g.key == ("d.py",)).best is only_lexical
    # Other levels ignore file lists.
    assert [g.key for g in group_ranking(ranking, "chunk")] == [
        g.key for g in group(RANKING, "chunk")]


def test_unknown_level_or_aggregation() -> None:
    with pytest.raises(ValueError):
        group(RANKING, "module")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        group(RANKING, "file", "median")  # type: ignore[arg-type]


# -- the hybrid ranker over real components --------------------------------------------

CHUNKS = [
    Chunk("net/upload.py", 1, 12, "python", "Uploader > upload",
          "def upload(self, path):\n    for attempt in range(self.retries):\n"
          "        try:\n            return self.client.put(path)\n"
          "        except ConnectionError:\n            time.sleep(delay)\n"),
    Chunk("auth/password.py", 1, 6, "python", "hash_password",
          "def hash_password(password):\n    salt = os.urandom(16)\n"
          "    return pbkdf2_hmac('sha256', password, salt)\n"),
    Chunk("auth/password.py", 8, 12, "python", "verify_password",
          "def verify_password(password, stored):\n"
          "    return compare_digest(hash_password(password), stored)\n"),
    Chunk("web/cart.js", 1, 8, "javascript", "cartTotal",
          "function cartTotal(items, taxRate) {\n  let total = 0;\n"
          "  for (const item of items) total += item.price;\n  return total;\n}\n"),
]


class _Vectors:
    """Exact cosine neighbours over plain vectors (the store minus its encryption)."""

    def __init__(self, chunks: Sequence[Chunk], model: HashingEmbedder) -> None:
        self.docs = [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language)
                     for c in chunks]
        self.m = model.embed([c.embed_text for c in chunks])

    def nearest(self, v: np.ndarray, n: int, *, keep=None) -> list[tuple[ChunkLocation, float]]:
        s = self.m @ v
        order = [i for i in np.argsort(-s) if keep is None or keep(self.docs[i])][:n]
        return [(self.docs[i], float(s[i])) for i in order]


@pytest.fixture
def ranker() -> HybridRanker:
    model = HashingEmbedder()
    return HybridRanker(LexicalIndex.from_chunks(CHUNKS), model.embed,
                        _Vectors(CHUNKS, model).nearest, default_counter().count, 40)


def test_hybrid_ranking_fuses_every_source(ranker: HybridRanker) -> None:
    r = ranker.rank("verify_password fails when stored hash differs")
    assert r.chunks[0][0].symbol == "verify_password"
    # auth/password.py is small and named by the query's word "password": the path vote.
    assert set(r.sources) == {"vector", "lexical", "evidence", "path"}
    assert r.matched["symbols"] == ["verify_password"]
    keys = [d.key for d, _ in r.chunks]
    assert len(keys) == len(set(keys))  # one entry per chunk however many sources found it
    scores = [s for _, s in r.chunks]
    assert scores == sorted(scores, reverse=True)


def test_long_query_is_split_and_every_part_searched(ranker: HybridRanker) -> None:
    long = ("cart total of items price with tax rate. " * 8 + "\n\n"
            + "upload retries client put after connection error. " * 8)
    # Each part finds its own chunk, and both lead the ranking (best cosine over parts).
    r = ranker.rank(long, SearchOptions(hybrid=False, evidence=False, split="max"))
    assert r.parts >= 2
    assert {r.chunks[0][0].path, r.chunks[1][0].path} == {"web/cart.js", "net/upload.py"}
    # Without splitting the query is one vector (its windows averaged).
    assert ranker.rank(long, SearchOptions(split="none")).parts == 1


def test_a_long_querys_parts_can_be_searched_at_once() -> None:
    model = HashingEmbedder()
    vectors = _Vectors(CHUNKS, model)
    calls: list[int] = []

    def each(vs: np.ndarray, n: int) -> list[list[tuple[ChunkLocation, float]]]:
        calls.append(len(vs))
        return [vectors.nearest(v, n) for v in vs]

    lexical = LexicalIndex.from_chunks(CHUNKS)
    one_by_one = HybridRanker(lexical, model.embed, vectors.nearest, default_counter().count, 40)
    at_once = HybridRanker(lexical, model.embed, vectors.nearest, default_counter().count, 40,
                           nearest_each=each)
    long = ("cart total of items price with tax rate. " * 8 + "\n\n"
            + "upload retries client put after connection error. " * 8)
    want = one_by_one.rank(long)
    got = at_once.rank(long)
    assert calls == [got.parts] and got.parts >= 2
    assert [d.key for d, _ in got.chunks] == [d.key for d, _ in want.chunks]
    # A filter asks each part on its own (its search widens until enough are kept).
    at_once.rank(long, keep=lambda d: d.path.endswith(".py"))
    assert calls == [got.parts]


def test_prose_query_gives_bm25_a_smaller_vote(ranker: HybridRanker) -> None:
    only_bm25 = SearchOptions(w_vector=0.0, evidence=False, w_lexical=1.0, w_path=0.0,
                              w_lexical_prose=0.25, w_lexical_prose_peaked=None)
    prose = ranker.rank("password fails when the stored hash differs", only_bm25)
    code = ranker.rank("verify_password fails when the stored hash differs", only_bm25)
    # The best BM25 chunk's fused score is its one vote: weight / (k + 1).
    assert prose.chunks[0][1] == pytest.approx(0.25 / (only_bm25.rrf_k + 1))
    assert code.chunks[0][1] == pytest.approx(1.0 / (only_bm25.rrf_k + 1))
    same = ranker.rank("password fails when the stored hash differs",
                       replace(only_bm25, w_lexical_prose=None))
    assert same.chunks[0][1] == pytest.approx(1.0 / (only_bm25.rrf_k + 1))


def test_a_prose_query_whose_words_single_out_a_chunk_gets_bm25_back() -> None:
    # 40 handlers share the words "request" and "page"; one chunk alone says "invoice".
    chunks = [Chunk(f"pkg/mod{i}.py", 1, 3, "python", f"handler_{i}",
                    f"def handler_{i}(request):\n    return render(request, 'page {i}')\n")
              for i in range(40)]
    chunks.append(Chunk("billing/invoice.py", 1, 3, "python", "send_invoice",
                        "def send_invoice(customer):\n    mail(customer, invoice_pdf())\n"))
    model = HashingEmbedder()
    ranker = HybridRanker(LexicalIndex.from_chunks(chunks), model.embed,
                          _Vectors(chunks, model).nearest, default_counter().count, 40)
    only_bm25 = SearchOptions(w_vector=0.0, evidence=False, w_lexical_prose=0.25, w_path=0.0,
                              w_lexical_prose_peaked=1.0, prose_peak_ratio=2.0)
    top = 1.0 / (only_bm25.rrf_k + 1)
    # Flat: every handler matches a little, so BM25 keeps its small prose vote.
    flat = ranker.rank("render the page for a request", only_bm25)
    assert flat.chunks[0][1] == pytest.approx(0.25 * top)
    # Peaked: the best chunk scores far above the tenth, so BM25 gets a full vote.
    peaked = ranker.rank("mail the invoice to a customer", only_bm25)
    assert peaked.chunks[0][0].path == "billing/invoice.py"
    assert peaked.chunks[0][1] == pytest.approx(top)
    off = ranker.rank("mail the invoice to a customer",
                      replace(only_bm25, w_lexical_prose_peaked=None))
    assert off.chunks[0][1] == pytest.approx(0.25 * top)


def test_filters_apply_to_every_source(ranker: HybridRanker) -> None:
    lex = ranker.lexical
    r = ranker.rank("password upload cart", mask=lex.mask(HitFilter(path="auth/*")),
                    keep=lambda d: d.path.startswith("auth/"))
    assert r.chunks and {d.path for d, _ in r.chunks} == {"auth/password.py"}


def test_a_narrow_filter_still_gets_its_vector_vote() -> None:
    # 300 chunks; the filter keeps the 3 of one file. The vector side must rank those 3,
    # not the kept few of a fixed over-fetch of the unfiltered nearest (none, here).
    chunks = [Chunk(f"pkg/mod{i}.py", 1, 3, "python", f"handler_{i}",
                    f"def handler_{i}(request):\n    return render(request, 'page{i}')\n")
              for i in range(297)]
    chunks += [Chunk("billing/tax.py", 1 + 4 * j, 4 + 4 * j, "python", f"rate_{j}",
                     f"def rate_{j}(region):\n    return TABLE[region] * {j}\n")
               for j in range(3)]
    model = HashingEmbedder()
    lexical = LexicalIndex.from_chunks(chunks)
    ranker = HybridRanker(lexical, model.embed, _Vectors(chunks, model).nearest,
                          default_counter().count, 40)
    keep = HitFilter(path="billing/*")
    options = SearchOptions(depth=10, evidence=False, hybrid=False)
    r = ranker.rank("render the page for a request", options, mask=lexical.mask(keep),
                    keep=keep)
    assert r.sources["vector"] == 3
    assert {d.path for d, _ in r.chunks} == {"billing/tax.py"}


# -- through Index.search -------------------------------------------------------------


def test_index_search_levels(sample_repo, hashing_embedder) -> None:
    from retrieval import Index, SearchError

    with Index(sample_repo, embedder=hashing_embedder) as idx:
        idx.index(wait=True)
        chunks = idx.search("hash_password salt pbkdf2", k=5)
        assert chunks[0].path == "auth/password.py" and "hash_password" in chunks[0].symbol
        assert "def hash_password" in chunks[0].text
        files = idx.search("password", k=10, group="file")
        assert len({h.path for h in files}) == len(files)
        assert files[0].path == "auth/password.py"
        symbols = idx.search("upload retries", k=10, group="symbol")
        keys = [(h.path, h.symbol) for h in symbols]
        assert len(set(keys)) == len(keys)
        assert keys[0][0] == "net/upload.py"
        assert {h.path for h in idx.search("distance", k=10, language="go")} == {
            "geo/distance.go"}
        with pytest.raises(SearchError):
            idx.search("x", group="module")

        # An edited file: the lexical side follows the next sync.
        (sample_repo / "auth" / "password.py").write_text(
            "def rotate_signing_secret(vault):\n    return vault.rotate()\n")
        idx.index(wait=True)
        top = idx.search("rotate_signing_secret", k=1, group="symbol")[0]
        assert (top.path, top.symbol, top.stale) == (
            "auth/password.py", "rotate_signing_secret", False)


def test_stop_words_leave_bm25_for_queries_that_name_code(ranker: HybridRanker) -> None:
    only_bm25 = SearchOptions(w_vector=0.0, evidence=False, stopwords=False)
    stop = replace(only_bm25, stopwords=True)

    def paths(q: str, o: SearchOptions) -> set[str]:
        return {d.path for d, _ in ranker.rank(q, o).chunks}

    # "for" and "in" appear in upload.py's and cart.js's code, `verify_password` only in
    # password.py.
    q = "verify_password is wrong for values stored in it"
    assert paths(q, only_bm25) == {"auth/password.py", "net/upload.py", "web/cart.js"}
    assert paths(q, stop) == {"auth/password.py"}
    # A query in plain words leaves out stop words and a question's frame words too;
    # asked to keep them, it does.
    plain = "password is wrong for values stored in it"
    assert paths(plain, stop) == {"auth/password.py"}
    assert "net/upload.py" in paths(plain, replace(stop, question_words_out=False))


def test_header_vectors_are_a_second_vector_ranking() -> None:
    model = HashingEmbedder()
    headers = [Chunk(c.path, c.start_line, c.end_line, c.language, c.symbol, "")
               for c in CHUNKS]

    class _Headers(_Vectors):
        def __init__(self) -> None:
            super().__init__(CHUNKS, model)
            self.m = model.embed([c.header for c in headers])

    r = HybridRanker(LexicalIndex.from_chunks(CHUNKS), model.embed,
                     _Vectors(CHUNKS, model).nearest, default_counter().count, 40,
                     nearest_header=_Headers().nearest)
    plain = r.rank("cart total", SearchOptions(hybrid=False, evidence=False,
                                               w_header_vector=0.0,
                                               w_header_vector_prose=0.0))
    assert set(plain.sources) == {"vector"}
    both = r.rank("cart total", SearchOptions(hybrid=False, evidence=False,
                                              w_header_vector_prose=0.5))
    assert set(both.sources) == {"vector", "header_vector"}
    assert both.chunks[0][0].path == "web/cart.js"
    # Its vote adds to the vector ranking's: the top chunk's fused score grows.
    assert both.chunks[0][1] > plain.chunks[0][1]
    # By default a query that names code gets the header vote, one in plain words not.
    assert "header_vector" in r.rank("the total in web/cart.js is wrong").sources
    assert "header_vector" not in r.rank("cart total").sources


def test_default_file_aggregation_lets_a_files_best_chunk_dominate() -> None:
    ranking = [(_doc("b.py", "one", 1), 1.0), (_doc("a.py", "f", 1), 0.5),
               (_doc("a.py", "g", 20), 0.5), (_doc("a.py", "h", 40), 0.5)]
    # decay: b.py 1.0 against a.py 0.875; topm would rank a.py (1.5) over b.py (1.0).
    assert [g.key[0] for g in group(ranking, "file")] == ["b.py", "a.py"]
    assert [g.key[0] for g in group(ranking, "file", "topm")] == ["a.py", "b.py"]
