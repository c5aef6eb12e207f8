"""Code tokens of what the lexical index reads, as term hashes.

A chunk is read as the text the model embeds (`lexical_text`) and split as
`indexer.lexical_tokens.tokenize` splits it; each token is identified by the 64-bit
xxh3 hash of its stem (`term_hash`).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import xxhash

from indexer.chunk import Chunk
from indexer.lexical_tokens import stem, tokenize

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


def term_hash(token: str) -> int:
    """The term a token counts as: the hash of its stem, so that a question's `retries`
    meets the code's `retry` (indexer.lexical_tokens.stem)."""
    return xxhash.xxh3_64_intdigest(stem(token).encode("utf-8"))


class Tokenizer:
    """`indexer.lexical_tokens.tokenize` with each distinct word's split remembered.

    A code base repeats a few tens of thousands of words; splitting and hashing each once
    is what makes tokenizing a large repo affordable. Same tokens as `tokenize(text)`.
    """

    def __init__(self, limit: int = 1 << 18) -> None:
        self._words: dict[str, tuple[int, ...]] = {}
        self._limit = limit

    def _split(self, word: str) -> tuple[int, ...]:
        if len(self._words) >= self._limit:
            self._words.clear()
        parts = self._words[word] = tuple(term_hash(t) for t in tokenize(word))
        return parts

    def counts(self, text: str) -> tuple[np.ndarray, np.ndarray, int]:
        """(sorted unique term hashes, their counts, token count) of `text`."""
        acc: Counter[int] = Counter()
        words = self._words
        for word, n in Counter(_WORD.findall(text)).items():
            parts = words.get(word)
            if parts is None:
                parts = self._split(word)
            for h in parts:
                acc[h] += n
        if not acc:
            return np.zeros(0, np.uint64), np.zeros(0, np.int32), 0
        hashes = np.fromiter(acc.keys(), dtype=np.uint64, count=len(acc))
        tfs = np.fromiter(acc.values(), dtype=np.int32, count=len(acc))
        order = np.argsort(hashes)
        return hashes[order], tfs[order], int(tfs.sum())

    def counts_many(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """`counts(text)` of each text, computed for all of them at once.

        Per text, only the regex runs in Python's loop; the words are mapped to ids in
        one pass and expanded to term hashes and per-doc counts with numpy: a first
        build of 27,671 chunks (what a first index's first search waits for) went from
        21.3 s to 9.5 s of which the rest is the regex, new words' splitting and the
        segment's assembly.
        """
        per_doc = [_WORD.findall(t) for t in texts]
        lens = np.fromiter(map(len, per_doc), np.int64, len(per_doc))
        vocab: dict[str, int] = {}
        ids = np.fromiter((vocab.setdefault(w, len(vocab)) for ws in per_doc for w in ws),
                          np.int64, int(lens.sum()))
        words = self._words
        parts = [words[w] if w in words else self._split(w) for w in vocab]
        plen = np.fromiter(map(len, parts), np.int64, len(parts))
        pptr = np.concatenate(([0], np.cumsum(plen)))
        phash = np.fromiter(itertools.chain.from_iterable(parts), np.uint64, int(pptr[-1]))
        occ = plen[ids]  # term hashes each word occurrence stands for
        term_doc = np.repeat(np.repeat(np.arange(len(texts)), lens), occ)
        offsets = np.arange(int(occ.sum())) - np.repeat(np.cumsum(occ) - occ, occ)
        terms = phash[np.repeat(pptr[ids], occ) + offsets]
        order = np.lexsort((terms, term_doc))
        d, h = term_doc[order], terms[order]
        first = (np.flatnonzero(np.r_[True, (d[1:] != d[:-1]) | (h[1:] != h[:-1])])
                 if len(h) else np.zeros(0, np.int64))
        tfs = np.diff(np.r_[first, len(h)]).astype(np.int32)
        doc_ptr = np.searchsorted(d[first], np.arange(len(texts) + 1))
        return [(h[first[a:b]], tfs[a:b], int(tfs[a:b].sum()))
                for a, b in itertools.pairwise(doc_ptr)]

    def query_hashes(self, text: str) -> list[int]:
        """Term hashes of every token of a query, in order (repeats kept)."""
        out: list[int] = []
        for word in _WORD.findall(text):
            parts = self._words.get(word)
            out.extend(parts if parts is not None else self._split(word))
        return out


def lexical_text(chunk: Chunk) -> str:
    """What the lexical index reads of a chunk: the text the model embeds."""
    return chunk.embed_text


def _counts_of(tok: Tokenizer, texts: Sequence[str],
               batch: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """`tok.counts` of each text, a batch at a time (bounded memory)."""
    for start in range(0, len(texts), batch):
        yield from tok.counts_many(texts[start : start + batch])
