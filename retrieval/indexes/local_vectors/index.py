"""The vector index in memory: a base (often memory-mapped), its masked rows, and a
delta; exact search by body or header vectors, with filters, and how it is updated and
merged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import numpy as np

from indexer.location import ChunkLocation
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.local_vectors.approx import ApproxPlanes, live_candidates, rerank_width
from retrieval.indexes.local_vectors.docs import VectorDocs
from retrieval.indexes.local_vectors.mapped import gather_rows
from retrieval.indexes.local_vectors.scoring import ONE_THREAD_VALUES, one_blas_thread, top_rows
from retrieval.indexes.local_vectors.spill import spill_planes, take_rows

# Merge the delta into the base once it (with the masked base rows) passes this share.
MERGE_SHARE: Final = 0.1
# With an approximate index, a filter keeping at most this many rows is searched exactly
# over those rows alone (50k rows cost ~8 ms): cheaper than widening the IVF's answer.
EXACT_FILTER_ROWS: Final = 50_000


def no_vectors(dim: int) -> np.ndarray:
    return np.zeros((2, 0, dim), dtype=np.float32)


class LocalVectorIndex:
    """Vectors of chunks: a base (often memory-mapped), its masked rows, and a delta.

    Rows run over the base, then the delta. `base` and `delta` are float32 [2, rows, dim]:
    plane 0 the chunks' body vectors, plane 1 their header vectors. Immutable: an update
    makes a new index.
    """

    #: Every row holds a header vector or is marked as lacking one (`header=True`).
    headers = True

    def __init__(self, base: np.ndarray, base_docs: VectorDocs, deleted: np.ndarray,
                 delta: np.ndarray, delta_docs: VectorDocs, missing: int, *,
                 spill_dir: Path | None = None) -> None:
        self.base = base
        self.base_docs = base_docs
        self.deleted = deleted
        self.delta = delta
        self.delta_docs = delta_docs
        self.dim = int(base.shape[2])
        nb = int(base.shape[1])
        #: Chunks of non-pending files left out because the cache lacks their vector.
        self.missing = missing
        #: Chunks the index holds a vector for (live base rows and the delta).
        self.count = nb - int(deleted.sum()) + int(delta.shape[1])
        #: Of those, the chunks that also have a header vector.
        self.header_count = (int((base_docs.has_header & ~deleted).sum())
                             + int(delta_docs.has_header.sum()))
        # The live rows each recent filter keeps (an agent repeats its --path filter).
        self._rows_kept: dict[HitFilter, np.ndarray] = {}
        #: The base's approximate index, once built (`retrieval.indexes.local_vectors.approx`);
        #: None: every search is exact.
        self.approx: ApproxPlanes | None = None
        #: Where a merge writes a large new base (`spill_planes`); None: in memory.
        self.spill_dir = spill_dir

    def nearest(self, query: np.ndarray, n: int, *,
                keep: Callable[[ChunkLocation], bool] | None = None,
                header: bool = False) -> list[tuple[ChunkLocation, float]]:
        """The `n` chunks of highest cosine with `query`, best first (ties by row): by
        their body vectors, or with `header` by their header vectors (chunks without
        one are not ranked).

        `keep` filters hits; the search widens until `n` kept hits are found or every
        chunk has been looked at, so a filter that keeps few still gets `n`.
        """
        q = self._query(query)
        count = self.header_count if header else self.count
        if n <= 0 or count == 0:
            return []
        if self.approx is not None and (keep is None or isinstance(keep, HitFilter)):
            return self._approx_each(q[None], n, keep, header)[0]
        if isinstance(keep, HitFilter):
            return self._nearest_in(self.rows_kept(keep), q[:, None], n, header)[0]
        scores = self.scores(q, header=header)
        if keep is None:
            best = top_rows(scores, min(n, count))
            return list(zip(self.docs(best), scores[best].tolist(), strict=True))
        out: list[tuple[ChunkLocation, float]] = []
        seen = 0
        width = min(count, max(4 * n, 64))
        while True:
            order = top_rows(scores, width)
            for i, doc in zip(order[seen:].tolist(), self.docs(order[seen:]), strict=True):
                if keep(doc):
                    out.append((doc, float(scores[i])))
                    if len(out) == n:
                        return out
            seen = len(order)
            if width >= count:
                return out
            # Widen by what the share kept so far says is needed, with a margin; each
            # look costs a ChunkLocation and a call, so overshooting by 4x is what hurts.
            need = (n - len(out)) * seen / max(len(out), 1)
            width = min(count, max(2 * width, seen + int(1.5 * need)))

    def nearest_each(self, queries: np.ndarray, n: int, *, keep: HitFilter | None = None,
                     header: bool = False) -> list[list[tuple[ChunkLocation, float]]]:
        """`nearest(q, n, keep=keep, header=header)` of each row `q` of `queries`,
        scored in one pass over the vectors (the parts of a long query: reading 100k
        vectors once costs about what reading them once per part does for one)."""
        qs = np.stack([self._query(q) for q in np.atleast_2d(np.asarray(queries))])
        count = self.header_count if header else self.count
        if n <= 0 or count == 0:
            return [[] for _ in qs]
        if self.approx is not None:
            return self._approx_each(qs, n, keep, header)
        if keep is not None:
            return self._nearest_in(self.rows_kept(keep), qs.T, n, header)
        scores = self.scores(qs.T, header=header)
        out = []
        for column in scores.T:
            best = top_rows(column, min(n, count))
            out.append(list(zip(self.docs(best), column[best].tolist(), strict=True)))
        return out

    def scores(self, query: np.ndarray, *, header: bool = False) -> np.ndarray:
        """float32 [rows]: the cosine of each row's body (or `header`) vector with a unit
        `query` (or [rows, m] for m unit queries as columns [dim, m]); masked rows (and
        with `header`, rows without one) -inf."""
        nb, nd = self.base.shape[1], self.delta.shape[1]
        out = np.empty((nb + nd, *query.shape[1:]), dtype=np.float32)
        plane = int(header)
        with one_blas_thread((nb + nd) * self.dim <= ONE_THREAD_VALUES):
            self._scores_into(out, query, plane, header)
        return out

    def _scores_into(self, out: np.ndarray, query: np.ndarray, plane: int,
                     header: bool) -> None:
        nb, nd = self.base.shape[1], self.delta.shape[1]
        if nb:
            np.matmul(self.base[plane], query, out=out[:nb])
            out[:nb][self.deleted] = -np.inf
            if header:
                out[:nb][~self.base_docs.has_header] = -np.inf
        if nd:
            np.matmul(self.delta[plane], query, out=out[nb:])
            if header:
                out[nb:][~self.delta_docs.has_header] = -np.inf

    def rows_kept(self, keep: HitFilter) -> np.ndarray:
        """int64, ascending: the live rows (base, then delta) of the chunks `keep`
        keeps. Computed per distinct path, then kept for the next query."""
        rows = self._rows_kept.get(keep)
        if rows is None:
            b, d = self.base_docs, self.delta_docs
            in_base = keep.column_mask(b.paths, b.path_id, b.languages, b.lang_id)
            in_delta = keep.column_mask(d.paths, d.path_id, d.languages, d.lang_id)
            rows = np.concatenate([np.flatnonzero(in_base & ~self.deleted),
                                   self.base.shape[1] + np.flatnonzero(in_delta)])
            if len(self._rows_kept) >= 16:
                self._rows_kept.clear()
            self._rows_kept[keep] = rows
        return rows

    def _nearest_in(self, rows: np.ndarray, queries: np.ndarray, n: int,
                    header: bool) -> list[list[tuple[ChunkLocation, float]]]:
        """The `n` best of `rows` for each query column of `queries` [dim, m]: only
        those rows are scored, so a filter that keeps 1% costs about 1% of a search."""
        nb = self.base.shape[1]
        if 3 * len(rows) > nb + self.delta.shape[1]:
            # A wide filter: one pass over every row beats gathering most of them.
            scores = self.scores(queries, header=header)[rows]
        else:
            split = int(np.searchsorted(rows, nb))
            scores = np.empty((len(rows), queries.shape[1]), dtype=np.float32)
            plane = int(header)
            with one_blas_thread(len(rows) * self.dim <= ONE_THREAD_VALUES):
                if split:
                    np.matmul(self.base[plane][rows[:split]], queries, out=scores[:split])
                if split < len(rows):
                    np.matmul(self.delta[plane][rows[split:] - nb], queries,
                              out=scores[split:])
            if header:
                has = np.concatenate([self.base_docs.has_header[rows[:split]],
                                      self.delta_docs.has_header[rows[split:] - nb]])
                scores[~has] = -np.inf
        out = []
        for column in scores.T:
            best = top_rows(column, min(n, len(rows)))
            best = best[np.isfinite(column[best])]  # no header vector: not ranked
            out.append(list(zip(self.docs(rows[best]), column[best].tolist(), strict=True)))
        return out

    def _approx_each(self, qs: np.ndarray, n: int, keep: HitFilter | None,
                     header: bool) -> list[list[tuple[ChunkLocation, float]]]:
        """`nearest_each` through the approximate index: its candidates among the base
        rows, with every (kept) delta row, scored exactly and ranked as exact search
        ranks them."""
        assert self.approx is not None
        nb, plane = self.base.shape[1], int(header)
        keep_base: np.ndarray | None = None
        delta_rows = np.arange(self.delta.shape[1])
        if keep is not None:
            rows = self.rows_kept(keep)
            if len(rows) <= EXACT_FILTER_ROWS:
                return self._nearest_in(rows, qs.T, n, header)
            keep_base = np.zeros(nb, dtype=bool)
            keep_base[rows[rows < nb]] = True
            delta_rows = rows[rows >= nb] - nb
        if header:
            delta_rows = delta_rows[self.delta_docs.has_header[delta_rows]]
        width = min(nb, rerank_width(n))
        cand = self.approx.candidates(qs, plane, width)
        out = []
        for q, found in zip(qs, cand, strict=True):
            base_rows = live_candidates(found, self.deleted, keep_base)
            if header:
                base_rows = base_rows[self.base_docs.has_header[base_rows]]
            # Gathered a few rows at a time from a mapped base, its pages handed back.
            scores = np.concatenate([gather_rows(self.base[plane], base_rows) @ q,
                                     self.delta[plane][delta_rows] @ q]).astype(np.float32)
            rows_all = np.concatenate([base_rows, nb + delta_rows])
            best = top_rows(scores, min(n, len(rows_all)))
            if len(best) < n and keep is not None:
                # A filter the IVF's candidates barely meet: exact over what it keeps.
                out.append(self._nearest_in(self.rows_kept(keep), q[:, None], n, header)[0])
                continue
            out.append(list(zip(self.docs(rows_all[best]), scores[best].tolist(), strict=True)))
        return out

    def doc(self, i: int) -> ChunkLocation:
        nb = self.base.shape[1]
        return self.base_docs.doc(i) if i < nb else self.delta_docs.doc(i - nb)

    def docs(self, rows: np.ndarray) -> list[ChunkLocation]:
        """`doc(i)` of each of `rows`, in order."""
        nb = self.base.shape[1]
        rows = np.asarray(rows, dtype=np.int64)
        in_base = rows < nb
        if in_base.all():
            return self.base_docs.docs(rows)
        out: list[ChunkLocation] = [None] * len(rows)  # type: ignore[list-item]
        for at, doc in zip(np.flatnonzero(in_base).tolist(),
                           self.base_docs.docs(rows[in_base]), strict=True):
            out[at] = doc
        for at, doc in zip(np.flatnonzero(~in_base).tolist(),
                           self.delta_docs.docs(rows[~in_base] - nb), strict=True):
            out[at] = doc
        return out

    def _query(self, query: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape != (self.dim,):
            raise ValueError(f"a query vector of {q.shape[0]} values for an index of "
                             f"{self.dim}-dim vectors: was it embedded by another model?")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm) or norm == 0.0:
            raise ValueError("the query vector is zero or not finite: it has no direction")
        return q / norm

    # -- updating -------------------------------------------------------------------

    def updated(self, drop: set[str], vectors: np.ndarray, docs: VectorDocs,
                missing: int) -> LocalVectorIndex:
        """A new index without the chunks of `drop`, with the rows `vectors` / `docs`."""
        deleted = self.deleted | self.base_docs.rows_of(drop)
        kept = np.flatnonzero(~self.delta_docs.rows_of(drop))
        if len(kept) == len(self.delta_docs):
            delta = np.concatenate([self.delta, vectors], axis=1)
        else:
            delta = np.concatenate([self.delta[:, kept], vectors], axis=1)
        delta_docs = VectorDocs.concat([(self.delta_docs, kept), (docs, np.arange(len(docs)))])
        out = LocalVectorIndex(self.base, self.base_docs, deleted, delta, delta_docs, missing,
                               spill_dir=self.spill_dir)
        out.approx = self.approx  # the same base: its approximate index still fits
        return out

    def paths_without_headers(self) -> set[str]:
        """Paths with a live chunk that lacks its header vector (a refresh re-reads
        them: the cache may hold it by now)."""
        out: set[str] = set()
        for docs, live in ((self.base_docs, ~self.deleted),
                           (self.delta_docs, np.ones(len(self.delta_docs), dtype=bool))):
            ids = np.unique(docs.path_id[live & ~docs.has_header])
            out.update(docs.paths[i] for i in ids.tolist())
        return out

    def needs_merge(self) -> bool:
        return (int(self.deleted.sum()) + self.delta.shape[1]
                > MERGE_SHARE * max(self.base.shape[1], 1))

    def merged(self) -> LocalVectorIndex:
        """One base of the live rows (base, then delta), nothing masked, no delta."""
        live = np.flatnonzero(~self.deleted)
        n_delta = int(self.delta.shape[1])
        # Copied a slice at a time into a map when large: a 1M base is 3 GB.
        base = spill_planes(self.spill_dir, len(live) + n_delta, self.dim)
        take_rows(base, self.base, live)
        take_rows(base, self.delta, np.arange(n_delta), at=len(live))
        docs = VectorDocs.concat([(self.base_docs, live),
                             (self.delta_docs, np.arange(len(self.delta_docs)))])
        return LocalVectorIndex(base, docs, np.zeros(base.shape[1], dtype=bool),
                                no_vectors(self.dim), VectorDocs.empty(), self.missing,
                                spill_dir=self.spill_dir)

