"""The embedder interface, the embedding cache, and the real model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.embed_cache import CachedEmbedder, EmbeddingCache, cache_key
from indexer.embedder import (
    MINILM_MAX_TOKENS,
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    token_windows,
)
from indexer.embedder_registry import default_embedder
from indexer.errors import EmbedderError


class CountingEmbedder(Embedder):
    """Wraps the hashing embedder and records every text the model is asked for."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder(dim=32)
        self.model_id, self.dim, self.max_tokens = "counting", 32, 8
        self.seen: list[str] = []
        self.batches: list[list[str]] = []

    def windows(self, text: str) -> list[str]:
        words = text.split()
        return [" ".join(words[i : i + self.max_tokens]) for i in range(0, len(words), 8)] or [""]

    def embed_batch(self, texts):
        self.seen.extend(texts)
        self.batches.append(list(texts))
        return self.inner.embed_batch(texts)


def test_duplicates_embedded_once_and_batches_sorted_by_length() -> None:
    model = CountingEmbedder()
    texts = ["b b b b", "a", "b b b b", "c c", "a"]
    vecs = model.embed(texts, batch_size=2)
    assert sorted(model.seen) == sorted({"a", "b b b b", "c c"})
    flat = [t for batch in model.batches for t in batch]
    assert [len(t) for t in flat] == sorted(len(t) for t in flat)
    assert np.allclose(vecs[0], vecs[2]) and np.allclose(vecs[1], vecs[4])
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_long_text_is_windowed_and_pooled_not_truncated() -> None:
    model = CountingEmbedder()
    long_text = " ".join(f"w{i}" for i in range(20))  # 3 windows of <= 8 words
    vec = model.embed([long_text])[0]
    assert len(model.seen) == 3
    assert "w19" in model.seen[-1] or any("w19" in s for s in model.seen)
    pieces = model.inner.embed_batch(model.windows(long_text))
    expected = pieces.sum(axis=0)
    assert np.allclose(vec, expected / np.linalg.norm(expected), atol=1e-5)


def test_windows_of_a_long_line_fit_the_model_once_tokenized_alone() -> None:
    # A regex of unit names on one line, as astropy has: a window cut inside a word leaves
    # the word's tail to be tokenized as a word of its own, which can take more pieces.
    from indexer.embedder_registry import minilm_embedder
    from indexer.tokens import get_tokenizer

    units = [p + u for p in ("mega", "micro", "milli", "nano", "peta", "pico", "kilo",
                             "giga", "tera", "femto")
             for u in ("arcminute", "arcsecond", "degree", "radian")]
    units += ["narcmin", "narcsec", "ndeg", "nrad", "parcmin", "parcsec", "pdeg"]
    text = "def f():\n    x = '" + "|".join(f"(?:{u})" for u in units * 6) + "'\n"
    tok = get_tokenizer()

    def pieces(t: str) -> int:
        return len(tok.encode(t, add_special_tokens=False).ids)

    cut = token_windows(text, tok.encode(text, add_special_tokens=False).offsets,
                        MINILM_MAX_TOKENS)
    assert max(pieces(w) for w in cut) > MINILM_MAX_TOKENS  # the case is really here
    for model in (minilm_embedder("int8"), SentenceTransformerEmbedder()):
        windows = model.windows(text)
        assert max(pieces(w) for w in windows) <= MINILM_MAX_TOKENS
        assert sum(pieces(w) for w in windows) >= pieces(text)  # nothing dropped
        assert windows[-1].endswith("(?:pdeg)'")


def test_cache_hit_skips_the_model_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "emb.sqlite"
    model = CountingEmbedder()
    first = CachedEmbedder(model, EmbeddingCache(path)).embed(["x y", "z"])
    assert (first.embedded, first.from_cache) == (2, 0)
    model.seen.clear()
    again = CachedEmbedder(model, EmbeddingCache(path)).embed(["z", "x y", "new"])
    assert model.seen == ["new"]
    assert (again.embedded, again.from_cache) == (1, 2)
    assert np.allclose(again.vectors[0], first.vectors[1])


def test_cache_knows_which_keys_it_holds_across_lookup_batches(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path / "emb.sqlite")
    stored = [cache_key("m", f"text {i}") for i in range(1000)]  # more than one lookup batch
    cache.put_many([(k, np.ones(4, dtype=np.float32)) for k in stored])
    absent = [cache_key("m", f"other {i}") for i in range(500)]
    assert cache.known(absent + stored[::2]) == set(stored[::2])
    assert cache.known([]) == set()


def test_cache_key_depends_on_model_and_text() -> None:
    assert cache_key("m1", "t") != cache_key("m2", "t")
    assert cache_key("m1", "t") != cache_key("m1", "t ")
    assert cache_key("m", "a\0b") != cache_key("m\0a", "b")


def test_unknown_embedder_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_EMBEDDER", "nope")
    with pytest.raises(EmbedderError, match="CODEVEIL_EMBEDDER"):
        default_embedder()


def test_real_model_ranks_related_code_first(real_embedder) -> None:
    vecs = real_embedder.embed([
        "retry the upload with exponential backoff",
        "def upload(path):\n    for attempt in range(5):\n        try: return put(path)\n"
        "        except ConnectionError: sleep(2 ** attempt)",
        "def area(r):\n    return 3.14159 * r * r",
    ])
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.1


def test_real_model_windows_fit_the_model(real_embedder) -> None:
    from indexer.tokens import TokenCounter

    text = "\n".join(f"value_{i} = compute_something({i}, other_{i})" for i in range(200))
    pieces = real_embedder.windows(text)
    counter = TokenCounter()
    assert len(pieces) > 1
    assert all(counter.count(p) <= real_embedder.max_tokens for p in pieces)
    # Cut at line starts: every line is whole in exactly one piece.
    for i in (0, 57, 199):
        line = f"value_{i} = compute_something({i}, other_{i})"
        assert sum(line in p for p in pieces) == 1, line
    assert all(p.startswith("value_") for p in pieces)


def test_batches_hold_a_budget_of_word_pieces() -> None:
    from indexer.embedder import CHARS_PER_TOKEN, MINILM_MAX_TOKENS, token_batches

    lengths = sorted([10] * 100 + [300] * 40 + [5000] * 40)  # short, middling, window-long
    batches = token_batches(lengths, 64, 8192)
    assert [i for b in batches for i in b] == list(range(len(lengths)))  # order kept
    for b in batches:
        longest = min(lengths[b[-1]] // CHARS_PER_TOKEN + 2, MINILM_MAX_TOKENS + 2)
        assert len(b) <= 64 and (len(b) * longest <= 8192 or len(b) == 1)
    assert len(batches[0]) == 64  # short texts fill a whole batch
    # Window-long texts go 32 to a batch (8192 / 256), where 64 went before the budget.
    assert max(len(b) for b in batches if lengths[b[-1]] == 5000) == 8192 // 256
    assert token_batches([10**6], 64, 1) == [[0]]  # one text however long
