"""Building and merging BM25 segments in bounded memory.

A segment's postings are sorted by term, then doc. Building one from doc-major term
counts sorts every posting at once; merging two (a base and its delta) did the same
over their union, with the sort's copies: ~100 bytes of transient memory per posting,
5 GB at 1M chunks (~50M postings), on a laptop that also runs the editor, and twice
what the index itself holds.

Here both are bounded:

- `assemble` builds one small segment (at most `BUILD_DOCS` docs, from `SegmentWriter`):
  a stable sort of the doc-major postings by term keeps each term's docs in order, with
  no duplicate to sum (a doc's term hashes are distinct).
- `combine` merges segments a term range at a time. Terms are 64-bit hashes, spread
  evenly, so cutting the hash space into equal ranges cuts the postings into parts of
  about `PART_ENTRIES`; each part is gathered from every segment, sorted (a stable sort
  of runs already in order), weighted and written into the output, whose arrays are
  mapped from a spill file beside the index when large (`retrieval.indexes.derived.spill`), the
  pages handed back after each part. Weights need the collection's statistics: the
  document frequency of a term lives within its range, and the doc lengths (4 bytes a
  doc) are known before the first part.
- `SegmentWriter` tokenizes docs `BUILD_DOCS` at a time and folds its small segments
  into one spilled segment whenever they pass `TIER_ENTRIES`, so a rebuild of 1M
  chunks never holds their texts or their postings in memory at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np

from indexer.location import ChunkLocation
from retrieval.indexes.derived.columns import ChunkColumns
from retrieval.indexes.derived.spill import release, spill_array
from retrieval.indexes.lexical.segments import _Counts, _Segment, _Stats
from retrieval.indexes.lexical.tokens import Tokenizer, _counts_of

#: Postings a merge handles at once (~60 bytes each of transient memory).
PART_ENTRIES: Final = 1 << 20
#: Docs tokenized into one small segment at a time.
BUILD_DOCS: Final = 8_192
#: Postings of small segments held in memory before they are folded into one.
TIER_ENTRIES: Final = 4 << 20
#: Output arrays at least this large are built in a spill file, not in memory.
SPILL_MIN_BYTES: Final = 8 << 20
TEMP_PREFIX: Final = ".lex-spill-"

Part = tuple[_Segment, np.ndarray]  # a segment and the sorted docs of it to keep


def whole(seg: _Segment) -> Part:
    return seg, np.arange(len(seg))


def assemble(counts: _Counts, stats: _Stats | None, k1: float, b: float) -> _Segment:
    """One segment of `counts`' docs (doc-major, each doc's hashes sorted and distinct)."""
    n = len(counts.docs)
    sizes = np.fromiter((len(h) for h in counts.hashes), dtype=np.int64, count=n)
    doc_of = np.repeat(np.arange(n, dtype=np.int32), sizes)
    hashes = np.concatenate(counts.hashes) if n else np.zeros(0, np.uint64)
    tfs = np.concatenate(counts.tfs) if n else np.zeros(0, np.int32)
    order = np.argsort(hashes, kind="stable")  # by term; docs stay in order within one
    t = hashes[order]
    terms, df = _runs(t)
    lengths = np.array(counts.lengths, dtype=np.int32)
    stats = stats or _Stats()
    n_all = stats.n + n
    norm = _norm(lengths, stats, n_all, k1, b)
    docs, tf = doc_of[order], tfs[order].astype(np.int32)
    arrays = {
        "terms": terms.astype(np.uint64), "col_ptr": _ptr(df), "col_docs": docs,
        "col_tf": tf, "col_w": _weights(stats.idf(terms, df, n_all), df, tf, norm[docs]),
        "lengths": lengths,
    }
    return _Segment(arrays, ChunkColumns.of(counts.docs))


def combine(parts: Sequence[Part], stats: _Stats | None, k1: float, b: float,
            spill: Path | None = None) -> _Segment:
    """One segment of the kept docs of `parts`, in order, weighted with the statistics
    of its own docs plus `stats`' (None: its own alone). Terms no kept doc uses drop."""
    remaps, kept_lengths, offset = [], [], 0
    for seg, rows in parts:
        remap = np.full(len(seg), -1, dtype=np.int32)
        remap[rows] = np.arange(offset, offset + len(rows), dtype=np.int32)
        remaps.append(remap)
        kept_lengths.append(np.asarray(seg.lengths[rows], dtype=np.int32))
        offset += len(rows)
    lengths = np.concatenate(kept_lengths) if kept_lengths else np.zeros(0, np.int32)
    stats = stats or _Stats()
    n_all = stats.n + offset
    norm = _norm(lengths, stats, n_all, k1, b)
    nnz = sum(_kept_postings(seg, remap) for (seg, _), remap in zip(parts, remaps, strict=True))
    out = {name: spill_array(spill, (nnz,), dtype, min_bytes=SPILL_MIN_BYTES,
                             prefix=TEMP_PREFIX)
           for name, dtype in (("col_docs", np.int32), ("col_tf", np.int32),
                               ("col_w", np.float32))}
    n_parts = max(1, -(-sum(len(seg.col_docs) for seg, _ in parts) // PART_ENTRIES))
    cuts = [np.uint64((p << 64) // n_parts) for p in range(n_parts)]
    all_terms, all_df, at = [], [], 0
    for p in range(n_parts):
        t, d, tf = _gather(parts, remaps, cuts[p], cuts[p + 1] if p + 1 < n_parts else None)
        order = np.argsort(t, kind="stable")  # runs in (term, doc) order, docs rising
        t, d, tf = t[order], d[order], tf[order]
        terms, df = _runs(t)
        out["col_docs"][at : at + len(d)] = d
        out["col_tf"][at : at + len(d)] = tf
        out["col_w"][at : at + len(d)] = _weights(stats.idf(terms, df, n_all), df, tf, norm[d])
        for a in out.values():
            release(a)
        all_terms.append(terms)
        all_df.append(df)
        at += len(d)
    assert at == nnz, (at, nnz)
    terms = np.concatenate(all_terms).astype(np.uint64)
    arrays = {"terms": terms, "col_ptr": _ptr(np.concatenate(all_df)), **out,
              "lengths": lengths}
    return _Segment(arrays, ChunkColumns.concat([(seg.cols, rows) for seg, rows in parts]))


class SegmentWriter:
    """Docs and their texts in, segments out (`segments`), tokenized `BUILD_DOCS` at a
    time; small segments are folded into one (spilled to `spill` when large) whenever
    their postings pass `TIER_ENTRIES`."""

    def __init__(self, tokenizer: Tokenizer, k1: float, b: float,
                 spill: Path | None = None) -> None:
        self.tokenizer, self.k1, self.b, self.spill = tokenizer, k1, b, spill
        self._done: list[_Segment] = []
        self._fresh: list[_Segment] = []
        self._pending: list[tuple[ChunkLocation, str]] = []

    def add(self, doc: ChunkLocation, text: str) -> None:
        self._pending.append((doc, text))
        if len(self._pending) >= BUILD_DOCS:
            self._flush()

    def segments(self) -> list[_Segment]:
        """Every doc added so far, as segments in the order added."""
        self._flush()
        return [*self._done, *self._fresh]

    def _flush(self) -> None:
        if not self._pending:
            return
        counts = _Counts()
        texts = [text for _, text in self._pending]
        for (doc, _), counted in zip(self._pending, _counts_of(self.tokenizer, texts),
                                     strict=True):
            counts.add(doc, counted)
        self._pending = []
        self._fresh.append(assemble(counts, None, self.k1, self.b))
        if sum(len(s.col_docs) for s in self._fresh) > TIER_ENTRIES:
            self._done.append(combine([whole(s) for s in self._fresh], None, self.k1,
                                      self.b, self.spill))
            self._fresh = []


# -- the pieces ------------------------------------------------------------------------


def _runs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, run length of each) of the sorted array `t`."""
    if not len(t):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    first = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    return t[first], np.diff(np.r_[first, len(t)])


def _ptr(df: np.ndarray) -> np.ndarray:
    ptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum(df, out=ptr[1:])
    return ptr


def _norm(lengths: np.ndarray, stats: _Stats, n_all: int, k1: float, b: float) -> np.ndarray:
    """BM25's length normalisation of each doc: k1 * (1 - b + b * len / avglen)."""
    avg = max((stats.total_len + float(lengths.sum())) / max(n_all, 1), 1e-9)
    return (k1 * (1 - b + b * lengths / avg)).astype(np.float32)


def _weights(idf: np.ndarray, df: np.ndarray, tf: np.ndarray, norm: np.ndarray) -> np.ndarray:
    tf32 = tf.astype(np.float32)
    return (np.repeat(idf, df) * tf32 / (tf32 + norm)).astype(np.float32)


def _kept_postings(seg: _Segment, remap: np.ndarray) -> int:
    """Postings of `seg` whose doc is kept, counted a part at a time."""
    total = 0
    for at in range(0, len(seg.col_docs), PART_ENTRIES):
        total += int(np.count_nonzero(remap[seg.col_docs[at : at + PART_ENTRIES]] >= 0))
        release(seg.col_docs)
    return total


def _gather(parts: Sequence[Part], remaps: list[np.ndarray], lo: np.uint64,
            hi: np.uint64 | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(term, new doc, tf) of the kept postings whose term is in [lo, hi) (hi None: to
    the end), segment after segment, each in (term, doc) order."""
    ts, ds, fs = [], [], []
    for (seg, _), remap in zip(parts, remaps, strict=True):
        t0 = int(np.searchsorted(seg.terms, lo))
        t1 = len(seg.terms) if hi is None else int(np.searchsorted(seg.terms, hi))
        e0, e1 = int(seg.col_ptr[t0]), int(seg.col_ptr[t1])
        d = remap[seg.col_docs[e0:e1]]
        keep = d >= 0
        ts.append(np.repeat(seg.terms[t0:t1], np.diff(seg.col_ptr[t0 : t1 + 1]))[keep])
        ds.append(d[keep])
        fs.append(np.asarray(seg.col_tf[e0:e1])[keep])
        for a in (seg.col_docs, seg.col_tf):
            release(a)
    if not ts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(ts), np.concatenate(ds), np.concatenate(fs)
