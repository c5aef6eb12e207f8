"""One immutable BM25 segment of the lexical index, and the arrays it is saved as.

A segment holds its docs' term frequencies term-major (compressed columns: each term's
docs and counts), the BM25 weight of each entry (the formula in `retrieval.lexical`) and
its docs' metadata as columns. Weights are computed with `_Stats`, the document
frequencies and lengths of the docs the segment joins.

Terms are identified by a 64-bit xxh3 hash of the token, kept sorted per segment, so a
saved index loads as a handful of arrays (no Python dict of every token).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.chunk import Chunk
from indexer.location import ChunkLocation
from indexer.private_files import write_atomic

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

    def doc(self, i: int) -> ChunkLocation:
        return ChunkLocation(self.paths[self.path_id[i]], int(self.lines[i, 0]),
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
                  tfs: np.ndarray, lengths: np.ndarray, docs: Sequence[ChunkLocation] | _DocCols,
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
    def of(cls, docs: Sequence[ChunkLocation]) -> _DocCols:
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
             "hashes": digest_rows([d.chunk_hash for d in docs])},
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
            blobs.append(gather(seg.sym_blob, starts, ends))
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


def gather(blob: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
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


def digest_rows(digests: Sequence[bytes]) -> np.ndarray:
    """Content digests (xxh3-128, 16 bytes each) as a uint8 [n, 16] array."""
    return np.frombuffer(b"".join(d.ljust(16, b"\0")[:16] for d in digests),
                         dtype=np.uint8).reshape(-1, 16).copy()
