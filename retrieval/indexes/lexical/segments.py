"""One immutable BM25 segment of the lexical index, and the arrays it is saved as.

A segment holds its docs' term frequencies term-major (compressed columns: each term's
docs and counts), the BM25 weight of each entry (the formula in `retrieval.indexes.lexical`) and
its docs' locations as columns (`retrieval.indexes.derived.columns`). Weights are computed
with `_Stats`, the document frequencies and lengths of the docs the segment joins.
Building and merging segments: `retrieval.indexes.lexical.combine`. A saved segment's large
arrays are read back mapped from the file (`retrieval.indexes.derived.npz`).

Terms are identified by a 64-bit xxh3 hash of the token, kept sorted per segment, so a
saved index loads as a handful of arrays (no Python dict of every token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.chunk import Chunk
from indexer.location import ChunkLocation
from indexer.private_files import write_atomic
from retrieval.indexes.derived.columns import ChunkColumns
from retrieval.indexes.derived.npz import write_npz

#: One indexed chunk: where it sits, enough to fuse it with a vector hit and to show it.


def _doc(c: Chunk) -> ChunkLocation:
    return ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language, c.chunk_hash)


@dataclass
class _Counts:
    """Doc-major term counts of docs about to become a segment."""

    docs: list[ChunkLocation] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    tfs: list[np.ndarray] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def add(self, doc: ChunkLocation, counted: tuple[np.ndarray, np.ndarray, int]) -> None:
        self.docs.append(doc)
        self.hashes.append(counted[0])
        self.tfs.append(counted[1])
        self.lengths.append(counted[2])


#: The arrays of a segment's terms, under the names they are saved as.
_TERM_KEYS = ("terms", "col_ptr", "col_docs", "col_tf", "col_w", "lengths")


class _Segment:
    """An immutable BM25 segment: term-major term frequencies and weights, doc columns."""

    def __init__(self, arrays: dict[str, np.ndarray], docs: ChunkColumns) -> None:
        self.a = arrays
        self.cols = docs
        self.terms: np.ndarray = arrays["terms"]  # uint64 [V], sorted
        self.col_ptr: np.ndarray = arrays["col_ptr"]  # int64 [V + 1]
        self.col_docs: np.ndarray = arrays["col_docs"]  # int32 [nnz]
        self.col_tf: np.ndarray = arrays["col_tf"]  # int32 [nnz]
        self.col_w: np.ndarray = arrays["col_w"]  # float32 [nnz]
        self.lengths: np.ndarray = arrays["lengths"]  # int32 [n]
        # The docs' locations (retrieval.indexes.derived.columns), by their column names.
        self.paths, self.languages = docs.paths, docs.languages
        self.path_id, self.lines, self.lang_id = docs.path_id, docs.lines, docs.lang_id
        self.sym_ptr, self.sym_blob, self.hashes = docs.sym_ptr, docs.sym_blob, docs.hashes

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def df(self) -> np.ndarray:
        return np.diff(self.col_ptr)

    def symbol(self, i: int) -> str:
        return self.cols.symbol(i)

    def doc(self, i: int) -> ChunkLocation:
        return self.cols.doc(i)

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

    def save(self, path: Path, extra: dict[str, np.ndarray]) -> None:
        _save_npz(path, {**self.a, **self.cols.arrays(), **extra})

    @classmethod
    def load(cls, z: dict[str, np.ndarray]) -> _Segment:
        return cls({k: z[k] for k in _TERM_KEYS}, ChunkColumns.load(z))


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

    def idf(self, terms: np.ndarray, own_df: np.ndarray, n: int) -> np.ndarray:
        """float32 idf of each of `terms` (sorted) in a collection of `n` docs: these
        docs plus ones whose document frequencies are `own_df`."""
        df = own_df.astype(np.float64)
        if len(self.terms) and len(terms):
            at = np.minimum(np.searchsorted(self.terms, terms), len(self.terms) - 1)
            df += np.where(self.terms[at] == terms, self.df[at], 0)
        return np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write one .npz atomically and durably (indexer.private_files.write_atomic), a
    slice at a time (retrieval.indexes.derived.npz)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: write_npz(f, arrays))
