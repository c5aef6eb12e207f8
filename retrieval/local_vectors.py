"""Exact search by meaning on the client: the vectors of the client's own chunk table.

The index covers the chunks of every file of `indexer.local_chunks` that is not pending
(a pending file's vectors are not ready yet), each with two vectors the embedding cache
holds under the caller's model: the one of its embedded text (`Chunk.embed_text`, the
body) and the one of its `path > symbol` header alone (`Chunk.header`), which a search
ranks on its own as a second vote (`retrieval.fusion`, `w_header_vector`). A chunk whose
body vector the cache lacks is left out and counted (`LocalVectorIndex.missing`); one
whose header vector it lacks is kept, searched by its body only, and re-read by the
first refresh after the sync has recorded that the cache holds every header. Search is
exact: the cosine of the query with every live vector (all vectors are L2-normalised,
so a dot product), best first. The vectors approximate the
code, so they live only under `.codeveil/vectors/` (0700) and never go to a server.

Layout on disk. A large immutable *base* and a small *delta*, as in `retrieval.lexical`:

    base-<id>.npy   float32 [2, n, dim] vectors of the base, a plain .npy (memory-mapped):
                    the body vectors, then the header vectors (zeros where none), each
                    plane contiguous (a strided half-row read costs a search +35%)
    base-<id>.npz   the base's chunk metadata, its vectors' xxh3-64 checksum, format
    delta.npz       the pointer: format, model id, dim, base id, the state database's
                    stamp, the deleted base rows, the delta's vectors and metadata, and
                    the file list (path -> digest) the index was built from

Write order: a new base's vectors, then its metadata, then `delta.npz`, each atomically
(temp file, fsync, rename, fsync of the folder); the replaced base is removed last.
Readers go the other way: `delta.npz` names the base it goes with. A crash leaves at
worst an unreferenced base, never a delta naming a base it does not match. Any file that
cannot be read, fails its checksum, or has another format is rebuilt from the state
database and the cache, with one warning; a search never fails for it.

Storage: float32. float16 would halve the disk (1.5 KB -> 0.77 KB per 384-dim chunk),
but measured on 100k clustered unit vectors (dim 384) it moves cosines by up to 8.7e-5
(mean 8.5e-6), which reorders the top 10 of 35% of queries and changes 1% of its
members: no longer the exact ranking the cache's vectors give. float32 also maps
straight into memory, so a new process opens a 100k base in milliseconds with no
conversion pass (float16 had to be widened: 0.37 s). Scores are computed with numpy's
BLAS matrix-vector product, which at 100k measured faster than faiss `IndexFlatIP`
(17 ms vs 23 ms on two cores) and needs no copy of the mapped vectors.

Keeping it current: triggers on `chunk_files` (insert, update, delete) and on
`pending_files` (insert, delete) bump a counter in the state database, next to a random
epoch that changes when the database is recreated. `current()` reads that one row; when
it matches the index's stamp the index in memory (or on disk) is returned as is. Else
the non-pending file list is compared with the one the index holds: only changed, new,
newly stored and deleted files are re-read, their base rows masked and their new rows
put in the delta; when the delta and the masked rows pass a tenth of the base, the two
are merged into a new base. A recreated database, a new model or dim, and a change of
more than half of the chunks rebuild from scratch.

Beyond about 1M chunks exact search costs ~170 ms and 1.5 GB of mapped vectors per
query; the next step is an approximate faiss index over the base (HNSW for recall at
low latency, or IVF-Flat, which `sync.store.vector_index` already trains and which supports
removal), with the delta still searched exactly and masked base rows filtered out.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import sqlite3
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import numpy as np
import xxhash
from threadpoolctl import ThreadpoolController

from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import (
    SQL_BATCH,
    change_stamp,
    count_chunks,
    headers_embedded,
    snapshot_reader,
)
from indexer.location import ChunkLocation
from indexer.private_files import private_dir, write_atomic
from retrieval.filters import HitFilter
from retrieval.lexical.segments import digest_rows, gather

log = logging.getLogger(__name__)

# 2: the vectors are two planes, the chunks' body vectors and their header vectors.
FORMAT_VERSION: Final = 2
DELTA_FILE: Final = "delta.npz"
# Merge the delta into the base once it (with the masked base rows) passes this share.
MERGE_SHARE: Final = 0.1
# A refresh that would re-read more than this share of chunks rebuilds from scratch.
REBUILD_SHARE: Final = 0.5
# A base file nothing points to (left by a crash) is removed once this old, so that a
# base another process has just written, and is about to point to, is left alone.
_ORPHAN_AGE_S: Final = 3600.0

_READ_BATCH: Final = 4096  # chunks whose vectors are looked up at once
_BASE_NAME = re.compile(r"^base-([0-9a-f]{16})\.(npy|npz)$")

Stamp = tuple[int, bytes]  # (change counter, database epoch)
Model = tuple[str, int]  # (model id, dim)

_UNREADABLE = (OSError, ValueError, EOFError, KeyError, IndexError, TypeError,
               UnicodeDecodeError, zipfile.BadZipFile)


# -- chunk metadata as columns ---------------------------------------------------------


@dataclass
class _Docs:
    """Where each row's chunk sits, as columns: what a segment stores besides vectors."""

    path_id: np.ndarray  # int32 [n]
    lines: np.ndarray  # int32 [n, 2]
    lang_id: np.ndarray  # int16 [n]
    sym_ptr: np.ndarray  # int64 [n + 1]
    sym_blob: np.ndarray  # uint8, utf-8 symbols back to back
    hashes: np.ndarray  # uint8 [n, 16], chunk hashes from the chunk table
    has_header: np.ndarray  # bool [n], the row holds a header vector
    paths: list[str]
    languages: list[str]

    def __len__(self) -> int:
        return len(self.path_id)

    @classmethod
    def of(cls, docs: Sequence[ChunkLocation], has_header: Sequence[bool] | None = None) -> _Docs:
        path_ids: dict[str, int] = {}
        lang_ids: dict[str, int] = {}
        syms = [d.symbol.encode("utf-8") for d in docs]
        sym_ptr = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in syms], out=sym_ptr[1:])
        return cls(
            np.fromiter((path_ids.setdefault(d.path, len(path_ids)) for d in docs),
                        dtype=np.int32, count=len(docs)),
            np.array([(d.start_line, d.end_line) for d in docs], dtype=np.int32).reshape(-1, 2),
            np.fromiter((lang_ids.setdefault(d.language, len(lang_ids)) for d in docs),
                        dtype=np.int16, count=len(docs)),
            sym_ptr,
            np.frombuffer(b"".join(syms), dtype=np.uint8).copy(),
            np.frombuffer(b"".join(d.chunk_hash.ljust(16, b"\0")[:16] for d in docs),
                          dtype=np.uint8).reshape(-1, 16).copy(),
            np.ones(len(docs), dtype=bool) if has_header is None
            else np.array(has_header, dtype=bool).reshape(-1),
            list(path_ids), list(lang_ids),
        )

    def doc(self, i: int) -> ChunkLocation:
        sym = self.sym_blob[self.sym_ptr[i] : self.sym_ptr[i + 1]].tobytes().decode("utf-8")
        return ChunkLocation(self.paths[self.path_id[i]], int(self.lines[i, 0]),
                             int(self.lines[i, 1]), sym, self.languages[self.lang_id[i]],
                             self.hashes[i].tobytes())

    def docs(self, rows: np.ndarray) -> list[ChunkLocation]:
        """`doc(i)` of each of `rows`, with the columns read once (a filtered search
        looks at thousands)."""
        blob = self.sym_blob.tobytes()
        starts, ends = self.sym_ptr[rows].tolist(), self.sym_ptr[rows + 1].tolist()
        hashes = self.hashes[rows].tobytes()
        paths, langs = self.paths, self.languages
        return [ChunkLocation(paths[p], s, e, blob[a:b].decode("utf-8"), langs[lg],
                       hashes[16 * j : 16 * j + 16])
                for j, (p, (s, e), lg, a, b) in enumerate(zip(
                    self.path_id[rows].tolist(), self.lines[rows].tolist(),
                    self.lang_id[rows].tolist(), starts, ends, strict=True))]

    def rows_of(self, paths: set[str]) -> np.ndarray:
        """bool [n]: the rows of chunks of `paths`."""
        if not paths or not len(self):
            return np.zeros(len(self), dtype=bool)
        hit = np.array([p in paths for p in self.paths])
        return hit[self.path_id]

    def take(self, rows: np.ndarray) -> _Docs:
        return _Docs.concat([(self, rows)])

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}{k}": v for k, v in (
            ("path_id", self.path_id), ("lines", self.lines), ("lang_id", self.lang_id),
            ("sym_ptr", self.sym_ptr), ("sym_blob", self.sym_blob), ("hashes", self.hashes),
            ("has_header", self.has_header), ("paths", _pack(self.paths)),
            ("languages", _pack(self.languages)))}

    @classmethod
    def load(cls, z: dict[str, np.ndarray], prefix: str) -> _Docs:
        docs = cls(z[f"{prefix}path_id"], z[f"{prefix}lines"], z[f"{prefix}lang_id"],
                   z[f"{prefix}sym_ptr"], z[f"{prefix}sym_blob"], z[f"{prefix}hashes"],
                   z[f"{prefix}has_header"].astype(bool), _unpack(z[f"{prefix}paths"]),
                   _unpack(z[f"{prefix}languages"]))
        n = len(docs)
        # Garbage that still parses must not index out of range at search time.
        if (docs.lines.shape != (n, 2) or docs.hashes.shape != (n, 16)
                or docs.has_header.shape != (n,) or len(docs.lang_id) != n
                or len(docs.sym_ptr) != n + 1
                or (n and (int(docs.path_id.max()) >= len(docs.paths)
                           or int(docs.lang_id.max()) >= len(docs.languages)
                           or int(docs.sym_ptr[-1]) > len(docs.sym_blob)))):
            raise ValueError("chunk metadata of inconsistent sizes")
        return docs

    @classmethod
    def concat(cls, parts: Sequence[tuple[_Docs, np.ndarray]]) -> _Docs:
        """The rows `rows` of each part, in order, as one; without a Python loop over
        rows (a merge of 100k rows), and naming only the paths those rows use."""
        paths: dict[str, int] = {}
        langs: dict[str, int] = {}
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("pid", "lid", "lines", "hashes",
                                                             "has_header", "sym_len", "blob")}
        for docs, rows in parts:
            cols["pid"].append(_remap(docs.path_id[rows], docs.paths, paths, np.int32))
            cols["lid"].append(_remap(docs.lang_id[rows], docs.languages, langs, np.int16))
            cols["lines"].append(docs.lines[rows])
            cols["hashes"].append(docs.hashes[rows])
            cols["has_header"].append(docs.has_header[rows])
            starts, ends = docs.sym_ptr[rows], docs.sym_ptr[rows + 1]
            cols["sym_len"].append(ends - starts)
            cols["blob"].append(gather(docs.sym_blob, starts, ends))
        if not parts:
            return _Docs.of([])
        sym_len = np.concatenate(cols["sym_len"])
        sym_ptr = np.zeros(len(sym_len) + 1, dtype=np.int64)
        np.cumsum(sym_len, out=sym_ptr[1:])
        return cls(np.concatenate(cols["pid"]), np.concatenate(cols["lines"]).reshape(-1, 2),
                   np.concatenate(cols["lid"]), sym_ptr,
                   np.concatenate(cols["blob"]).astype(np.uint8),
                   np.concatenate(cols["hashes"]).reshape(-1, 16),
                   np.concatenate(cols["has_header"]).astype(bool), list(paths), list(langs))


def _remap(ids: np.ndarray, names: list[str], into: dict[str, int],
           dtype: type[np.signedinteger]) -> np.ndarray:
    """`ids` (into `names`) as ids into the growing name table `into`."""
    if not len(ids):
        return np.zeros(0, dtype=dtype)
    used = np.unique(ids)
    table = np.zeros(int(used[-1]) + 1, dtype=dtype)
    table[used] = [into.setdefault(names[i], len(into)) for i in used.tolist()]
    return table[ids]


def _empty_docs() -> _Docs:
    return _Docs.of([])


def _no_vectors(dim: int) -> np.ndarray:
    return np.zeros((2, 0, dim), dtype=np.float32)


# -- the index -------------------------------------------------------------------------


class LocalVectorIndex:
    """Vectors of chunks: a base (often memory-mapped), its masked rows, and a delta.

    Rows run over the base, then the delta. `base` and `delta` are float32 [2, rows, dim]:
    plane 0 the chunks' body vectors, plane 1 their header vectors. Immutable: an update
    makes a new index.
    """

    def __init__(self, base: np.ndarray, base_docs: _Docs, deleted: np.ndarray,
                 delta: np.ndarray, delta_docs: _Docs, missing: int) -> None:
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
        if isinstance(keep, HitFilter):
            return self._nearest_in(self.rows_kept(keep), q[:, None], n, header)[0]
        scores = self.scores(q, header=header)
        if keep is None:
            best = _best(scores, min(n, count))
            return list(zip(self.docs(best), scores[best].tolist(), strict=True))
        out: list[tuple[ChunkLocation, float]] = []
        seen = 0
        width = min(count, max(4 * n, 64))
        while True:
            order = _best(scores, width)
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
        if keep is not None:
            return self._nearest_in(self.rows_kept(keep), qs.T, n, header)
        scores = self.scores(qs.T, header=header)
        out = []
        for column in scores.T:
            best = _best(column, min(n, count))
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
            best = _best(column, min(n, len(rows)))
            best = best[np.isfinite(column[best])]  # no header vector: not ranked
            out.append(list(zip(self.docs(rows[best]), column[best].tolist(), strict=True)))
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

    def updated(self, drop: set[str], vectors: np.ndarray, docs: _Docs,
                missing: int) -> LocalVectorIndex:
        """A new index without the chunks of `drop`, with the rows `vectors` / `docs`."""
        deleted = self.deleted | self.base_docs.rows_of(drop)
        kept = np.flatnonzero(~self.delta_docs.rows_of(drop))
        if len(kept) == len(self.delta_docs):
            delta = np.concatenate([self.delta, vectors], axis=1)
        else:
            delta = np.concatenate([self.delta[:, kept], vectors], axis=1)
        delta_docs = _Docs.concat([(self.delta_docs, kept), (docs, np.arange(len(docs)))])
        return LocalVectorIndex(self.base, self.base_docs, deleted, delta, delta_docs, missing)

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
        base = np.concatenate([np.asarray(self.base[:, live]), self.delta], axis=1)
        docs = _Docs.concat([(self.base_docs, live),
                             (self.delta_docs, np.arange(len(self.delta_docs)))])
        return LocalVectorIndex(base, docs, np.zeros(base.shape[1], dtype=bool),
                                _no_vectors(self.dim), _empty_docs(),
                                self.missing)


#: Scoring at most this many vector values (166k chunks of dim 384) runs on one BLAS
#: thread. A query's scoring is a matrix-vector product, bound by memory, and a pool of
#: threads on a busy machine waits for its slowest: measured side by side with two other
#: processes busy, 6.7k chunks took 8.0 ms on two threads and 1.2 ms on one, 100k chunks
#: 30 ms and 23.5 ms.
ONE_THREAD_VALUES: Final = 64_000_000

_blas: ThreadpoolController | None = None


@contextlib.contextmanager
def one_blas_thread(when: bool = True) -> Iterator[None]:
    """BLAS limited to one thread inside (when `when`); about 25 us to enter."""
    global _blas
    if not when:
        yield
        return
    if _blas is None:
        _blas = ThreadpoolController()  # inspects the loaded libraries once
    with _blas.limit(limits=1, user_api="blas"):
        yield


def _best(scores: np.ndarray, m: int) -> np.ndarray:
    """Rows of the `m` highest scores, best first, ties by row: the first `m` of one
    total order, so a wider call extends a narrower one's answer."""
    if m >= len(scores):
        cand = np.arange(len(scores))
    else:
        part = np.argpartition(-scores, m - 1)[:m]
        cand = np.flatnonzero(scores >= scores[part].min())  # every tie at the edge
    return cand[np.lexsort((cand, -scores[cand]))][:m]


# -- kept in step with the chunk table -------------------------------------------------


def read_stamp(db: sqlite3.Connection) -> Stamp:
    """(change counter, database epoch) of the chunk table and pending list as they are."""
    return change_stamp(db)


@dataclass
class _Saved:
    index: LocalVectorIndex
    stamp: Stamp
    model: Model
    files: dict[str, bytes]  # non-pending path -> the content digest its rows are of
    incomplete: dict[str, int] = field(default_factory=dict)  # path -> chunks left out
    base_id: bytes = b""


class LocalVectorStore:
    """The vector index of one repo, under `.codeveil/vectors/`, kept current.

    `current(...)` returns an index matching the chunk table: the one in memory if still
    current, else the saved one if current, else an updated one (reading only the chunks
    and vectors of files that changed), which is then saved. Thread-safe.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._saved: _Saved | None = None
        self._lock = threading.Lock()
        #: What the last refresh did and how long it took (for benchmarks and logs).
        self.last_refresh: dict[str, float | int | str] = {}

    def current(self, db: sqlite3.Connection, cache: EmbeddingCache, model_id: str,
                dim: int) -> LocalVectorIndex:
        model = (model_id, dim)
        with self._lock:
            stamp = read_stamp(db)
            saved = self._saved
            if saved is not None and saved.stamp == stamp and saved.model == model:
                return saved.index
            if saved is None or saved.model != model:
                saved = self._load(model)
                if saved is not None and saved.stamp == stamp:
                    self._saved = saved
                    return saved.index
            self._saved = self._refresh(db, cache, model, saved)
            return self._saved.index

    # -- disk -----------------------------------------------------------------------

    def problem(self, model_id: str, dim: int) -> str | None:
        """What is wrong with the saved index, if its files exist but cannot be used
        (truncated, garbled, a delta without its base); None when they are fine, absent,
        or of another model or format, which a search replaces as a matter of course
        (`codeveil doctor`)."""
        if not (self.directory / DELTA_FILE).exists():
            return None
        try:
            self._read((model_id, dim))
        except FileNotFoundError as exc:
            return f"its base is missing ({exc.filename or exc})"
        except _UNREADABLE as exc:
            return str(exc) or type(exc).__name__
        return None

    def _load(self, model: Model) -> _Saved | None:
        try:
            return self._read(model)
        except FileNotFoundError as exc:
            # No index yet, or another process replaced the base just now.
            log.debug("no usable vector index in %s (%s)", self.directory, exc)
            return None
        except _UNREADABLE as exc:
            # Truncated or garbled: it only caches what the state database and the
            # embedding cache hold, so it is rebuilt, not fatal.
            log.warning("the vector index in %s is damaged (%s); rebuilding it",
                        self.directory, exc)
            return None

    def _read(self, model: Model) -> _Saved | None:
        """The saved index of `model`; None if it is of another model or format. Raises
        what reading a missing or damaged file raises."""
        with np.load(self.directory / DELTA_FILE, allow_pickle=False) as z:
            zd = {k: z[k] for k in z.files}
        if int(zd["version"][0]) != FORMAT_VERSION:
            log.info("the vector index in %s is of format %d, not %d; rebuilding it",
                     self.directory, int(zd["version"][0]), FORMAT_VERSION)
            return None
        saved_model = (zd["model_id"].tobytes().decode("utf-8"), int(zd["dim"][0]))
        if saved_model != model:
            log.debug("the saved vector index is of %s, not %s", saved_model, model)
            return None
        base_id = zd["base_id"].tobytes()
        base, base_docs = self._load_base(base_id, model[1])
        delta = zd["delta"]
        delta_docs = _Docs.load(zd, "d_")
        deleted = zd["deleted"].astype(bool)
        if (delta.shape != (2, len(delta_docs), model[1]) or delta.dtype != np.float32
                or deleted.shape != (len(base_docs),)):
            raise ValueError("the delta does not fit its base")
        files = dict(zip(_unpack(zd["file_paths"]),
                         (row.tobytes() for row in zd["file_digests"]), strict=True))
        incomplete = dict(zip(_unpack(zd["incomplete_paths"]),
                              zd["incomplete_counts"].tolist(), strict=True))
        stamp = (int(zd["counter"][0]), zd["epoch"].tobytes())
        index = LocalVectorIndex(base, base_docs, deleted, delta, delta_docs,
                                 sum(incomplete.values()))
        return _Saved(index, stamp, model, files, incomplete, base_id)

    def _load_base(self, base_id: bytes, dim: int) -> tuple[np.ndarray, _Docs]:
        stem = self.directory / f"base-{base_id.hex()}"
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            zb = {k: z[k] for k in z.files}
        if int(zb["version"][0]) != FORMAT_VERSION or zb["base_id"].tobytes() != base_id:
            raise ValueError("the base's metadata belongs to another base")
        docs = _Docs.load(zb, "b_")
        # Mapped, not read: a new process pays for the pages its searches touch, once.
        vectors = np.load(stem.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
        if vectors.shape != (2, len(docs), dim) or vectors.dtype != np.float32:
            raise ValueError(f"base vectors of shape {vectors.shape} for {len(docs)} chunks")
        if _checksum(vectors) != int(zb["checksum"][0]):
            raise ValueError("the base vectors fail their checksum")
        return vectors, docs

    def _save(self, saved: _Saved, old_base: bytes | None) -> None:
        private_dir(self.directory)
        index = saved.index
        if saved.base_id != old_base:
            stem = self.directory / f"base-{saved.base_id.hex()}"
            write_atomic(stem.with_suffix(".npy"),
                          lambda f: np.save(f, np.ascontiguousarray(index.base)))
            write_atomic(stem.with_suffix(".npz"), lambda f: _savez(f, {
                "version": np.array([FORMAT_VERSION]),
                "base_id": np.frombuffer(saved.base_id, dtype=np.uint8),
                "checksum": np.array([_checksum(index.base)], dtype=np.uint64),
                **index.base_docs.arrays("b_")}))
        paths = list(saved.files)
        inc = list(saved.incomplete)
        write_atomic(self.directory / DELTA_FILE, lambda f: _savez(f, {
            "version": np.array([FORMAT_VERSION]),
            "model_id": np.frombuffer(saved.model[0].encode("utf-8"), dtype=np.uint8),
            "dim": np.array([saved.model[1]]),
            "base_id": np.frombuffer(saved.base_id, dtype=np.uint8),
            "counter": np.array([saved.stamp[0]], dtype=np.int64),
            "epoch": np.frombuffer(saved.stamp[1], dtype=np.uint8),
            "deleted": index.deleted,
            "delta": index.delta,
            **index.delta_docs.arrays("d_"),
            "file_paths": _pack(paths),
            "file_digests": digest_rows([saved.files[p] for p in paths]),
            "incomplete_paths": _pack(inc),
            "incomplete_counts": np.array([saved.incomplete[p] for p in inc], dtype=np.int64),
        }))
        self._remove_old_bases(saved.base_id, old_base)

    def _remove_old_bases(self, keep: bytes, replaced: bytes | None) -> None:
        now = time.time()
        for entry in self.directory.iterdir():
            m = _BASE_NAME.match(entry.name)
            stale_tmp = entry.name.startswith(".vec-")
            if not (m or stale_tmp) or (m and m.group(1) == keep.hex()):
                continue
            with contextlib.suppress(OSError):  # already gone, or still mapped on Windows
                ours = m is not None and replaced is not None and m.group(1) == replaced.hex()
                if ours or now - entry.stat().st_mtime > _ORPHAN_AGE_S:
                    entry.unlink()

    # -- refresh --------------------------------------------------------------------

    def _refresh(self, db: sqlite3.Connection, cache: EmbeddingCache, model: Model,
                 old: _Saved | None) -> _Saved:
        """Bring the index in line with the chunk table, read in one snapshot."""
        t0 = time.perf_counter()
        reader = snapshot_reader(db)
        try:
            reader.execute("BEGIN")  # one WAL snapshot: stamp, file list and rows agree
            stamp = read_stamp(reader)
            files = {p: bytes(d) for p, d in reader.execute(
                "SELECT path, digest FROM chunk_files"
                " WHERE path NOT IN (SELECT path FROM pending_files)")}
            if old is not None and old.stamp[1] == stamp[1]:
                # Chunks without a header vector are re-read once the cache holds
                # them all (the sync records that), not on every refresh before.
                headless = (old.index.paths_without_headers()
                            if headers_embedded(reader, model[0]) else set())
                changed = [p for p, d in files.items()
                           if old.files.get(p) != d or p in old.incomplete or p in headless]
                dropped = {p for p in old.files if p not in files}
                total = reader.execute("SELECT count(*) FROM chunks").fetchone()[0]
                rebuild = count_chunks(reader, changed) > REBUILD_SHARE * max(total, 1)
            else:
                # No index, or a recreated database, whose rows may be cut differently
                # from the same files: start over.
                changed, dropped, rebuild = [], set(), True
            rows = _read_rows(reader, None if rebuild else changed)
            vectors, docs, incomplete = _vectors_of(rows, cache, model)
            reader.execute("COMMIT")
        finally:
            reader.close()
        t1 = time.perf_counter()
        if rebuild or old is None:
            index = LocalVectorIndex(vectors, docs, np.zeros(len(docs), dtype=bool),
                                     _no_vectors(model[1]), _empty_docs(),
                                     sum(incomplete.values()))
            mode = "rebuild"
        else:
            reread = {*changed, *dropped}
            incomplete = {**{p: k for p, k in old.incomplete.items() if p not in reread},
                          **incomplete}
            index = old.index.updated(reread, vectors, docs,
                                      sum(incomplete.values()))
            mode = "update"
            if index.needs_merge():
                index = index.merged()
                mode = "merge"
        base_id = old.base_id if mode == "update" and old is not None else secrets.token_bytes(8)
        saved = _Saved(index, stamp, model, files, incomplete, base_id)
        t2 = time.perf_counter()
        try:
            self._save(saved, old.base_id if old is not None else None)
        except OSError as exc:
            # A read-only or full disk costs the next process a rebuild, not this search.
            log.warning("could not save the vector index in %s: %s", self.directory, exc)
        self.last_refresh = {
            "mode": mode, "chunks": index.count, "read": len(docs),
            "missing": index.missing, "seconds_read": round(t1 - t0, 4),
            "seconds_build": round(t2 - t1, 4),
            "seconds_save": round(time.perf_counter() - t2, 4),
        }
        log.debug("vector refresh: %s", self.last_refresh)
        return saved


def _vectors_of(rows: Iterator[tuple[Chunk, bytes]], cache: EmbeddingCache,
                model: Model) -> tuple[np.ndarray, _Docs, dict[str, int]]:
    """(rows of body and header vectors, metadata, path -> chunks without a body
    vector) of the chunks `rows`."""
    model_id, dim = model
    parts: list[np.ndarray] = []
    docs: list[ChunkLocation] = []
    has_header: list[bool] = []
    incomplete: dict[str, int] = {}
    no_header = np.zeros(dim, dtype=np.float32)
    while batch := list(_take(rows, _READ_BATCH)):
        keys = [cache_key(model_id, c.embed_text) for c, _ in batch]
        header_keys = [cache_key(model_id, c.header) for c, _ in batch]
        found = cache.get_many([*keys, *header_keys], dim)
        have = []
        for (c, h), k, hk in zip(batch, keys, header_keys, strict=True):
            if k not in found:
                incomplete[c.path] = incomplete.get(c.path, 0) + 1
                continue
            head = found.get(hk)
            have.append((c, h, found[k], no_header if head is None else head))
            has_header.append(head is not None)
        if have:
            part = np.empty((2, len(have), dim), dtype=np.float32)
            part[0] = np.stack([v for _, _, v, _ in have])
            part[1] = np.stack([hv for _, _, _, hv in have])
            parts.append(part)
            docs.extend(ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language, h)
                        for c, h, _, _ in have)
    vectors = np.concatenate(parts, axis=1) if parts else _no_vectors(dim)
    return vectors, _Docs.of(docs, has_header), incomplete


def _take(it: Iterator[tuple[Chunk, bytes]], n: int) -> Iterator[tuple[Chunk, bytes]]:
    for _ in range(n):
        try:
            yield next(it)
        except StopIteration:
            return


def _read_rows(db: sqlite3.Connection,
               paths: Sequence[str] | None) -> Iterator[tuple[Chunk, bytes]]:
    """(chunk, chunk hash as stored) of the non-pending files (or of `paths`)."""
    cols = "path, start_line, end_line, language, symbol, text, chunk_hash"
    if paths is None:
        queries: list[tuple[str, Sequence[str]]] = [(
            f"SELECT {cols} FROM chunks WHERE path NOT IN (SELECT path FROM pending_files)"
            " ORDER BY path, ordinal", [])]
    else:
        queries = []
        for start in range(0, len(paths), SQL_BATCH):
            part = list(paths[start : start + SQL_BATCH])
            marks = ",".join("?" * len(part))
            queries.append((f"SELECT {cols} FROM chunks WHERE path IN ({marks})"
                            " ORDER BY path, ordinal", part))
    for sql, args in queries:
        for p, s, e, lang, sym, text, h in db.execute(sql, args):
            yield Chunk(p, s, e, lang, sym, text), bytes(h)


def _checksum(vectors: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(vectors).reshape(-1).view(np.uint8).data)


def _savez(f: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    np.savez(f, **arrays)  # type: ignore[arg-type]


def _pack(items: Sequence[str]) -> np.ndarray:
    # NUL never occurs in a path, a language name or a symbol.
    return np.frombuffer("\0".join(items).encode("utf-8"), dtype=np.uint8).copy()


def _unpack(raw: np.ndarray) -> list[str]:
    text = raw.tobytes().decode("utf-8")
    return text.split("\0") if text else []


