"""The search index of a server-search workspace: kept equal to its LanceDB rows,
snapshotted, loaded, caught up and rebuilt.

Search runs on one faiss index per workspace (sync.store.embedded.vector_index): exact L2 while the
workspace is small, IVF beyond `IndexPolicy.exact_max_rows` rows, retrained as it grows.
`apply` keeps it in step. Chunk rows get their faiss ids (`rid`) from a counter in
tree.sqlite, not from their chunk ids, so two rows with the same chunk id (a client bug,
or a 64-bit prefix collision) can never remove each other from the index, and a rid
always stands for the same row: an index of any earlier state can be brought up to date
by comparing its rids with LanceDB's ("catching up"), without a rebuild.

The index and its rows are written to `search.index` now and then, with the generation
they reflect: by an apply, at most every `index_save_interval` seconds or right after a
rebuild, and on close; never while a search waits. An apply that deletes rows while no
save is due removes the snapshot instead (it holds those rows' vectors and metadata),
so superseded rows never wait in it for the next save. A snapshot is only written from an
index known to equal LanceDB's rows at that generation: one built or caught up while
holding the writer lock, and kept in step by this process's own applies since. On open,
a snapshot of the current generation is used as it is; an older one is caught up; none,
or one that does not fit, means a rebuild from LanceDB. A crash between saves costs a
catch-up, never correctness.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.lazy import LazyModule
from sync.records import SearchHit
from sync.store.core.checks import Update
from sync.store.core.rows import fid_of
from sync.store.embedded.lance_rows import LanceRows
from sync.store.embedded.lance_table import COLUMNS, LANCE_ADVICE, Scanned, arrow_rows, lance_reads
from sync.store.embedded.pool import unscoped
from sync.store.embedded.sqlite_tree import Plan
from sync.store.embedded.vector_index import (
    RowTable,
    SnapshotError,
    VectorIndex,
    chunk_id_array,
    pack,
    read_snapshot,
    read_snapshot_info,
    write_snapshot,
)
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import StoreCorrupt

# faiss takes ~50 ms to import; a sync with nothing to send never needs it.
if TYPE_CHECKING:
    import faiss
else:
    faiss = LazyModule("faiss")

log = logging.getLogger(__name__)

SNAPSHOT = "search.index"
# A snapshot temp file this old was left by a writer that died mid-save.
_STALE_TEMP_SECONDS = 3600.0


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Delete temp files of snapshots whose writer died mid-save (they are large)."""
    cutoff = time.time() - _STALE_TEMP_SECONDS
    for tmp in folder.glob(f".{name}.*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()


class _RWLock:
    """Many readers or one writer: searches share the faiss index, updates swap it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            # Waiting writers go first, so a stream of searches cannot starve an apply.
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class SearchIndex:
    """A server-search workspace's search index, the rows it stands for and the LanceDB
    table (`table`) it is kept equal to (the module docstring). A server-search
    workspace's rows (sync.store.embedded.search_rows) hold one and call it at the steps
    of an apply:
    `prepare_write`, `follow`, `replace_rows`, `after_apply`; and for `search`,
    `count`, `verify` and `close`. What happened to the index is counted in the
    files' `events`."""

    def __init__(self, files: WorkspaceFiles) -> None:
        self.files = files
        self.table = LanceRows(files)
        # _index and _rows change together, under the write lock and _index_lock.write().
        self._index_lock = _RWLock()
        self._index: VectorIndex | None = None
        self._rows = RowTable()  # rid -> (chunk_id, meta); fid -> rids
        self._loaded_generation = -1
        self._index_stale = False  # may disagree with _rows: rebuild from LanceDB
        self._index_behind = False  # agrees with _rows, LanceDB may differ: catch up
        self._index_clean = False  # equals LanceDB's rows at _loaded_generation
        self._saved_generation = -1  # of the snapshot on disk, as far as we know
        self._next_save = 0.0  # time.monotonic() before which applies do not snapshot

    # -- what the workspace calls -------------------------------------------------------

    def search(self, query: np.ndarray, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `query` (1 x dim, checked) by Euclidean distance."""
        self._refresh()
        self._set_faiss_threads()
        with self._index_lock.read():
            index = self._index
            if index is None or index.ntotal == 0:
                return []
            dist, ids = index.search(query, min(k, index.ntotal))
            found = [
                (d, rid) for d, rid in zip(dist[0].tolist(), ids[0].tolist(), strict=True)
                if rid >= 0
            ]
            rows = self._rows.lookup([rid for _, rid in found])
        return [
            SearchHit(chunk_id, max(d, 0.0) ** 0.5, meta)
            for (d, _), (chunk_id, meta) in zip(found, rows, strict=True)
        ]

    def count(self) -> tuple[int, dict[str, Any] | None]:
        """The rows and a description of the index, if it is current. Counting must not
        build the index (`codeveil status` never searches): the snapshot's trailer counts
        its rows, and if it is of the current generation that is the count, and LanceDB
        (seconds to import) is not needed."""
        if self._current():
            with self._index_lock.read():
                return len(self._rows), (None if self._index is None
                                         else self._index.describe())
        rows = self._snapshot_rows()
        if rows is None:
            rows = self.table.counted()
        if rows is None:
            rows = self.table.count()
        return rows, None

    def follow(self, generation: int) -> None:
        """The apply under way bumped the generation to `generation`: its own change,
        which the index follows as it goes."""
        self._loaded_generation = generation

    def replace_rows(self, plan: Plan, updates: list[Update]) -> int:
        """Step 2 of an apply: the rows of `plan.fids` replaced by those of `updates`,
        in LanceDB and then in the index; returns how many rows were deleted."""
        # Only files that have rows: a new file costs LanceDB nothing. (prepare_write
        # made the index equal LanceDB's rows, so the row table knows every file's rows.)
        old = sorted(f for f in plan.fids if self._rows.has_file(f))
        n = sum(len(u.chunk_ids) for u in updates)
        dim = self.files.dim
        rids = np.arange(plan.first_rid, plan.first_rid + n, dtype=np.int64)
        fids = np.repeat(
            np.array([fid_of(unscoped(u.file_key)) for u in updates], dtype=np.int64),
            [len(u.chunk_ids) for u in updates],
        )
        chunk_ids = [c for u in updates for c in u.chunk_ids]
        metas = [m for u in updates for m in u.metas]
        vectors = (np.concatenate([u.vectors for u in updates]) if n
                   else np.empty((0, dim), np.float32))
        try:
            self.table.replace(old, arrow_rows(dim, rids, chunk_ids, fids, vectors, metas)
                               if n else None)
        except BaseException:
            # LanceDB may hold part of the change; the index still agrees with its own
            # rows, so the next user catches it up to whatever LanceDB holds.
            self._index_behind = True
            raise
        try:
            with self._index_lock.write():
                index = self._index
                assert index is not None  # prepare_write built it
                removed = self._rows.remove_files(old)
                index.remove(removed)
                index.add(vectors, rids)
                self._rows.append(rids, fids, chunk_id_array(chunk_ids), *pack(metas))
        except BaseException:
            self._index_stale = True  # the index and its rows may disagree now
            raise
        return len(removed)

    def after_apply(self, deleted: int) -> None:
        """After an apply's last step (the table purged or compacted): retrain the index
        if the workspace outgrew it, and snapshot it if a save is due, or else drop a
        snapshot that holds rows just deleted."""
        self._maybe_rebuild()
        if self._save_due():
            self._save_index()
        elif deleted:
            self._drop_snapshot()

    def verify(self, *, deep: bool) -> None:
        """As `WorkspaceStore.verify`: with the table open and `deep`, its rows counted
        and compared with the index's; otherwise only its files are looked at."""
        with self.files.write_lock if deep else contextlib.nullcontext():
            if deep and self.table.is_open and self._current() and self._index_clean:
                with lance_reads(self.table.dir):
                    self.table.handle.checkout_latest()
                    stored = self.table.handle.count_rows()
                if stored != len(self._rows):
                    raise StoreCorrupt(
                        f"the chunk table {self.table.dir} holds {stored} rows where the"
                        f" search index holds {len(self._rows)}; {LANCE_ADVICE}"
                    )
                return
        rows = self._snapshot_rows()
        if rows is None:
            rows = self.table.counted()
        self.table.check_files(rows)

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot, then drop it
        (caller holds the write lock)."""
        if self._index is not None and self._loaded_generation != self._saved_generation:
            with self.files.flock():
                self._save_index()
        with self._index_lock.write():
            self._index = None
            self._rows = RowTable()

    def _current(self) -> bool:
        return (
            self._index is not None
            and not self._index_stale
            and not self._index_behind
            and self.files.generation() == self._loaded_generation
        )

    def _refresh(self) -> None:
        """Before a search: bring the index up to date if another process changed the
        workspace (or there is none yet)."""
        if self._current():
            return
        # An apply running in this process brings the index up to date before it writes
        # and keeps it in step as it goes; the generation it bumps is its own. Wait for it
        # only when there is no index at all yet.
        if not self.files.write_lock.acquire(blocking=self._index is None):
            return
        try:
            self.files.check_open()
            # With the writer lock the result is clean, so close() may snapshot it (a
            # search never waits for a snapshot to be written); without it (a writer is
            # busy, and a search never waits for one either) it may reflect half an
            # apply, which the generation check repairs on the next search.
            with self.files.flock(blocking=False) as held:
                try:
                    self._reload_if_needed(locked=held)
                    return
                except StoreCorrupt:
                    if held:
                        raise
            # Read while another process wrote: it may have removed the table version
            # being read (sync.store.core.rows). Read again once it is done; a failure now is
            # damage.
            with self.files.flock():
                self._reload_if_needed(locked=True)
        finally:
            self.files.write_lock.release()

    def prepare_write(self) -> None:
        """Under the write locks, before an apply's step 1: the table handle at the
        latest version, and the index equal to its rows (clean, see the module
        docstring)."""
        self.table.checkout_latest()
        self._set_faiss_threads()  # for this thread's index updates in step 2
        self._reload_if_needed(locked=True)

    def _reload_if_needed(self, *, locked: bool) -> None:
        """Caller holds the write lock, and the flock if `locked` (then the index ends up
        clean). Loads the snapshot if there is no index yet, catches the index up with
        LanceDB, or rebuilds it from LanceDB. New indexes are built aside and swapped in,
        so searches keep running on the old one meanwhile."""
        if self._current() and (self._index_clean or not locked):
            return
        generation = self.files.generation()  # before reading rows: a later change shows up
        self._set_faiss_threads()
        loaded = self._index is None and self._load_snapshot(generation)
        if loaded and self._loaded_generation == generation:
            # Saved clean at this generation, and no writer has begun since (its first
            # step would have bumped it): equal to LanceDB as it stands.
            self._index_clean = True
            self._maybe_rebuild()
            return
        self.table.checkout_latest()
        if self._index is None or self._index_stale or not self._catch_up(generation):
            self._build_from_table(generation)
        self._index_clean = locked
        self._maybe_rebuild()

    def _snapshot_rows(self) -> int | None:
        """Rows in the snapshot on disk if it is of the current generation, else None."""
        try:
            info = read_snapshot_info(self.files.path / SNAPSHOT)
        except (FileNotFoundError, SnapshotError, OSError):
            return None
        rows = info.get("rows")
        if not isinstance(rows, int) or info.get("generation") != self.files.generation():
            return None
        return rows

    def _load_snapshot(self, generation: int) -> bool:
        """Install the snapshot on disk if there is one that fits this workspace."""
        path = self.files.path / SNAPSHOT
        started = time.perf_counter()
        try:
            info = read_snapshot_info(path)
            next_rid = self.files.next_rid()
            # A snapshot from the future (tree.sqlite restored from a backup, say) may
            # hold rids that now stand for other rows.
            if info.get("dim") != self.files.dim or not (
                info.get("generation", generation + 1) <= generation
                and info.get("next_rid", next_rid + 1) <= next_rid
            ):
                raise SnapshotError(f"{path} does not match the workspace's state")
            index, rows, info = read_snapshot(path, self.files.options.index_policy)
        except FileNotFoundError:
            return False
        except (SnapshotError, OSError) as exc:
            log.warning("workspace %s: ignoring the index snapshot: %s",
                        self.files.workspace_id, exc)
            return False
        with self._index_lock.write():
            self._index, self._rows = index, rows
            self._loaded_generation = self._saved_generation = int(info["generation"])
            self._index_stale = self._index_behind = self._index_clean = False
        self.files.events["loaded"] += 1
        log.info(
            "workspace %s: search index (%s, %d rows, generation %d) loaded in %.2fs",
            self.files.workspace_id, index.kind, len(rows), info["generation"],
            time.perf_counter() - started,
        )
        return True

    def _catch_up(self, generation: int) -> bool:
        """Make the index hold exactly LanceDB's rows, by rid: a rid always stands for
        the same row, so rows are only ever missing or extra, never changed. False if
        LanceDB's rows did not add up (the caller rebuilds)."""
        started = time.perf_counter()
        index = self._index
        assert index is not None
        stored = np.sort(
            np.concatenate(
                [b.column("rid").to_numpy() for b in self.table.scan(["rid"])]
                or [np.empty(0, np.int64)]
            )
        )
        have = self._rows.rids()
        gone = np.setdiff1d(have, stored, assume_unique=True)
        new = np.setdiff1d(stored, have, assume_unique=True)
        added = Scanned(self.files.dim)
        vectors = []
        if len(new):
            # New rows have the highest rids (the counter only grows): scan from there.
            for b in self.table.scan(COLUMNS, where=f"rid >= {int(new[0])}"):
                vectors.append(added.add(b, keep=np.isin(b.column("rid").to_numpy(), new)))
        cols = added.columns()
        if len(stored) != len(np.unique(stored)) or not np.array_equal(
            np.sort(cols["rid"]), new
        ):
            log.warning("workspace %s: cannot catch the index up; rebuilding it",
                        self.files.workspace_id)
            return False
        with self._index_lock.write():
            try:
                index.remove(gone)
                self._rows.remove_rids(gone)
                if len(new):
                    index.add(np.concatenate(vectors), cols["rid"])
                    self._rows.append(**RowTable.from_columns(**cols).columns())  # rid order
            except BaseException:
                self._index_stale = True
                raise
            self._loaded_generation = generation
            self._index_behind = False
        self.files.events["caught_up"] += 1
        log.info(
            "workspace %s: search index caught up (-%d +%d rows) in %.2fs",
            self.files.workspace_id, len(gone), len(new), time.perf_counter() - started,
        )
        return True

    def _build_from_table(self, generation: int) -> None:
        """Build the index and its rows from every row in LanceDB."""
        started = time.perf_counter()
        policy = self.files.options.index_policy
        # Read into an exact index first: its storage is where an IVF build samples and
        # adds from, so LanceDB is read once, whatever the kind.
        exact = VectorIndex.exact(self.files.dim, policy)
        scanned = Scanned(self.files.dim)
        for b in self.table.scan(COLUMNS):
            vectors = scanned.add(b)
            exact.add(vectors, b.column("rid").to_numpy())
        table = RowTable.from_columns(**scanned.columns())
        index = exact
        if policy.wants_rebuild(exact, len(table)):
            with self._build_threads():
                index = exact.rebuilt(len(table))
            del exact
        with self._index_lock.write():
            self._index, self._rows = index, table
            self._loaded_generation = generation
            self._index_stale = self._index_behind = False
        self._next_save = 0.0  # that was expensive: keep it
        self.files.events["built"] += 1
        log.info(
            "workspace %s: search index (%s) built from %d rows in %.2fs",
            self.files.workspace_id, index.kind, len(table), time.perf_counter() - started,
        )

    def _maybe_rebuild(self) -> None:
        """Caller holds the write lock. Switch index kind or retrain IVF cells when the
        workspace has outgrown (or shrunk below) what the index was built for."""
        index = self._index
        if index is None or self._index_stale:
            return
        rows = len(self._rows)
        if not self.files.options.index_policy.wants_rebuild(index, rows):
            return
        started = time.perf_counter()
        with self._build_threads():
            # From the index's own storage: no LanceDB read, and the same rows.
            fresh = index.rebuilt(rows)
        with self._index_lock.write():
            self._index = fresh
        self._next_save = 0.0
        self.files.events["rebuilt"] += 1
        log.info(
            "workspace %s: search index rebuilt %s -> %s for %d rows in %.2fs",
            self.files.workspace_id, index.kind, fresh.kind, rows, time.perf_counter() - started,
        )

    def _save_due(self) -> bool:
        return (
            self._index is not None
            and self._loaded_generation != self._saved_generation
            and time.monotonic() >= self._next_save
        )

    def _drop_snapshot(self) -> None:
        """Remove the snapshot: it holds the vectors and metadata of rows an apply just
        deleted, and the next save is not due yet. Caller holds the write lock and the
        flock. The next due save (an apply past `index_save_interval`) or the close
        writes it again; a process that opens the workspace before that builds its index
        from LanceDB instead of loading it."""
        with contextlib.suppress(FileNotFoundError):
            (self.files.path / SNAPSHOT).unlink()
        self._saved_generation = -1

    def _save_index(self) -> None:
        """Caller holds the write lock and the flock. Snapshot the index if it is clean and
        current. An optimisation: a failure is logged, never raised."""
        if not (self._index_clean and self._current()):
            return
        assert self._index is not None
        started = time.perf_counter()
        try:
            next_rid = self.files.next_rid()
            _remove_stale_temps(self.files.path, SNAPSHOT)
            size = write_snapshot(
                self.files.path / SNAPSHOT,
                self._index,
                self._rows,
                {"generation": self._loaded_generation, "next_rid": int(next_rid),
                 "rows": len(self._rows)},
            )
        except Exception:
            log.warning(
                "workspace %s: could not save the search index", self.files.workspace_id,
                exc_info=True,
            )
            self._next_save = time.monotonic() + self.files.options.index_save_interval
            return
        took = time.perf_counter() - started
        self._saved_generation = self._loaded_generation
        self._next_save = time.monotonic() + max(self.files.options.index_save_interval, 10 * took)
        self.files.events["saved"] += 1
        log.info(
            "workspace %s: search index saved (%d rows, %.0f MB) in %.2fs",
            self.files.workspace_id, len(self._rows), size / 1e6, took,
        )

    # -- faiss threads ------------------------------------------------------------------

    def _set_faiss_threads(self) -> None:
        # OpenMP's thread count is per calling thread, and server requests run on worker
        # threads, so it is set where faiss is called, not once at start-up.
        if self.files.options.faiss_threads is not None:
            faiss.omp_set_num_threads(self.files.options.faiss_threads)

    @contextlib.contextmanager
    def _build_threads(self) -> Iterator[None]:
        faiss.omp_set_num_threads(self.files.options.build_threads or os.cpu_count() or 1)
        try:
            yield
        finally:
            self._set_faiss_threads()
