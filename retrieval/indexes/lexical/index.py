"""The lexical index: a base segment, a delta segment and the deleted base docs.

It scores chunks (BM25 of each doc) and whole files (BM25 of all of a file's chunks,
summed from the chunk postings at query time). `updated` masks the chunks of the files
that changed and puts their new chunks in a fresh delta; `merged` folds the delta into
the base once the changes pass MERGE_SHARE of it, from the segments' term counts,
without tokenizing again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from indexer.chunk import Chunk
from indexer.location import ChunkLocation
from retrieval.indexes.derived.spill import release
from retrieval.indexes.lexical.combine import PART_ENTRIES, SegmentWriter, combine, whole
from retrieval.indexes.lexical.segments import _doc, _Segment, _Stats
from retrieval.indexes.lexical.tokens import Tokenizer, lexical_text, term_hash

if TYPE_CHECKING:
    from retrieval.indexes.filters import HitFilter

K1: Final = 1.2
B: Final = 0.75
# Merge the delta into the base once it (with the deleted base chunks) passes this share.
MERGE_SHARE: Final = 0.1


class LexicalIndex:
    """BM25 over chunks: a base segment, a delta segment and the deleted base docs.

    Doc indices run over the base (0..len(base)-1) then the delta. Build one in memory
    with `LexicalIndex.from_chunks`, or keep one in step with a chunk table through
    `LexicalStore`.
    """

    def __init__(self, base: _Segment, delta: _Segment | None = None,
                 deleted: np.ndarray | None = None, *, k1: float = K1, b: float = B,
                 tokenizer: Tokenizer | None = None, spill_dir: Path | None = None) -> None:
        self.k1, self.b = k1, b
        #: Where a merge builds a large segment (`retrieval.indexes.lexical.combine`); None: in
        #: memory.
        self.spill_dir = spill_dir
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
        writer = SegmentWriter(Tokenizer(), k1, b)
        chunk_list = list(chunks)
        text_list = list(texts) if texts is not None else [lexical_text(c) for c in chunk_list]
        for c, text in zip(chunk_list, text_list, strict=True):
            writer.add(_doc(c), text)
        return cls.built(writer.segments(), k1=k1, b=b, tokenizer=writer.tokenizer)

    @classmethod
    def built(cls, segments: Sequence[_Segment], *, k1: float = K1, b: float = B,
              tokenizer: Tokenizer | None = None, spill_dir: Path | None = None,
              ) -> LexicalIndex:
        """An index whose base holds the docs of `segments` (`SegmentWriter`'s), in
        order."""
        base = combine([whole(s) for s in segments], None, k1, b, spill_dir)
        return cls(base, k1=k1, b=b, tokenizer=tokenizer, spill_dir=spill_dir)

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

    def doc(self, i: int) -> ChunkLocation:
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

    def mask(self, keep: HitFilter) -> np.ndarray:
        """bool [docs]: the docs `keep` keeps (over base, then delta)."""
        parts = [keep.column_mask(seg.paths, seg.path_id, seg.languages, seg.lang_id)
                 for seg in (self.base, self.delta) if seg is not None]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

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
            # The postings of deleted docs, found a part at a time (a mapped base's pages
            # handed back after each), counted per term.
            dead = []
            for at in range(0, len(base.col_docs), PART_ENTRIES):
                dead.append(np.flatnonzero(self.deleted[base.col_docs[at : at + PART_ENTRIES]])
                            + at)
                release(base.col_docs)
            cols = np.searchsorted(base.col_ptr, np.concatenate(dead), side="right") - 1
            df -= np.bincount(cols, minlength=len(df))
        return _Stats(int(self._alive.sum()), base.terms, df,
                      int(base.lengths[self._alive].sum()))

    def updated(self, drop_paths: Iterable[str], add: Sequence[_Segment]) -> LexicalIndex:
        """A new index without the docs of `drop_paths`, with the docs of `add`,
        merged into one segment once the changes pass MERGE_SHARE of the base."""
        out = self.with_changes(drop_paths, add)
        return out.merged() if out.needs_merge() else out

    def needs_merge(self) -> bool:
        """Whether the delta and the deleted base docs pass MERGE_SHARE of the base."""
        changed = int(self.deleted.sum()) + (len(self.delta) if self.delta is not None else 0)
        return changed > MERGE_SHARE * max(len(self.base), 1)

    def with_changes(self, drop_paths: Iterable[str], add: Sequence[_Segment]) -> LexicalIndex:
        """A new index without the docs of `drop_paths`, with the docs of `add` (segments
        of new docs, as `SegmentWriter` makes them) in its delta (not merged)."""
        drop = set(drop_paths)
        deleted = self.deleted.copy()
        deleted |= self.base.cols.rows_of(drop)
        parts = [whole(s) for s in add]
        if self.delta is not None:
            parts.insert(0, (self.delta, np.flatnonzero(~self.delta.cols.rows_of(drop))))
        interim = LexicalIndex(self.base, None, deleted, k1=self.k1, b=self.b,
                               tokenizer=self.tokenizer)
        delta = (combine(parts, interim._stats(), self.k1, self.b, self.spill_dir)
                 if sum(len(rows) for _, rows in parts) else None)
        return LexicalIndex(self.base, delta, deleted, k1=self.k1, b=self.b,
                            tokenizer=self.tokenizer, spill_dir=self.spill_dir)

    def merged(self) -> LexicalIndex:
        """One segment holding the live docs of base and delta, weights recomputed."""
        parts = [(self.base, np.flatnonzero(self._alive))]
        if self.delta is not None:
            parts.append(whole(self.delta))
        return LexicalIndex(combine(parts, None, self.k1, self.b, self.spill_dir), k1=self.k1,
                            b=self.b, tokenizer=self.tokenizer, spill_dir=self.spill_dir)


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(index, score) of the `k` highest positive scores, best first; ties by index."""
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        part = np.argpartition(-scores[positive], k - 1)[:k]
        positive = positive[part]
    order = np.lexsort((positive, -scores[positive]))
    return [(int(i), float(scores[i])) for i in positive[order]]
