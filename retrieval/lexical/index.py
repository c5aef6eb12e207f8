"""BM25 over the client's own chunk table: the lexical half of hybrid search.

The index covers exactly the chunks of `indexer.local_chunks` (the ones whose vectors the
store holds), each read as the text the model embeds (`path > symbol` header, then the
code) and tokenized by `indexer.lexical_tokens.tokenize` (identifiers split on case and
underscores, the whole identifier kept). It holds code tokens, so it lives only under
`.codeveil/lexical/` and never goes to a server.

Scores are Lucene's BM25, the `bm25s` "lucene" variant (a test pins equality with
`bm25s.BM25(method="lucene")` on the same tokens):

    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
    w(t, d)  = idf(t) * tf / (tf + k1 * (1 - b + b * len(d) / avglen))

Keeping it current: segments. `bm25s` only builds from scratch, and at 100k chunks a
build costs about 16 s inside `bm25s` plus over a minute of tokenizing on this project's
2-core machine; an edit to one file must not cost that. So the index is a large
immutable *base* segment plus a small *delta* segment and a mask of deleted base chunks,
as in Lucene: a refresh compares the chunk table's file list (path -> content digest)
with the one the index was built from, masks the chunks of changed and deleted files,
and tokenizes only the changed files' chunks into a new delta. Segments keep term
frequencies, so when the delta outgrows a tenth of the base the two are merged with
sparse-matrix operations, without tokenizing again. Until a merge, base weights keep the
statistics of their build, as Lucene's do; the delta is weighted with the combined ones.

Terms are identified by a 64-bit xxh3 hash of the token, kept sorted per segment, so a
saved index loads as a handful of arrays (no Python dict of every token).

Knowing when to refresh: triggers on the chunk table's file list bump a counter in the
state database on every insert, replace or delete, whoever writes (`codeveil index`, the
daemon). A search compares that counter (with the chunk count and a random epoch that
changes if the database is recreated) with the one the saved index was built at; when
they agree, checking costs one small query.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import re
import secrets
import sqlite3
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import xxhash

from indexer.chunk import Chunk
from indexer.lexical_tokens import tokenize
from indexer.local_chunks import change_stamp
from indexer.location import ChunkLocation
from indexer.private_files import write_atomic

# Log lines name the package ("retrieval.lexical"), whichever of its modules writes them.
log = logging.getLogger("retrieval.lexical")

FORMAT_VERSION: Final = 3
K1: Final = 1.2
B: Final = 0.75
BASE_FILE: Final = "base.npz"
DELTA_FILE: Final = "delta.npz"
# Merge the delta into the base once it (with the deleted base chunks) passes this share.
MERGE_SHARE: Final = 0.1
# A refresh that would re-tokenize more than this share of chunks rebuilds from scratch.
REBUILD_SHARE: Final = 0.5

# SQLite's limit on host parameters per statement; stay well below it.
_SQL_BATCH: Final = 900

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")

Stamp = tuple[int, int, bytes]  # (change counter, chunk count, database epoch)


#: One indexed chunk: where it sits, enough to fuse it with a vector hit and to show it.
LexDoc = ChunkLocation


def term_hash(token: str) -> int:
    return xxhash.xxh3_64_intdigest(token.encode("utf-8"))


class Tokenizer:
    """`indexer.lexical_tokens.tokenize` with each distinct word's split remembered.

    A code base repeats a few tens of thousands of words; splitting and hashing each once
    is what makes tokenizing a large repo affordable. Same tokens as `tokenize(text)`.
    """

    def __init__(self, limit: int = 1_000_000) -> None:
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


# -- one segment ----------------------------------------------------------------------


@dataclass
class _Counts:
    """Doc-major term counts of docs about to become a segment."""

    docs: list[LexDoc] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    tfs: list[np.ndarray] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def add(self, doc: LexDoc, counted: tuple[np.ndarray, np.ndarray, int]) -> None:
        self.docs.append(doc)
        self.hashes.append(counted[0])
        self.tfs.append(counted[1])
        self.lengths.append(counted[2])


class _Segment:
    """An immutable BM25 segment: term-major term frequencies and weights, doc columns."""

    def __init__(self, arrays: dict[str, np.ndarray], paths: list[str],
                 languages: list[str]) -> None:
        self.a = arrays
        self.paths = paths
        self.languages = languages
        self.terms: np.ndarray = arrays["terms"]  # uint64 [V], sorted
        self.col_ptr: np.ndarray = arrays["col_ptr"]  # int64 [V + 1]
        self.col_docs: np.ndarray = arrays["col_docs"]  # int32 [nnz]
        self.col_tf: np.ndarray = arrays["col_tf"]  # int32 [nnz]
        self.col_w: np.ndarray = arrays["col_w"]  # float32 [nnz]
        self.lengths: np.ndarray = arrays["lengths"]  # int32 [n]
        self.path_id: np.ndarray = arrays["path_id"]  # int32 [n]
        self.lines: np.ndarray = arrays["lines"]  # int32 [n, 2]
        self.lang_id: np.ndarray = arrays["lang_id"]  # int16 [n]
        self.sym_ptr: np.ndarray = arrays["sym_ptr"]  # int64 [n + 1]
        self.sym_blob: np.ndarray = arrays["sym_blob"]  # uint8, utf-8 symbols back to back
        self.hashes: np.ndarray = arrays["hashes"]  # uint8 [n, 16], chunk hashes

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def df(self) -> np.ndarray:
        return np.diff(self.col_ptr)

    def symbol(self, i: int) -> str:
        return self.sym_blob[self.sym_ptr[i] : self.sym_ptr[i + 1]].tobytes().decode("utf-8")

    def doc(self, i: int) -> LexDoc:
        return LexDoc(self.paths[self.path_id[i]], int(self.lines[i, 0]),
                      int(self.lines[i, 1]), self.symbol(i), self.languages[self.lang_id[i]],
                      self.hashes[i].tobytes())

    def columns(self, hashes: np.ndarray) -> np.ndarray:
        """Column of each term hash, -1 where the segment lacks the term."""
        if len(self.terms) == 0:
            return np.full(len(hashes), -1, dtype=np.int64)
        at = np.searchsorted(self.terms, hashes)
        at = np.minimum(at, len(self.terms) - 1)
        return np.where(self.terms[at] == hashes, at, -1)

    def add_scores(self, out: np.ndarray, cols: np.ndarray, times: np.ndarray) -> None:
        for col, t in zip(cols.tolist(), times.tolist(), strict=True):
            if col < 0 or t == 0:
                continue
            lo, hi = self.col_ptr[col], self.col_ptr[col + 1]
            # Doc ids are unique within a column, so a fancy-indexed add is exact.
            out[self.col_docs[lo:hi]] += self.col_w[lo:hi] * t

    # -- building ------------------------------------------------------------------

    @classmethod
    def from_counts(cls, counts: _Counts, stats: _Stats | None, k1: float,
                    b: float) -> _Segment:
        n = len(counts.docs)
        sizes = np.fromiter((len(h) for h in counts.hashes), dtype=np.int64, count=n)
        doc_of = np.repeat(np.arange(n, dtype=np.int32), sizes)
        hashes = (np.concatenate(counts.hashes) if n else np.zeros(0, np.uint64))
        tfs = (np.concatenate(counts.tfs) if n else np.zeros(0, np.int32))
        terms, col = np.unique(hashes, return_inverse=True)
        lengths = np.array(counts.lengths, dtype=np.int32)
        return cls._assemble(terms, col.astype(np.int64), doc_of, tfs, lengths, counts.docs,
                             stats, k1, b)

    @classmethod
    def _assemble(cls, terms: np.ndarray, col: np.ndarray, doc_of: np.ndarray,
                  tfs: np.ndarray, lengths: np.ndarray, docs: Sequence[LexDoc] | _DocCols,
                  stats: _Stats | None, k1: float, b: float) -> _Segment:
        col_ptr, col_docs, col_tf = _csc(col, doc_of, tfs, len(terms))
        df = np.diff(col_ptr)
        idf, avg = (stats or _Stats()).idf_and_avg(terms, df, lengths)
        norm = (k1 * (1 - b + b * lengths / avg)).astype(np.float32)
        tf = col_tf.astype(np.float32)
        col_w = np.repeat(idf, df) * tf / (tf + norm[col_docs])
        cols = docs if isinstance(docs, _DocCols) else _DocCols.of(docs)
        arrays = {
            "terms": terms.astype(np.uint64), "col_ptr": col_ptr, "col_docs": col_docs,
            "col_tf": col_tf, "col_w": col_w.astype(np.float32), "lengths": lengths,
            **cols.arrays,
        }
        return cls(arrays, cols.paths, cols.languages)

    def save(self, path: Path, extra: dict[str, np.ndarray]) -> None:
        _save_npz(path, {**self.a, "paths": _pack(self.paths),
                         "languages": _pack(self.languages), **extra})

    @classmethod
    def load(cls, z: dict[str, np.ndarray]) -> _Segment:
        keys = ("terms", "col_ptr", "col_docs", "col_tf", "col_w", "lengths", "path_id",
                "lines", "lang_id", "sym_ptr", "sym_blob", "hashes")
        return cls({k: z[k] for k in keys}, _unpack(z["paths"]), _unpack(z["languages"]))


@dataclass
class _DocCols:
    """Doc metadata as columns (what a segment stores)."""

    arrays: dict[str, np.ndarray]
    paths: list[str]
    languages: list[str]

    @classmethod
    def of(cls, docs: Sequence[LexDoc]) -> _DocCols:
        path_ids: dict[str, int] = {}
        lang_ids: dict[str, int] = {}
        pid = np.fromiter((path_ids.setdefault(d.path, len(path_ids)) for d in docs),
                          dtype=np.int32, count=len(docs))
        lid = np.fromiter((lang_ids.setdefault(d.language, len(lang_ids)) for d in docs),
                          dtype=np.int16, count=len(docs))
        lines = np.array([(d.start_line, d.end_line) for d in docs], dtype=np.int32)
        syms = [d.symbol.encode("utf-8") for d in docs]
        sym_ptr = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in syms], out=sym_ptr[1:])
        return cls(
            {"path_id": pid, "lines": lines.reshape(-1, 2), "lang_id": lid,
             "sym_ptr": sym_ptr,
             "sym_blob": np.frombuffer(b"".join(syms), dtype=np.uint8).copy(),
             "hashes": _digest_rows([d.chunk_hash for d in docs])},
            list(path_ids), list(lang_ids),
        )

    @classmethod
    def concat(cls, parts: Sequence[tuple[_Segment, np.ndarray]]) -> _DocCols:
        """The metadata of the docs `rows` of each segment, in order."""
        paths: dict[str, int] = {}
        langs: dict[str, int] = {}
        pid, lid, lines, sym_lens, blobs, hashes = [], [], [], [], [], []
        for seg, rows in parts:
            pmap = np.array([paths.setdefault(p, len(paths)) for p in seg.paths] or [0],
                            dtype=np.int32)
            lmap = np.array([langs.setdefault(x, len(langs)) for x in seg.languages] or [0],
                            dtype=np.int16)
            pid.append(pmap[seg.path_id[rows]])
            lid.append(lmap[seg.lang_id[rows]])
            lines.append(seg.lines[rows])
            hashes.append(seg.hashes[rows])
            starts, ends = seg.sym_ptr[rows], seg.sym_ptr[rows + 1]
            sym_lens.append(ends - starts)
            blobs.append(_gather(seg.sym_blob, starts, ends))
        sym_len = np.concatenate(sym_lens)
        sym_ptr = np.zeros(len(sym_len) + 1, dtype=np.int64)
        np.cumsum(sym_len, out=sym_ptr[1:])
        return cls(
            {"path_id": np.concatenate(pid), "lines": np.concatenate(lines).reshape(-1, 2),
             "lang_id": np.concatenate(lid), "sym_ptr": sym_ptr,
             "sym_blob": np.concatenate(blobs), "hashes": np.concatenate(hashes)},
            list(paths), list(langs),
        )


@dataclass
class _Stats:
    """Statistics of the other docs of the collection a new segment joins.

    A segment's weights use the document frequencies and lengths of the whole collection:
    its own docs plus these.
    """

    n: int = 0
    terms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # sorted
    df: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per term
    total_len: int = 0

    def idf_and_avg(self, terms: np.ndarray, own_df: np.ndarray,
                    own_lengths: np.ndarray) -> tuple[np.ndarray, float]:
        df = own_df.astype(np.float64)
        if len(self.terms) and len(terms):
            at = np.minimum(np.searchsorted(self.terms, terms), len(self.terms) - 1)
            df += np.where(self.terms[at] == terms, self.df[at], 0)
        n = self.n + len(own_lengths)
        idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
        avg = (self.total_len + float(own_lengths.sum())) / max(n, 1)
        return idf, max(avg, 1e-9)


def _gather(blob: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """blob[starts[0]:ends[0]] + blob[starts[1]:ends[1]] + ... without a Python loop."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=blob.dtype)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return blob[np.arange(total) + offsets]


def _pack(items: Sequence[str]) -> np.ndarray:
    # NUL never occurs in a path or a language name.
    return np.frombuffer("\0".join(items).encode("utf-8"), dtype=np.uint8).copy()


def _unpack(raw: np.ndarray) -> list[str]:
    text = raw.tobytes().decode("utf-8")
    return text.split("\0") if text else []


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write one .npz atomically and durably (indexer.private_files.write_atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]


# -- the index: base + delta + deleted mask --------------------------------------------


class LexicalIndex:
    """BM25 over chunks: a base segment, a delta segment and the deleted base docs.

    Doc indices run over the base (0..len(base)-1) then the delta. Build one in memory
    with `LexicalIndex.from_chunks`, or keep one in step with a chunk table through
    `LexicalStore`.
    """

    def __init__(self, base: _Segment, delta: _Segment | None = None,
                 deleted: np.ndarray | None = None, *, k1: float = K1, b: float = B,
                 tokenizer: Tokenizer | None = None) -> None:
        self.k1, self.b = k1, b
        self.base = base
        self.delta = delta
        self.deleted = deleted if deleted is not None else np.zeros(len(base), dtype=bool)
        self.tokenizer = tokenizer or Tokenizer()
        self._by_path: dict[str, np.ndarray] | None = None
        self._files: tuple[list[str], np.ndarray, np.ndarray] | None = None
        self._alive = ~self.deleted

    @classmethod
    def from_chunks(cls, chunks: Iterable[Chunk], *, k1: float = K1, b: float = B,
                    texts: Iterable[str] | None = None) -> LexicalIndex:
        """An index of `chunks` (their embedded text, or `texts` when given), in order."""
        tok = Tokenizer()
        counts = _Counts()
        chunk_list = list(chunks)
        text_list = list(texts) if texts is not None else [lexical_text(c) for c in chunk_list]
        for c, counted in zip(chunk_list, _counts_of(tok, text_list), strict=True):
            counts.add(_doc(c), counted)
        return cls(_Segment.from_counts(counts, None, k1, b), k1=k1, b=b, tokenizer=tok)

    # -- reading --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.base) + (len(self.delta) if self.delta is not None else 0)

    @property
    def live(self) -> int:
        """Docs that are not deleted."""
        return int(self._alive.sum()) + (len(self.delta) if self.delta is not None else 0)

    def _seg(self, i: int) -> tuple[_Segment, int]:
        n = len(self.base)
        if i < n:
            return self.base, i
        assert self.delta is not None
        return self.delta, i - n

    def doc(self, i: int) -> LexDoc:
        seg, j = self._seg(i)
        return seg.doc(j)

    def alive(self) -> np.ndarray:
        """bool [len(self)]: docs that are current (not deleted)."""
        if self.delta is None:
            return self._alive
        return np.concatenate([self._alive, np.ones(len(self.delta), dtype=bool)])

    def _query_terms(self, query: str | Sequence[str], dedupe: bool,
                     max_terms: int | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """(base columns, delta columns, weight) of each distinct query term (-1: absent)."""
        if isinstance(query, str):
            hashes = self.tokenizer.query_hashes(query)
        else:
            hashes = [term_hash(t) for t in query]
        counts = Counter(hashes)
        h = np.fromiter(counts.keys(), dtype=np.uint64, count=len(counts))
        times = (np.ones(len(counts), dtype=np.float32) if dedupe
                 else np.fromiter(counts.values(), dtype=np.float32, count=len(counts)))
        base_cols = self.base.columns(h)
        delta_cols = self.delta.columns(h) if self.delta is not None else None
        if max_terms is not None and len(h) > max_terms:
            df = np.where(base_cols >= 0, self.base.df[np.maximum(base_cols, 0)], 0)
            if delta_cols is not None and self.delta is not None:
                df = df + np.where(delta_cols >= 0, self.delta.df[np.maximum(delta_cols, 0)], 0)
            # Unknown terms (df 0) score nothing anyway; rank them last.
            order = np.argsort(np.where(df > 0, df, np.iinfo(np.int64).max), kind="stable")
            keep = np.zeros(len(h), dtype=bool)
            keep[order[:max_terms]] = True
            times = np.where(keep, times, 0.0).astype(np.float32)
        return base_cols, delta_cols, times

    def scores(self, query: str | Sequence[str], *, dedupe: bool = True,
               max_terms: int | None = None) -> np.ndarray:
        """BM25 score of every doc (float32 [len(self)]); deleted docs score 0.

        `query` is text or tokens. With `dedupe`, a term counts once however often the
        query repeats it: a long issue text repeats its common words, and summing every
        repeat lets them drown the rare names that identify the code. `max_terms` keeps
        only that many of the query's rarest terms (highest document frequency dropped
        first): the common words of a long query cost the most and weigh the least.
        """
        base_cols, delta_cols, times = self._query_terms(query, dedupe, max_terms)
        nb = len(self.base)
        out = np.zeros(len(self), dtype=np.float32)
        self.base.add_scores(out[:nb], base_cols, times)
        if self.delta is not None and delta_cols is not None:
            self.delta.add_scores(out[nb:], delta_cols, times)
        if self.deleted.any():
            out[:nb][self.deleted] = 0.0
        return out

    def file_scores(self, query: str | Sequence[str], *, mask: np.ndarray | None = None,
                    dedupe: bool = True, max_terms: int | None = None,
                    ) -> tuple[list[str], np.ndarray]:
        """BM25 of whole files (a file's text = all its chunks), from the chunk postings.

        Returns (paths, score of each). Term frequencies, lengths and document
        frequencies are summed per file at query time, so no second index is kept.
        `mask` (over docs) leaves out chunks, and files with no chunk left score 0.
        """
        paths, file_of, flen = self._file_table()
        live = flen > 0
        n_files = int(live.sum())
        out = np.zeros(len(paths), dtype=np.float64)
        if n_files == 0:
            return paths, out
        norm = self.k1 * (1 - self.b + self.b * flen / float(flen[live].mean()))
        base_cols, delta_cols, times = self._query_terms(query, dedupe, max_terms)
        segs = [(self.base, base_cols, 0)]
        if self.delta is not None and delta_cols is not None:
            segs.append((self.delta, delta_cols, len(self.base)))
        for j, t in enumerate(times.tolist()):
            if t == 0:
                continue
            tf = np.zeros(len(paths), dtype=np.float64)
            for seg, cols, offset in segs:
                col = int(cols[j])
                if col < 0:
                    continue
                docs = seg.col_docs[seg.col_ptr[col] : seg.col_ptr[col + 1]] + offset
                f = file_of[docs]
                ok = f >= 0 if mask is None else (f >= 0) & mask[docs]
                tf += np.bincount(f[ok], weights=seg.col_tf[seg.col_ptr[col] :
                                                            seg.col_ptr[col + 1]][ok],
                                  minlength=len(paths))
            df = int(np.count_nonzero(tf))
            if df:
                idf = np.log1p((n_files - df + 0.5) / (df + 0.5))
                out += t * idf * tf / (tf + norm)
        return paths, out

    def file_top(self, query: str | Sequence[str], k: int, *, mask: np.ndarray | None = None,
                 dedupe: bool = True, max_terms: int | None = None,
                 ) -> list[tuple[str, float]]:
        """The `k` best files by whole-file BM25, best first."""
        paths, s = self.file_scores(query, mask=mask, dedupe=dedupe, max_terms=max_terms)
        return [(paths[i], score) for i, score in top_k(s, k)]

    def _file_table(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(paths, file number of every doc or -1 if deleted, token length of each file)."""
        if self._files is None:
            ids: dict[str, int] = {}
            parts = []
            for seg in (self.base, self.delta):
                if seg is None:
                    continue
                pmap = np.array([ids.setdefault(p, len(ids)) for p in seg.paths] or [0],
                                dtype=np.int64)
                parts.append(pmap[seg.path_id])
            file_of = np.concatenate(parts)
            file_of[~self.alive()] = -1
            lengths = np.concatenate([seg.lengths for seg in (self.base, self.delta)
                                      if seg is not None])
            ok = file_of >= 0
            flen = np.bincount(file_of[ok], weights=lengths[ok], minlength=len(ids))
            self._files = (list(ids), file_of, flen)
        return self._files

    def top(self, query: str | Sequence[str], k: int, *, mask: np.ndarray | None = None,
            dedupe: bool = True, max_terms: int | None = None) -> list[tuple[int, float]]:
        """The `k` best (doc index, score) with a positive score, best first."""
        s = self.scores(query, dedupe=dedupe, max_terms=max_terms)
        if mask is not None:
            s = np.where(mask, s, 0.0)
        return top_k(s, k)

    def mask(self, *, path: str | None = None, language: str | None = None) -> np.ndarray | None:
        """Docs kept by a path glob and a language (None: no filter)."""
        if path is None and language is None:
            return None
        parts = []
        for seg in (self.base, self.delta):
            if seg is None:
                continue
            keep = np.ones(len(seg), dtype=bool)
            if path is not None:
                ok = np.array([fnmatch.fnmatch(p, path) for p in seg.paths] or [False])
                keep &= ok[seg.path_id] if len(seg) else keep
            if language is not None:
                ok = np.array([x == language for x in seg.languages] or [False])
                keep &= ok[seg.lang_id] if len(seg) else keep
            parts.append(keep)
        return np.concatenate(parts)

    def paths(self) -> list[str]:
        """Every path the index holds a live chunk of."""
        return list(self._path_docs())

    def docs_of(self, path: str) -> np.ndarray:
        """Live doc indices of one file, in line order."""
        return self._path_docs().get(path, np.zeros(0, dtype=np.int64))

    def _path_docs(self) -> dict[str, np.ndarray]:
        if self._by_path is None:
            groups: dict[str, list[np.ndarray]] = {}
            offset = 0
            alive = self.alive()
            for seg in (self.base, self.delta):
                if seg is None:
                    continue
                live = np.flatnonzero(alive[offset : offset + len(seg)])
                order = live[np.lexsort((seg.lines[live, 0], seg.path_id[live]))]
                pids = seg.path_id[order]
                cuts = np.flatnonzero(np.diff(pids)) + 1
                for run in np.split(order, cuts):
                    if len(run):
                        groups.setdefault(seg.paths[seg.path_id[run[0]]], []).append(
                            run + offset)
                offset += len(seg)
            self._by_path = {p: np.concatenate(v) for p, v in groups.items()}
        return self._by_path

    def columns(self) -> tuple[list[str], list[str], np.ndarray]:
        """(path, symbol, [start, end]) of every doc; deleted docs get path "" and symbol "".

        Decodes every symbol: for building lookups, not for a per-query path.
        """
        paths: list[str] = []
        symbols: list[str] = []
        alive = self.alive()
        offset = 0
        for seg in (self.base, self.delta):
            if seg is None:
                continue
            blob = seg.sym_blob.tobytes()
            ptr = seg.sym_ptr.tolist()
            live = alive[offset : offset + len(seg)].tolist()
            paths.extend(seg.paths[p] if ok else "" for p, ok in
                         zip(seg.path_id.tolist(), live, strict=True))
            symbols.extend(blob[ptr[i] : ptr[i + 1]].decode("utf-8") if live[i] else ""
                           for i in range(len(seg)))
            offset += len(seg)
        lines = np.concatenate([seg.lines for seg in (self.base, self.delta) if seg is not None])
        return paths, symbols, lines

    # -- updating -------------------------------------------------------------------

    def _stats(self) -> _Stats:
        """Statistics of the live base docs, for weighting a new delta."""
        base = self.base
        df = base.df.astype(np.int64)
        if self.deleted.any():
            dead = np.flatnonzero(self.deleted[base.col_docs])
            cols = np.searchsorted(base.col_ptr, dead, side="right") - 1
            df -= np.bincount(cols, minlength=len(df))
        return _Stats(int(self._alive.sum()), base.terms, df,
                      int(base.lengths[self._alive].sum()))

    def updated(self, drop_paths: Iterable[str], add: _Counts) -> LexicalIndex:
        """A new index without the docs of `drop_paths`, with the docs of `add`."""
        drop = set(drop_paths)
        deleted = self.deleted.copy()
        if drop and len(self.base):
            hit = np.array([p in drop for p in self.base.paths])
            deleted |= hit[self.base.path_id]
        kept = _Counts()
        if self.delta is not None:
            for j, counted in enumerate(_rows(self.delta)):
                d = self.delta.doc(j)
                if d.path not in drop:
                    kept.add(d, counted)
        kept.docs += add.docs
        kept.hashes += add.hashes
        kept.tfs += add.tfs
        kept.lengths += add.lengths
        interim = LexicalIndex(self.base, None, deleted, k1=self.k1, b=self.b,
                               tokenizer=self.tokenizer)
        delta = (_Segment.from_counts(kept, interim._stats(), self.k1, self.b)
                 if kept.docs else None)
        out = LexicalIndex(self.base, delta, deleted, k1=self.k1, b=self.b,
                           tokenizer=self.tokenizer)
        changed = int(deleted.sum()) + len(kept.docs)
        if changed > MERGE_SHARE * max(len(self.base), 1):
            out = out.merged()
        return out

    def merged(self) -> LexicalIndex:
        """One segment holding the live docs of base and delta, weights recomputed."""
        segs = [(self.base, np.flatnonzero(self._alive))]
        if self.delta is not None:
            segs.append((self.delta, np.arange(len(self.delta))))
        terms = np.unique(np.concatenate([s.terms for s, _ in segs]))
        rows_c, cols_c, tfs_c, lengths = [], [], [], []
        offset = 0
        for seg, rows in segs:
            remap = np.full(len(seg), -1, dtype=np.int64)
            remap[rows] = np.arange(len(rows)) + offset
            col_of_entry = np.repeat(np.searchsorted(terms, seg.terms), seg.df)
            new_row = remap[seg.col_docs]
            keep = new_row >= 0
            rows_c.append(new_row[keep])
            cols_c.append(col_of_entry[keep])
            tfs_c.append(seg.col_tf[keep])
            lengths.append(seg.lengths[rows])
            offset += len(rows)
        docs = _DocCols.concat(segs)
        seg = _Segment._assemble(terms, np.concatenate(cols_c), np.concatenate(rows_c),
                                 np.concatenate(tfs_c), np.concatenate(lengths), docs, None,
                                 self.k1, self.b)
        # Terms no live doc uses any more drop out here.
        used = seg.df > 0
        if not used.all():
            seg = _drop_terms(seg, used)
        return LexicalIndex(seg, k1=self.k1, b=self.b, tokenizer=self.tokenizer)


def _rows(seg: _Segment) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(sorted term hashes, tfs, length) of every doc of a segment, from its columns."""
    cols = np.repeat(np.arange(len(seg.terms), dtype=np.int64), np.diff(seg.col_ptr))
    # The transpose of a CSC matrix is its CSR: the same entries, sorted by doc, then term.
    ptr, terms, tfs = _csc(seg.col_docs.astype(np.int64), cols, seg.col_tf, len(seg))
    return [
        (seg.terms[terms[lo:hi]], tfs[lo:hi], int(seg.lengths[j]))
        for j, (lo, hi) in enumerate(itertools.pairwise(ptr))
    ]


def _csc(col: np.ndarray, row: np.ndarray, val: np.ndarray,
         n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(col_ptr int64, rows int32, values int32) of the compressed-column matrix of the
    (row, col, value) triplets, duplicates summed, rows sorted within a column.

    numpy's lexsort does what scipy.sparse would, and keeps scipy's 0.8 s import off
    every command that touches the lexical index.
    """
    order = np.lexsort((row, col))
    c, r, v = col[order], row[order], val[order].astype(np.int64)
    if len(c):
        first = np.flatnonzero(np.r_[True, (c[1:] != c[:-1]) | (r[1:] != r[:-1])])
        c, r, v = c[first], r[first], np.add.reduceat(v, first)
    ptr = np.searchsorted(c, np.arange(n_cols + 1), side="left").astype(np.int64)
    return ptr, r.astype(np.int32), v.astype(np.int32)


def _drop_terms(seg: _Segment, used: np.ndarray) -> _Segment:
    a = dict(seg.a)
    a["terms"] = seg.terms[used]
    a["col_ptr"] = np.concatenate(([0], np.cumsum(seg.df[used]))).astype(np.int64)
    return _Segment(a, seg.paths, seg.languages)


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(index, score) of the `k` highest positive scores, best first; ties by index."""
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        part = np.argpartition(-scores[positive], k - 1)[:k]
        positive = positive[part]
    order = np.lexsort((positive, -scores[positive]))
    return [(int(i), float(scores[i])) for i in positive[order]]


# -- kept in step with the chunk table -------------------------------------------------


def read_stamp(db: sqlite3.Connection) -> Stamp:
    """(change counter, chunk count, database epoch) of the chunk table as it is now."""
    n, epoch = change_stamp(db)
    count = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return n, int(count), epoch


@dataclass
class _Saved:
    index: LexicalIndex
    stamp: Stamp
    files: dict[str, bytes]  # path -> content digest the index holds the chunks of
    base_id: bytes  # ties a saved delta to the base it was made against


class LexicalStore:
    """The lexical index of one repo, under `.codeveil/lexical/`, kept current.

    `current(db)` returns an index matching the chunk table: the one in memory if still
    current, else the saved one if current, else an updated one (tokenizing only the
    chunks of files that changed), which is then saved. Thread-safe.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._saved: _Saved | None = None
        self._lock = threading.Lock()
        self._tokenizer = Tokenizer()
        self.last_refresh: dict[str, float | int | str] = {}

    def current(self, db: sqlite3.Connection) -> LexicalIndex:
        with self._lock:
            stamp = read_stamp(db)
            if self._saved is not None and self._saved.stamp == stamp:
                return self._saved.index
            if self._saved is None:
                self._saved = self._load()
                if self._saved is not None and self._saved.stamp == stamp:
                    return self._saved.index
            self._saved = self._refresh(db, self._saved)
            return self._saved.index

    def damaged(self) -> bool:
        """Whether saved index files exist but cannot be read (`codeveil doctor`)."""
        files = [self.directory / BASE_FILE, self.directory / DELTA_FILE]
        return any(f.exists() for f in files) and self._load() is None

    # -- disk -----------------------------------------------------------------------

    def _load(self) -> _Saved | None:
        try:
            with np.load(self.directory / BASE_FILE, allow_pickle=False) as zb:
                zb_d = {k: zb[k] for k in zb.files}
            with np.load(self.directory / DELTA_FILE, allow_pickle=False) as zd:
                zd_d = {k: zd[k] for k in zd.files}
        except FileNotFoundError as exc:
            log.debug("no lexical index in %s (%s)", self.directory, exc)
            return None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            # Truncated or garbled (a full disk, a crash before fsync existed): it only
            # caches what the chunk table holds, so it is rebuilt, not fatal.
            log.warning("the lexical index in %s is damaged (%s); rebuilding it",
                        self.directory, exc)
            return None
        try:
            if (int(zb_d["version"][0]) != FORMAT_VERSION
                    or zb_d["base_id"].tobytes() != zd_d["base_id"].tobytes()):
                return None
            k1, b = (float(x) for x in zb_d["params"])
            base = _Segment.load(zb_d)
            delta = _Segment.load(zd_d) if int(zd_d["has_delta"][0]) else None
            index = LexicalIndex(base, delta, zd_d["deleted"].astype(bool), k1=k1, b=b,
                                 tokenizer=self._tokenizer)
            files = dict(zip(_unpack(zd_d["file_paths"]),
                             (row.tobytes() for row in zd_d["file_digests"]), strict=True))
            stamp = (int(zd_d["stamp"][0]), int(zd_d["stamp"][1]), zd_d["epoch"].tobytes())
        except (KeyError, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            log.warning("the lexical index in %s is unreadable (%s); rebuilding it",
                        self.directory, exc)
            return None
        return _Saved(index, stamp, files, zb_d["base_id"].tobytes())

    def _save(self, saved: _Saved, base_changed: bool) -> None:
        index = saved.index
        id_arr = np.frombuffer(saved.base_id, dtype=np.uint8)
        if base_changed:
            index.base.save(self.directory / BASE_FILE, {
                "version": np.array([FORMAT_VERSION]), "base_id": id_arr,
                "params": np.array([index.k1, index.b]),
            })
        paths = list(saved.files)
        delta_extra = {
            "base_id": id_arr,
            "has_delta": np.array([index.delta is not None]),
            "deleted": index.deleted,
            "stamp": np.array(saved.stamp[:2], dtype=np.int64),
            "epoch": np.frombuffer(saved.stamp[2], dtype=np.uint8),
            "file_paths": _pack(paths),
            "file_digests": _digest_rows([saved.files[p] for p in paths]),
        }
        if index.delta is not None:
            index.delta.save(self.directory / DELTA_FILE, delta_extra)
        else:
            _save_npz(self.directory / DELTA_FILE, delta_extra)

    # -- refresh --------------------------------------------------------------------

    def _refresh(self, db: sqlite3.Connection, old: _Saved | None) -> _Saved:
        """Bring the index in line with the chunk table, read in one snapshot."""
        t0 = time.perf_counter()
        reader = sqlite3.connect(_db_file(db), timeout=30, isolation_level=None)
        try:
            reader.execute("BEGIN")  # one WAL snapshot: stamp, file list and rows agree
            stamp = read_stamp(reader)
            files = {p: bytes(d) for p, d in reader.execute(
                "SELECT path, digest FROM chunk_files")}
            if old is not None:
                changed = [p for p, d in files.items() if old.files.get(p) != d]
                dropped = [p for p in old.files if p not in files]
                n_changed = _count_chunks(reader, changed)
            if old is None or n_changed > REBUILD_SHARE * max(stamp[1], 1):
                rows = _read_chunks(reader, None)
                mode = "rebuild"
            else:
                rows = _read_chunks(reader, changed)
                mode = "update"
            reader.execute("COMMIT")
        finally:
            reader.close()
        t1 = time.perf_counter()
        counts = _Counts()
        texts = [lexical_text(c) for c in rows]
        for c, counted in zip(rows, _counts_of(self._tokenizer, texts), strict=True):
            counts.add(_doc(c), counted)
        if mode == "rebuild" or old is None:
            index = LexicalIndex(_Segment.from_counts(counts, None, K1, B),
                                 tokenizer=self._tokenizer)
            base_changed = True
        else:
            index = old.index.updated([*changed, *dropped], counts)
            base_changed = index.base is not old.index.base
        base_id = secrets.token_bytes(8) if base_changed or old is None else old.base_id
        saved = _Saved(index, stamp, files, base_id)
        t2 = time.perf_counter()
        try:
            self._save(saved, base_changed)
        except OSError as exc:
            # A read-only or full disk costs the next process a rebuild, not this search.
            log.warning("could not save the lexical index in %s: %s", self.directory, exc)
        self.last_refresh = {
            "mode": mode, "chunks": stamp[1], "tokenized": len(rows),
            "merged": int(base_changed and mode == "update"),
            "seconds_read": round(t1 - t0, 4), "seconds_build": round(t2 - t1, 4),
            "seconds_save": round(time.perf_counter() - t2, 4),
        }
        log.debug("lexical refresh: %s", self.last_refresh)
        return saved


def _counts_of(tok: Tokenizer, texts: Sequence[str],
               batch: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """`tok.counts` of each text, a batch at a time (bounded memory)."""
    for start in range(0, len(texts), batch):
        yield from tok.counts_many(texts[start : start + batch])


def _doc(c: Chunk) -> LexDoc:
    return LexDoc(c.path, c.start_line, c.end_line, c.symbol, c.language, c.chunk_hash)


def _digest_rows(digests: Sequence[bytes]) -> np.ndarray:
    """Content digests (xxh3-128, 16 bytes each) as a uint8 [n, 16] array."""
    return np.frombuffer(b"".join(d.ljust(16, b"\0")[:16] for d in digests),
                         dtype=np.uint8).reshape(-1, 16).copy()


def _db_file(db: sqlite3.Connection) -> str:
    for _seq, name, file in db.execute("PRAGMA database_list"):
        if name == "main":
            return file
    raise sqlite3.DatabaseError("the state database has no main file")


def _count_chunks(db: sqlite3.Connection, paths: Sequence[str]) -> int:
    total = 0
    for start in range(0, len(paths), _SQL_BATCH):
        part = list(paths[start : start + _SQL_BATCH])
        marks = ",".join("?" * len(part))
        total += db.execute(f"SELECT count(*) FROM chunks WHERE path IN ({marks})",
                            part).fetchone()[0]
    return total


def _read_chunks(db: sqlite3.Connection, paths: Sequence[str] | None) -> list[Chunk]:
    """Chunks of `paths` (all chunks if None), in table order."""
    cols = "path, start_line, end_line, language, symbol, text"
    query: list[tuple[str, Sequence[str]]]
    if paths is None:
        query = [(f"SELECT {cols} FROM chunks ORDER BY rowid", [])]
    else:
        query = []
        for start in range(0, len(paths), _SQL_BATCH):
            part = list(paths[start : start + _SQL_BATCH])
            marks = ",".join("?" * len(part))
            query.append((f"SELECT {cols} FROM chunks WHERE path IN ({marks}) ORDER BY rowid",
                          part))
    out: list[Chunk] = []
    for sql, args in query:
        out.extend(Chunk(p, s, e, lang, sym, text)
                   for p, s, e, lang, sym, text in db.execute(sql, args))
    return out
