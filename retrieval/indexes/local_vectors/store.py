"""The vector index of one repo on disk, under `.codeveil/vectors/` (0700), kept in step
with the chunk table and the embedding cache (`retrieval.indexes.derived.store`).

Layout (the package's docstring says why): `base-<id>.npy` the base's two vector planes,
memory-mapped; `base-<id>.npz` its chunk metadata and checksum; `delta.npz` the pointer
(model, base id, stamp, masked rows, the delta, the file list). Write order: base
vectors, base metadata, then the pointer, each atomically; the replaced base last.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import subprocess
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import change_stamp, count_chunks, headers_embedded
from indexer.location import ChunkLocation
from indexer.private_files import private_dir, write_atomic
from retrieval.indexes.derived.columns import digest_rows, pack, unpack
from retrieval.indexes.derived.store import (
    UNREADABLE,
    DerivedStore,
    FileDiff,
    Saved,
    chunk_rows,
    read_files,
)
from retrieval.indexes.local_vectors.approx import ApproxPlanes, approx_min_chunks
from retrieval.indexes.local_vectors.approx_build import (
    approx_path,
    building,
    failure_path,
    start_build,
)
from retrieval.indexes.local_vectors.docs import VectorDocs
from retrieval.indexes.local_vectors.index import LocalVectorIndex, no_vectors
from retrieval.indexes.local_vectors.mapped import file_checksum
from retrieval.indexes.local_vectors.spill import copy_rows, save_planes, spill_planes

# Log lines name the package, whichever of its modules writes them.
log = logging.getLogger("retrieval.indexes.local_vectors")

# 2: the vectors are two planes, the chunks' body vectors and their header vectors.
FORMAT_VERSION: Final = 2
DELTA_FILE: Final = "delta.npz"
# A refresh that would re-read more than this share of chunks rebuilds from scratch.
REBUILD_SHARE: Final = 0.5

_READ_BATCH: Final = 4096  # chunks whose vectors are looked up at once
# A base's files, its approximate index among them.
_BASE_NAME = re.compile(r"^(?:base|approx)-([0-9a-f]{16})\.(npy|npz|building|failed)$")

Stamp = tuple[int, bytes]  # (change counter, database epoch)
Model = tuple[str, int]  # (model id, dim)
# What a refresh reads: (rows of body and header vectors, their chunks' locations).
_Rows = tuple[np.ndarray, VectorDocs]


def read_stamp(db: sqlite3.Connection) -> Stamp:
    """(change counter, database epoch) of the chunk table and pending list as they are."""
    return change_stamp(db)


class LocalVectorStore(DerivedStore[LocalVectorIndex, _Rows]):
    """The vector index of one repo, under `.codeveil/vectors/`, kept current.

    `current(...)` returns an index matching the chunk table: the one in memory if still
    current, else the saved one if current, else an updated one (reading only the chunks
    and vectors of files that changed), which is then saved. Thread-safe.
    """

    label = "vector index"
    log = log

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self._cache: EmbeddingCache | None = None
        # The approximate index of the newest base it was read for, and the build
        # process this store started.
        self._approx: tuple[bytes, ApproxPlanes] | None = None
        self._builder: subprocess.Popen[bytes] | None = None
        self._failures_told: set[bytes] = set()  # bases whose failed build was logged
        #: Approximate index builds this store started (not read from disk).
        self.approx_builds = 0

    def current(self, db: sqlite3.Connection, cache: EmbeddingCache, model_id: str,
                dim: int) -> LocalVectorIndex:
        with self._lock:
            self._cache = cache  # what the refresh reads vectors from, under the same lock
            index = self._current(db, (model_id, dim))
            self._attach_approx(index)
            return index

    def wait_approx(self, timeout: float | None = None) -> bool:
        """Wait for the build of the approximate index this store started, or another
        process runs, for the newest base it knows; whether none runs now."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._builder is not None:
            try:
                self._builder.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
        saved = self._saved
        while saved is not None and building(self.directory, saved.base_id):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    # -- the approximate index ------------------------------------------------------

    def _attach_approx(self, index: LocalVectorIndex) -> None:
        """Give a large base its approximate index: the one in memory, the saved one,
        or one a process of its own builds while exact search answers
        (`retrieval.indexes.local_vectors.approx_build`)."""
        saved = self._saved
        if (index.approx is not None or saved is None or saved.index is not index
                or index.base.shape[1] < approx_min_chunks()):
            return
        base_id = saved.base_id
        if self._approx is not None and self._approx[0] == base_id:
            index.approx = self._approx[1]
            return
        path = approx_path(self.directory, base_id)
        try:
            planes = ApproxPlanes.load(path, index.base.shape[1], index.dim)
        except FileNotFoundError:
            pass
        except (*UNREADABLE, RuntimeError) as exc:  # faiss raises RuntimeError
            log.warning("the approximate vector index in %s is damaged (%s); rebuilding it",
                        self.directory, exc)
            with contextlib.suppress(OSError):
                path.unlink()  # warned once; the builder writes a sound one
        else:
            self._approx = (base_id, planes)
            index.approx = planes
            return
        if self._builder is not None and self._builder.poll() is None:
            return  # ours runs; a current() after it ends reads what it saved
        started = start_build(self.directory, base_id)
        if started is not None:
            self._builder = started
            self.approx_builds += 1
        elif base_id not in self._failures_told:
            failed = failure_path(self.directory, base_id)
            with contextlib.suppress(OSError):
                log.warning("the approximate vector index in %s could not be built (%s); "
                            "search stays exact until the next merge of its base or "
                            "`codeveil doctor --repair`",
                            self.directory, failed.read_text().strip())
                self._failures_told.add(base_id)

    def problem(self, model_id: str, dim: int) -> str | None:
        """What is wrong with the saved index, if its files exist but cannot be used
        (truncated, garbled, a delta without its base); None when they are fine, absent,
        or of another model or format, which a search replaces as a matter of course
        (`codeveil doctor`)."""
        if not (self.directory / DELTA_FILE).exists():
            return None
        try:
            self._read_saved((model_id, dim))
        except FileNotFoundError as exc:
            return f"its base is missing ({exc.filename or exc})"
        except UNREADABLE as exc:
            return str(exc) or type(exc).__name__
        return None

    def approx_failure(self) -> tuple[Path, str] | None:
        """(the record, why) when the saved base's approximate index could not be built
        (`codeveil doctor`); None when it was, is being, or need not be."""
        try:
            with np.load(self.directory / DELTA_FILE, allow_pickle=False) as z:
                base_id = z["base_id"].tobytes()
        except UNREADABLE:  # no saved index, or a damaged one: `problem` says so
            return None
        record = failure_path(self.directory, base_id)
        try:
            return record, record.read_text().strip()
        except FileNotFoundError:
            return None

    # -- what the refresh reads and builds ------------------------------------------

    def read_stamp(self, db: sqlite3.Connection) -> Stamp:
        return read_stamp(db)

    def _covered(self, reader: sqlite3.Connection) -> dict[str, bytes]:
        # A pending file's vectors are not ready yet.
        return read_files(reader, ready_only=True)

    def _continues(self, old: Saved[LocalVectorIndex], stamp: Hashable) -> bool:
        return old.stamp[1] == stamp[1]  # type: ignore[index]  # the same database

    def _reread(self, reader: sqlite3.Connection, old: Saved[LocalVectorIndex],
                key: Hashable) -> set[str]:
        # Chunks without a header vector are re-read once the cache holds them all
        # (the sync records that), not on every refresh before.
        model_id = key[0]  # type: ignore[index]
        return old.index.paths_without_headers() if headers_embedded(reader, model_id) else set()

    def _rebuilds(self, reader: sqlite3.Connection, changed: list[str],
                  files: dict[str, bytes]) -> bool:
        total = reader.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return count_chunks(reader, changed) > REBUILD_SHARE * max(total, 1)

    def _read_rows(self, reader: sqlite3.Connection, diff: FileDiff,
                   key: Hashable) -> tuple[_Rows, dict[str, int]]:
        assert self._cache is not None, "current() sets the cache before a refresh"
        rows = ((Chunk(p, s, e, lang, sym, text), bytes(h)) for p, s, e, lang, sym, text, h
                in chunk_rows(reader, "path, start_line, end_line, language, symbol, text,"
                              " chunk_hash", diff.to_read, order="path, ordinal",
                              ready_only=True))
        # At most this many rows, counted in the same snapshot the rows are read from
        # (pending files' chunks are counted, not read): they go straight into a map
        # of that size when large.
        to_read = diff.to_read
        capacity = (reader.execute("SELECT count(*) FROM chunks").fetchone()[0]
                    if to_read is None else count_chunks(reader, to_read))
        vectors, docs, incomplete = _vectors_of(rows, self._cache, key,  # type: ignore[arg-type]
                                                capacity, self.directory)
        return (vectors, docs), incomplete

    def _build(self, rows: _Rows, key: Hashable, missing: int) -> LocalVectorIndex:
        vectors, docs = rows
        return LocalVectorIndex(vectors, docs, np.zeros(len(docs), dtype=bool),
                                no_vectors(key[1]), VectorDocs.empty(),  # type: ignore[index]
                                missing, spill_dir=self.directory)

    def _update(self, index: LocalVectorIndex, drop: set[str], rows: _Rows, key: Hashable,
                missing: int) -> LocalVectorIndex:
        return index.updated(drop, *rows, missing)

    def _report(self, saved: Saved[LocalVectorIndex], mode: str, rows: _Rows) -> dict[str, Any]:
        index = saved.index
        return {"mode": mode, "chunks": index.count, "read": len(rows[1]),
                "missing": index.missing}

    # -- disk -----------------------------------------------------------------------

    def _read_saved(self, key: Hashable) -> Saved[LocalVectorIndex] | None:
        with np.load(self.directory / DELTA_FILE, allow_pickle=False) as z:
            zd = {k: z[k] for k in z.files}
        if int(zd["version"][0]) != FORMAT_VERSION:
            log.info("the vector index in %s is of format %d, not %d; rebuilding it",
                     self.directory, int(zd["version"][0]), FORMAT_VERSION)
            return None
        model = (zd["model_id"].tobytes().decode("utf-8"), int(zd["dim"][0]))
        if model != key:
            log.debug("the saved vector index is of %s, not %s", model, key)
            return None
        base_id = zd["base_id"].tobytes()
        base, base_docs = self._load_base(base_id, model[1])
        delta = zd["delta"]
        delta_docs = VectorDocs.load(zd, "d_")
        deleted = zd["deleted"].astype(bool)
        if (delta.shape != (2, len(delta_docs), model[1]) or delta.dtype != np.float32
                or deleted.shape != (len(base_docs),)):
            raise ValueError("the delta does not fit its base")
        files = dict(zip(unpack(zd["file_paths"]),
                         (row.tobytes() for row in zd["file_digests"]), strict=True))
        incomplete = dict(zip(unpack(zd["incomplete_paths"]),
                              zd["incomplete_counts"].tolist(), strict=True))
        stamp = (int(zd["counter"][0]), zd["epoch"].tobytes())
        index = LocalVectorIndex(base, base_docs, deleted, delta, delta_docs,
                                 sum(incomplete.values()), spill_dir=self.directory)
        return Saved(index, stamp, files, base_id, model, incomplete)

    def _load_base(self, base_id: bytes, dim: int) -> tuple[np.ndarray, VectorDocs]:
        stem = self.directory / f"base-{base_id.hex()}"
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            zb = {k: z[k] for k in z.files}
        if int(zb["version"][0]) != FORMAT_VERSION or zb["base_id"].tobytes() != base_id:
            raise ValueError("the base's metadata belongs to another base")
        docs = VectorDocs.load(zb, "b_")
        # Mapped, not read: a new process pays for the pages its searches touch, once.
        vectors = np.load(stem.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
        if vectors.shape != (2, len(docs), dim) or vectors.dtype != np.float32:
            raise ValueError(f"base vectors of shape {vectors.shape} for {len(docs)} chunks")
        # Read from the file, not through the map: the check leaves no page resident.
        if file_checksum(stem.with_suffix(".npy"), int(vectors.offset)) \
                != int(zb["checksum"][0]):
            raise ValueError("the base vectors fail their checksum")
        return vectors, docs

    def _write(self, saved: Saved[LocalVectorIndex], old: Saved[LocalVectorIndex] | None,
               *, base_changed: bool) -> None:
        private_dir(self.directory)
        index = saved.index
        model: Model = saved.key  # type: ignore[assignment]
        stamp: Stamp = saved.stamp  # type: ignore[assignment]
        old_base = old.base_id if old is not None else None
        if saved.base_id != old_base:
            stem = self.directory / f"base-{saved.base_id.hex()}"
            checksum: list[int] = []  # taken while the vectors are written, a slice at a time
            write_atomic(stem.with_suffix(".npy"),
                         lambda f: checksum.append(save_planes(f, index.base)))
            write_atomic(stem.with_suffix(".npz"), lambda f: _savez(f, {
                "version": np.array([FORMAT_VERSION]),
                "base_id": np.frombuffer(saved.base_id, dtype=np.uint8),
                "checksum": np.array(checksum[-1:], dtype=np.uint64),
                **index.base_docs.arrays("b_")}))
        paths = list(saved.files)
        inc = list(saved.incomplete)
        write_atomic(self.directory / DELTA_FILE, lambda f: _savez(f, {
            "version": np.array([FORMAT_VERSION]),
            "model_id": np.frombuffer(model[0].encode("utf-8"), dtype=np.uint8),
            "dim": np.array([model[1]]),
            "base_id": np.frombuffer(saved.base_id, dtype=np.uint8),
            "counter": np.array([stamp[0]], dtype=np.int64),
            "epoch": np.frombuffer(stamp[1], dtype=np.uint8),
            "deleted": index.deleted,
            "delta": index.delta,
            **index.delta_docs.arrays("d_"),
            "file_paths": pack(paths),
            "file_digests": digest_rows([saved.files[p] for p in paths]),
            "incomplete_paths": pack(inc),
            "incomplete_counts": np.array([saved.incomplete[p] for p in inc], dtype=np.int64),
        }))
        self.remove_old_bases(_BASE_NAME, saved.base_id, old_base, temp_prefix=".vec-")


def _vectors_of(rows: Iterator[tuple[Chunk, bytes]], cache: EmbeddingCache,
                model: Model, capacity: int, spill_dir: Path | None,
                ) -> tuple[np.ndarray, VectorDocs, dict[str, int]]:
    """(rows of body and header vectors, metadata, path -> chunks without a body
    vector) of the chunks `rows`, at most `capacity` of them, written into a map in
    `spill_dir` when large (`spill_planes`)."""
    model_id, dim = model
    out = spill_planes(spill_dir, capacity, dim)
    filled = 0
    # The rows' locations as columns a batch at a time: a list of 1M ChunkLocations
    # held 300 MB at the end of a 1M-chunk join.
    parts: list[VectorDocs] = []
    incomplete: dict[str, int] = {}
    no_header = np.zeros(dim, dtype=np.float32)
    while batch := list(_take(rows, _READ_BATCH)):
        keys = [cache_key(model_id, c.embed_text) for c, _ in batch]
        header_keys = [cache_key(model_id, c.header) for c, _ in batch]
        found = cache.get_many([*keys, *header_keys], dim)
        have = []
        has_header: list[bool] = []
        for (c, h), k, hk in zip(batch, keys, header_keys, strict=True):
            if k not in found:
                incomplete[c.path] = incomplete.get(c.path, 0) + 1
                continue
            head = found.get(hk)
            have.append((c, h, found[k], no_header if head is None else head))
            has_header.append(head is not None)
        if have:
            copy_rows(out, 0, filled, np.stack([v for _, _, v, _ in have]))
            copy_rows(out, 1, filled, np.stack([hv for _, _, _, hv in have]))
            filled += len(have)
            parts.append(VectorDocs.of([ChunkLocation(c.path, c.start_line, c.end_line,
                                                      c.symbol, c.language, h)
                                        for c, h, _, _ in have], has_header))
    docs = (VectorDocs.concat([(p, np.arange(len(p))) for p in parts]) if parts
            else VectorDocs.empty())
    return out[:, :filled], docs, incomplete


def _take(it: Iterator[tuple[Chunk, bytes]], n: int) -> Iterator[tuple[Chunk, bytes]]:
    for _ in range(n):
        try:
            yield next(it)
        except StopIteration:
            return


def _savez(f: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    np.savez(f, **arrays)  # type: ignore[arg-type]
