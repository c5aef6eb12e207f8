"""The lexical index: code tokens, BM25 ranking and scores, kept in step with the chunk table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import bm25s
import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.lexical_tokens import tokenize
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.lexical import LexicalIndex, LexicalStore, Tokenizer, lexical_text


def _chunk(path: str, text: str, symbol: str = "", start: int = 1) -> Chunk:
    return Chunk(path, start, start + text.count("\n"), "python", symbol, text)


CORPUS = [
    _chunk("net/http.py", "def parseHTTPResponse(raw):\n    return Response(raw)\n",
           "parseHTTPResponse"),
    _chunk("net/retry.py", "def retry_with_backoff(call, attempts=5):\n"
           "    delay = 0.5\n    for _ in range(attempts):\n        call()\n",
           "retry_with_backoff"),
    _chunk("auth/password.py", "def hash_password(pw):\n    return pbkdf2(pw, salt)\n",
           "hash_password"),
    _chunk("docs/readme.md", "Install the package and run the server.\n"),
]


def test_tokenizer_matches_lexical_tokens() -> None:
    text = "def parseHTTPResponse_v2(self): return self.max_retries + 10"
    tok = Tokenizer()
    hashes, tfs, length = tok.counts(text)
    assert length == len(tokenize(text))
    assert int(tfs.sum()) == length
    assert list(hashes) == sorted(hashes)
    # Whole identifiers and their parts are both terms.
    assert {"parsehttpresponse_v2", "parse", "http", "response", "max_retries",
            "retries"} <= set(tokenize(text))


def test_ranks_by_identifier_parts_path_and_symbol() -> None:
    idx = LexicalIndex.from_chunks(CORPUS)
    top = idx.top("parse the http response", 2)
    assert idx.doc(top[0][0]).path == "net/http.py"
    # Split identifier parts match words; the whole identifier matches exactly.
    assert idx.doc(idx.top("retry backoff", 1)[0][0]).symbol == "retry_with_backoff"
    assert idx.doc(idx.top("retry_with_backoff", 1)[0][0]).path == "net/retry.py"
    # The path is part of the indexed text.
    assert idx.doc(idx.top("auth password", 1)[0][0]).path == "auth/password.py"
    assert idx.top("quantum chromodynamics", 5) == []


def test_question_words_meet_code_words_by_their_stems() -> None:
    idx = LexicalIndex.from_chunks(CORPUS)
    # "retries", "hashing" and "passwords" are none of the code's own forms.
    assert idx.doc(idx.top("how are retries attempted", 1)[0][0]).path == "net/retry.py"
    assert idx.doc(idx.top("hashing passwords", 1)[0][0]).path == "auth/password.py"
    assert idx.doc(idx.top("parsing responses", 1)[0][0]).path == "net/http.py"


def test_scores_equal_bm25s_lucene() -> None:
    idx = LexicalIndex.from_chunks(CORPUS)
    corpus_tokens = [tokenize(lexical_text(c)) for c in CORPUS]
    ref = bm25s.BM25(method="lucene", k1=idx.k1, b=idx.b)
    ref.index(corpus_tokens, show_progress=False)
    for query in ("parse http response", "retry password salt", "install server"):
        q = [t for t in dict.fromkeys(tokenize(query)) if t in ref.vocab_dict]
        expected = ref.get_scores(q)
        np.testing.assert_allclose(idx.scores(query), expected, rtol=1e-5, atol=1e-6)


def test_file_scores_equal_bm25s_over_whole_files() -> None:
    chunks = [*CORPUS, _chunk("net/http.py", "def send(request):\n    return http(request)\n",
                              "send", start=5)]
    idx = LexicalIndex.from_chunks(chunks)
    paths, _ = idx.file_scores("x")
    file_tokens = [[t for c in chunks if c.path == p for t in tokenize(lexical_text(c))]
                   for p in paths]
    ref = bm25s.BM25(method="lucene", k1=idx.k1, b=idx.b)
    ref.index(file_tokens, show_progress=False)
    for query in ("http request response", "password salt", "net"):
        q = [t for t in dict.fromkeys(tokenize(query)) if t in ref.vocab_dict]
        np.testing.assert_allclose(idx.file_scores(query)[1], ref.get_scores(q), rtol=1e-5)
    assert idx.file_top("http request", 1)[0][0] == "net/http.py"


def test_max_terms_keeps_the_rarest_query_terms() -> None:
    idx = LexicalIndex.from_chunks(CORPUS)
    # "def" is in three chunks, "pbkdf2" in one: with one term only pbkdf2 counts.
    full = idx.scores("def pbkdf2")
    rare = idx.scores("def pbkdf2", max_terms=1)
    assert (full > 0).sum() == 3 and (rare > 0).sum() == 1
    assert idx.doc(int(np.argmax(rare))).path == "auth/password.py"
    np.testing.assert_allclose(idx.scores("def pbkdf2", max_terms=5), full)


def test_filters_mask_path_and_language() -> None:
    idx = LexicalIndex.from_chunks(CORPUS)
    mask = idx.mask(HitFilter(path="net/*"))
    assert mask is not None
    hits = idx.top("def return", 10, mask=mask)
    assert {idx.doc(i).path for i, _ in hits} == {"net/http.py", "net/retry.py"}
    md = idx.mask(HitFilter(language="text"))
    assert md is not None and not md.any()


def _write(lc: LocalChunks, path: str, chunks: list[Chunk], digest: bytes) -> None:
    lc.replace_files([(path, digest.ljust(16, b"\0"), chunks)])


def _files(n: int) -> dict[str, list[Chunk]]:
    return {
        f"pkg/mod{i}.py": [
            _chunk(f"pkg/mod{i}.py", f"def function_{i}_{j}(value):\n    return value * {j}\n",
                   f"function_{i}_{j}", start=1 + 3 * j)
            for j in range(3)
        ]
        for i in range(n)
    }


@pytest.fixture
def table(tmp_path: Path) -> tuple[sqlite3.Connection, LocalChunks, Path]:
    db = open_state_db(tmp_path / "state.sqlite")
    return db, LocalChunks(db), tmp_path / "lexical"


def test_store_updates_incrementally_after_a_change(table) -> None:
    db, lc, folder = table
    for path, chunks in _files(30).items():
        _write(lc, path, chunks, path.encode())
    store = LexicalStore(folder)
    idx = store.current(db)
    assert len(idx) == 90 and store.last_refresh["mode"] == "rebuild"
    assert store.current(db) is idx  # nothing changed: the same index, no refresh

    # Replace one file: only its chunks are tokenized again.
    _write(lc, "pkg/mod3.py", [_chunk("pkg/mod3.py", "def brand_new_helper():\n    pass\n",
                                      "brand_new_helper")], b"new")
    idx = store.current(db)
    assert store.last_refresh["mode"] == "update"
    assert store.last_refresh["tokenized"] == 1
    assert idx.live == 88
    assert idx.doc(idx.top("brand_new_helper", 1)[0][0]).path == "pkg/mod3.py"
    # The file's old chunks are gone (its new chunk still matches "3" by its path).
    assert all(idx.doc(i).symbol != "function_3_1" for i, _ in idx.top("function_3_1", 90))

    # Delete a file: its chunks are gone from results.
    lc.remove_files(["pkg/mod4.py"])
    idx = store.current(db)
    assert idx.live == 85
    assert "pkg/mod4.py" not in idx.paths()
    assert all(idx.doc(i).path != "pkg/mod4.py" for i, _ in idx.top("function_4_0", 10))

    # A new store (another process) loads base + delta from disk without re-tokenizing.
    other = LexicalStore(folder)
    again = other.current(db)
    assert other.last_refresh == {}
    np.testing.assert_allclose(again.scores("function value"), idx.scores("function value"))


def test_merged_index_scores_as_a_fresh_build(table) -> None:
    db, lc, folder = table
    files = _files(20)
    for path, chunks in files.items():
        _write(lc, path, chunks, path.encode())
    store = LexicalStore(folder)
    store.current(db)
    # Change a quarter of the files: the delta outgrows the merge threshold.
    for i in range(5):
        path = f"pkg/mod{i}.py"
        files[path] = [_chunk(path, f"def replaced_{i}(x):\n    return x\n", f"replaced_{i}")]
        _write(lc, path, files[path], b"v2" + bytes([i]))
    idx = store.current(db)
    assert store.last_refresh["merged"] == 1
    assert idx.delta is None and not idx.deleted.any()
    rows = list(LocalChunks(db).iter_all())
    fresh = LexicalIndex.from_chunks([c for _, c in rows])
    for q in ("replaced value", "function_7_2 return", "x"):
        got = sorted((idx.doc(i).key, round(s, 4)) for i, s in idx.top(q, 100))
        want = sorted((fresh.doc(i).key, round(s, 4)) for i, s in fresh.top(q, 100))
        assert got == want


def test_delta_weights_use_collection_statistics(table) -> None:
    db, lc, folder = table
    for path, chunks in _files(40).items():
        _write(lc, path, chunks, path.encode())
    store = LexicalStore(folder)
    store.current(db)
    _write(lc, "pkg/mod0.py", [_chunk("pkg/mod0.py", "def function_0_0(value):\n"
                                      "    return value * 0\n", "function_0_0")], b"x")
    idx = store.current(db)
    assert idx.delta is not None  # one file of forty: no merge
    # The same text scores the same in the delta as an untouched copy in the base would.
    rows = [c for _, c in LocalChunks(db).iter_all()]
    fresh = LexicalIndex.from_chunks(rows)
    top_delta = idx.top("function_0_0", 1)[0][1]
    top_fresh = fresh.top("function_0_0", 1)[0][1]
    assert top_delta == pytest.approx(top_fresh, rel=0.05)


def test_recreated_database_rebuilds(table, tmp_path: Path) -> None:
    db, lc, folder = table
    for path, chunks in _files(3).items():
        _write(lc, path, chunks, path.encode())
    LexicalStore(folder).current(db)
    db.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"state.sqlite{suffix}").unlink(missing_ok=True)
    db2 = open_state_db(tmp_path / "state.sqlite")
    lc2 = LocalChunks(db2)
    _write(lc2, "other.py", [_chunk("other.py", "def lonely():\n    pass\n", "lonely")], b"o")
    store = LexicalStore(folder)
    idx = store.current(db2)
    assert store.last_refresh["mode"] == "rebuild"
    assert idx.paths() == ["other.py"]


@pytest.mark.parametrize("damage", ["truncate base", "truncate delta", "garble base"])
def test_a_damaged_index_file_is_rebuilt_not_fatal(table, damage: str) -> None:
    db, lc, folder = table
    for path, chunks in _files(5).items():
        _write(lc, path, chunks, path.encode())
    want = LexicalStore(folder).current(db).scores("function value")
    target = folder / ("delta.npz" if "delta" in damage else "base.npz")
    data = target.read_bytes()
    if damage.startswith("truncate"):
        target.write_bytes(data[: len(data) // 2])
    else:
        target.write_bytes(data[:40] + bytes(b ^ 0x5A for b in data[40:200]) + data[200:])
    store = LexicalStore(folder)  # another process, finding the damaged file
    idx = store.current(db)
    assert store.last_refresh["mode"] == "rebuild"
    np.testing.assert_allclose(idx.scores("function value"), want)
    assert LexicalStore(folder).current(db).live == 15  # and the rebuilt one was saved


def test_counting_many_texts_at_once_equals_one_by_one() -> None:
    texts = ["", "   ", "def parseHTTPResponse2(self, x_y): return x_y + 42",
             "__init__ __ _ a a a A", "naïve café 123 456 123", "x" * 300,
             "class Session:\n    def send(self): pass\n" * 3]
    one, many = Tokenizer(), Tokenizer()
    for want, got in zip([one.counts(t) for t in texts], many.counts_many(texts),
                         strict=True):
        np.testing.assert_array_equal(want[0], got[0])
        np.testing.assert_array_equal(want[1], got[1])
        assert want[2] == got[2]
        assert got[0].dtype == np.uint64 and got[1].dtype == np.int32
    assert many.counts_many([]) == []
    assert [c[2] for c in many.counts_many(["", "  ", "?!"])] == [0, 0, 0]
