"""One workspace of the embedded store: its Merkle tree, chunk rows and search index,
read and written (sync.store, "Crash safety"). Its files and locks are
sync.store.workspace_files; its search index sync.store.search_index; the tree's SQL
sync.store.sqlite_tree; the rows' layout sync.store.rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sync.records import (
    DEFAULT_REF,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.store.backend import WorkspaceRecord
from sync.store.checks import (
    ApplyChecks,
    Children,
    _key,
    _Update,
    _vector,
    decide_dir_values,
    dir_value_checks,
    ref_id,
)
from sync.store.lance_table import (
    CLEANUP_AFTER,
    LANCE_ADVICE,
    LANCE_IN_BATCH,
    TABLE,
    arrow_rows,
    lance_reads,
)
from sync.store.options import StoreOptions
from sync.store.pool import (
    adopt,
    expire_orphans,
    fid_blobs,
    present,
    ref_bounds,
    ref_count,
    release,
    scoped,
    touch_ref,
    unscoped,
)
from sync.store.pool_ops import PoolOps
from sync.store.rows import (
    blob_rows_of,
    bounded_answer,
    checkpoint_superseded,
    fid_of,
    file_keys,
    group_rows,
    purge_superseded,
    replace_blob_rows,
)
from sync.store.search_index import SearchIndexLifecycle
from sync.store.sqlite_tree import (
    SQL_BATCH,
    Plan,
    batched,
    commit_values,
    mark_pending,
    sealed_reads,
    transaction,
)
from sync.store.vector_index import (
    RowTable,
    chunk_id_array,
    pack,
)
from sync.store.workspace_checks import WorkspaceChecks
from sync.wire import BadRequest, SealedWorkspaceError, StoreCorrupt

log = logging.getLogger(__name__)


class WorkspaceStore(WorkspaceChecks, PoolOps, ApplyChecks, SearchIndexLifecycle):
    """The Merkle tree, chunk rows and search index of one workspace.

    Thread-safe: applies (and directory updates) are serialised by a lock, across
    processes by an flock; reads of the tree (and of a sealed workspace's rows) and
    searches run concurrently with them and with each other. Implements the operations
    of `sync.client.StoreClient`. Tuned by its store's `StoreOptions`.
    """

    def __init__(self, path: Path, record: WorkspaceRecord, options: StoreOptions) -> None:
        super().__init__(path, record, options)
        self._checkpoint_due = False  # the log may hold deleted rows: cut it (sealed)
        self._applies_since_compact = 0
        if self.sealed:
            try:
                self._move_sealed_rows()
            except BaseException:
                self._rconn.close()
                self._wconn.close()
                raise

    # -- reads --------------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self._check_open()
        with self._rlock:
            (nodes,) = self._rconn.execute("SELECT COUNT(*) FROM nodes").fetchone()
        index: dict[str, Any] | None = None
        chunks: int | None
        if self.sealed:
            chunks = self._sealed_row_count()
        elif self._current():
            with self._index_lock.read():
                chunks = len(self._rows)
                if self._index is not None:
                    index = self._index.describe()
        else:
            # Counting must not build the index (`codeveil status` never searches). The
            # snapshot's trailer counts its rows; if it is of the current generation that
            # is the count, and LanceDB (seconds to import) is not needed.
            chunks = self._snapshot_rows()
            if chunks is None:
                chunks = self._counted_rows()
            if chunks is None:
                chunks = self._count_rows()
        assert chunks is not None
        r = self._record
        extra: dict[str, Any] = {"created_at": r.created_at, "limits": self.limits.as_dict()}
        if not self.sealed:
            extra["distance"] = "l2"
        else:
            extra["pool"] = True  # one tree per ref over a pool of blobs (sync.store.pool)
        if index is not None:
            extra["index"] = index
        return WorkspaceInfo(
            workspace_id=r.workspace_id,
            dim=r.dim,
            model_id=r.model_id,
            key_check=r.key_check,
            chunks=chunks,
            nodes=nodes,
            extra=extra,
            mode=r.mode,
        )

    def file_rows(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF) -> FileRows:
        """(chunk id, meta) of every row of each file of `keys`, in the order they were
        sent. A key that is not a committed leaf (unknown, pending or a directory) maps to
        []. The answer is bounded by `limits.max_row_bytes`: the keys after the bound are
        left out of it, and the caller asks for them again.

        Read so that no apply is halfway: a leaf's value and its rows are the ones one
        apply committed together. A sealed workspace's are read in one read transaction
        of tree.sqlite, concurrently with writers: an apply sets the leaves it touches
        pending before it moves their rows and their values only after, so any committed
        state pairs a value with its own rows. A server-search workspace's are read under
        the write locks."""
        self._check_open()
        ref = ref_id(ref, self.sealed)
        wanted = file_keys(keys, self.limits)
        if not wanted:
            return {}
        if self.sealed:
            return bounded_answer(wanted, self._sealed_file_rows(wanted, ref),
                                  self.limits.max_row_bytes)
        with self._write_lock, self._flock():
            committed = [unscoped(k) for k, (value, is_dir) in self._leaf_values(
                [scoped(ref, k) for k in wanted]).items() if value is not None and not is_dir]
            fid_keys: dict[int, list[bytes]] = {}
            for k in committed:
                fid_keys.setdefault(fid_of(k), []).append(k)
            found = {}
            if fid_keys:
                with lance_reads(self.path / f"{TABLE}.lance"):
                    self._table.checkout_latest()
                batches = (
                    b
                    for part in batched(sorted(fid_keys), LANCE_IN_BATCH)
                    for b in self._scan(["rid", "fid", "chunk_id", "meta"],
                                        where=f"fid IN ({','.join(map(str, part))})")
                )
                found = group_rows(batches, fid_keys)
        return bounded_answer(wanted, found, self.limits.max_row_bytes)

    def _sealed_file_rows(self, wanted: list[bytes], ref: bytes
                          ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
        """The rows of the blobs the committed leaves of `wanted` (in `ref`'s tree)
        name, read in one snapshot."""
        with self._rlock, sealed_reads(self._tree_path):
            self._rconn.execute("BEGIN")
            try:
                values = self._leaf_values([scoped(ref, k) for k in wanted], self._rconn)
                blobs = {unscoped(k): (fid_of(unscoped(k)), value)
                         for k, (value, is_dir) in values.items()
                         if value is not None and not is_dir}
                return blob_rows_of(self._rconn, blobs) if blobs else {}
            finally:
                self._rconn.execute("COMMIT")

    def _leaf_values(self, keys: list[bytes], conn: sqlite3.Connection | None = None
                     ) -> dict[bytes, tuple[bytes | None, bool]]:
        """key -> (value, is_dir) of those of `keys` in the tree. Caller holds
        _write_lock (this reads on the writer's connection), or passes `conn` and holds
        what guards it."""
        out: dict[bytes, tuple[bytes | None, bool]] = {}
        for part in batched(keys, SQL_BATCH):
            marks = ",".join("?" * len(part))
            for k, v, is_dir in (conn or self._wconn).execute(
                f"SELECT key, value, is_dir FROM nodes WHERE key IN ({marks})", part
            ):
                out[bytes(k)] = (None if v is None else bytes(v), bool(is_dir))
        return out

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        self._check_open()
        ref = ref_id(ref, self.sealed)
        with self._rlock:
            rows = self._rconn.execute(
                "SELECT key, value, is_dir FROM nodes WHERE parent IS NULL"
                " AND key >= ? AND key < ? ORDER BY key", ref_bounds(ref)
            ).fetchall()
        if len(rows) > 1:  # apply() refuses a second root; this would be a bug
            log.error("workspace %s has %d root nodes", self.workspace_id, len(rows))
        return NodeInfo(unscoped(rows[0][0]), rows[0][1], bool(rows[0][2])) if rows else None

    def children(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF
                 ) -> dict[bytes, list[NodeInfo]]:
        self._check_open()
        ref = ref_id(ref, self.sealed)
        if not isinstance(keys, Sequence) or isinstance(keys, bytes | str):
            raise BadRequest("keys must be a list of keys")
        if len(keys) > self.limits.max_keys:
            raise BadRequest(
                f"too many keys: {len(keys)} > {self.limits.max_keys} per children call"
            )
        wanted = [_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
        out: dict[bytes, list[NodeInfo]] = {k: [] for k in wanted}
        unique = list(out)
        with self._rlock:
            # One read transaction: every batch sees the same snapshot.
            self._rconn.execute("BEGIN")
            try:
                for part in batched([scoped(ref, k) for k in unique], SQL_BATCH):
                    marks = ",".join("?" * len(part))
                    for parent, key, value, is_dir in self._rconn.execute(
                        "SELECT parent, key, value, is_dir FROM nodes"
                        f" WHERE parent IN ({marks}) ORDER BY parent, key",
                        part,
                    ):
                        out[unscoped(parent)].append(
                            NodeInfo(unscoped(key), value, bool(is_dir)))
            finally:
                self._rconn.execute("COMMIT")
        return out

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean distance (not squared)."""
        self._check_open()
        if self.sealed:
            raise SealedWorkspaceError(
                f"workspace {self.workspace_id} is sealed: search runs on the client"
            )
        query = _vector(vector, self.dim, "vector")[None, :]
        try:
            if isinstance(k, bool):
                raise TypeError
            k = operator.index(k)
        except TypeError:
            raise BadRequest(f"k must be an integer, got {type(k).__name__}") from None
        if not 1 <= k <= self.limits.max_k:
            raise BadRequest(f"k must be between 1 and {self.limits.max_k}, got {k}")
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

    # -- writes -------------------------------------------------------------------------

    def apply(self, updates: Sequence[FileUpdate], deletes: Sequence[bytes],
              ref: bytes = DEFAULT_REF) -> list[bytes]:
        """Replace the chunks and leaves of `updates`; remove the subtrees of `deletes`.

        Deletes take effect before updates, so one call can turn a file into a directory
        of the same key (delete it, upload what is now below it) or the other way round.
        A key that changes kind without being deleted is handled the same way.

        Write order, the crash-safety invariant:

        1. One SQLite transaction: create missing ancestors (`ancestors[0]` is the root),
           upsert each leaf with value NULL, set NULL the value of every node in a
           deleted subtree and of every ancestor of a touched leaf or deleted node;
           reserve rids for the new rows.
        2. Delete the rows of the updated files and of every leaf in a deleted subtree
           (`fid IN (...)`), then add the new rows. Sealed: one SQLite transaction on
           the rows table. Server-search: LanceDB, the new rows in one `add`; then
           faiss is brought into step.
        3. One SQLite transaction: set the leaf values; delete the nodes of deleted
           subtrees.
        4. If rows were deleted, their bytes leave the data dir (sync.store.rows): the
           write-ahead log is checkpointed and cut (sealed), or the table compacted and
           its older versions removed (server-search).

        A crash anywhere leaves NULL values on every path it touched, which never match
        a client value, so the next sync re-sends them; no value ever claims chunks the
        store lacks. Re-applying the same batch is harmless (rows are replaced per file).

        Sealed, the rows are a pool of blobs shared by every ref (sync.store.pool): step
        2 replaces the rows of each uploaded blob, a link uploads none, and step 3 sets
        a link's leaf only if the pool holds its blob (otherwise the leaf stays pending
        and its key is returned: the client sends the file). Blobs the apply left
        without a ref are deleted in step 3 while the workspace has one ref (as before
        refs), marked orphaned otherwise (the GC deletes them after its grace period).
        """
        self._check_open()
        ref = ref_id(ref, self.sealed)
        ups, dels = self._validate_apply(updates, deletes)
        if not ups and not dels:
            return []
        ups = [dataclasses.replace(u, file_key=scoped(ref, u.file_key),
                                   ancestors=tuple(scoped(ref, a) for a in u.ancestors))
               for u in ups]
        dels = [scoped(ref, d) for d in dels]
        with self._write_lock, self._flock():
            self._prepare_write()
            plan = self._step1_mark_pending(ref, ups, dels)
            self._reached("pending")
            deleted = self._step2_replace_rows(plan, ups)
            self._reached("rows")
            missing, released = self._step3_commit(ref, plan, ups)
            self._reached("committed")
            if self.sealed:
                if deleted or released or self._checkpoint_due:
                    self._checkpoint()
                return missing
            if deleted:
                self._purge(added=sum(len(u.chunk_ids) for u in ups))
            else:
                self._maybe_compact()
            self._record_row_count()
            self._maybe_rebuild()
            if self._save_due():
                self._save_index()
            elif deleted:
                self._drop_snapshot()  # it holds the rows just deleted
        return []

    def set_dir_values(self, values: Sequence[DirValue | tuple[bytes, bytes, bytes]],
                       ref: bytes = DEFAULT_REF) -> None:
        """Set the values of existing directories, each only over the children it was
        computed from (compare-and-set); other keys are ignored.

        Each item is (key, value, children digest). A directory keeps its value unless
        its children, as stored now, digest to the one given (`children_digest`): a
        pending (NULL) child never does, and neither does a child another writer changed
        after this value was computed (two teammates syncing at once). The last writer
        therefore cannot make the tree claim its own files over another's rows. A
        directory is checked only once the values this call gives its children are set
        or refused, against the children as they are then, so the order of the values
        does not matter.
        """
        self._check_open()
        ref = ref_id(ref, self.sealed)
        pending = dir_value_checks(values, self.limits)
        with self._write_lock, self._flock(), transaction(self._wconn) as conn:
            if self.sealed:
                touch_ref(conn, ref)
            pending = {k: v for k, v in pending.items() if (row := conn.execute(
                "SELECT is_dir FROM nodes WHERE key = ?", (scoped(ref, k),)).fetchone())
                and row[0]}

            # Keys as the client sees them (its digests are over them), stored scoped.
            def children_of(keys: list[bytes]) -> Children:
                return {k: [(unscoped(c), None if v is None else bytes(v)) for c, v in
                            conn.execute("SELECT key, value FROM nodes WHERE parent = ?",
                                         (scoped(ref, k),))] for k in keys}

            def write(items: list[tuple[bytes, bytes]]) -> None:
                conn.executemany("UPDATE nodes SET value = ? WHERE key = ?",
                                 [(v, scoped(ref, k)) for k, v in items])

            refused = decide_dir_values(pending, children_of, write)  # sync.store.checks
        if refused:
            log.info(
                "workspace %s: %d directory values refused: computed over other children"
                " (another writer, or a pending node below)",
                self.workspace_id,
                refused,
            )

    # -- checks (`codeveil doctor`, and `codeveil index` before it reports success) -----

    def verify(self, *, deep: bool = True) -> None:
        """Raise StoreCorrupt if the chunk rows plainly cannot be read. Cheap. Sealed: the
        rows table of tree.sqlite is read (counted, through its index on fid, if `deep`);
        a damaged file is named by its connection. Server-search: with the table open
        (this process wrote or read it) and `deep`, its rows are counted and compared
        with the index's; otherwise only its files are looked at, so an index with
        nothing to send does not pay LanceDB's import (nor a server's root request the
        write lock)."""
        self._check_open()
        if self.sealed:
            if deep:
                self._sealed_row_count()
            else:
                with self._rlock, sealed_reads(self._tree_path):
                    self._rconn.execute("SELECT rid FROM rows LIMIT 1").fetchall()
            return
        table_dir = self.path / f"{TABLE}.lance"
        with self._write_lock if deep else contextlib.nullcontext():
            if (deep and self._table_handle is not None and self._current()
                    and self._index_clean):
                with lance_reads(table_dir):
                    self._table.checkout_latest()
                    stored = self._table.count_rows()
                if stored != len(self._rows):
                    raise StoreCorrupt(
                        f"the chunk table {table_dir} holds {stored} rows where the search"
                        f" index holds {len(self._rows)}; {LANCE_ADVICE}"
                    )
                return
        manifests = list((table_dir / "_versions").glob("*.manifest"))
        if not manifests or not any(m.stat().st_size for m in manifests):
            raise StoreCorrupt(f"the chunk table {table_dir} has no version manifest;"
                               f" {LANCE_ADVICE}")
        rows = self._snapshot_rows()
        if rows is None:
            rows = self._counted_rows()
        data = list((table_dir / "data").glob("*.lance"))
        if (rows and not data) or any(d.stat().st_size == 0 for d in data):
            raise StoreCorrupt(f"the chunk table {table_dir} lost its data files;"
                               f" {LANCE_ADVICE}")

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot, then close."""
        if self._closed:
            return
        with self._write_lock:
            if self._index is not None and self._loaded_generation != self._saved_generation:
                with self._flock():
                    self._save_index()
            self._closed = True
            with self._index_lock.write():
                self._index = None
                self._rows = RowTable()
            with self._rlock:
                self._rconn.close()
            self._wconn.close()

    # -- apply, step by step ------------------------------------------------------------

    def _reached(self, point: str) -> None:
        """Tell the crash hook (StoreOptions.crash_hook) that the apply passed `point`."""
        if self.options.crash_hook is not None:
            self.options.crash_hook(point)

    def _step1_mark_pending(self, ref: bytes, updates: list[_Update], deletes: list[bytes]
                            ) -> Plan:
        with transaction(self._wconn) as conn:
            plan, generation = mark_pending(conn, ref, updates, deletes)
        self._loaded_generation = generation  # our own change: the index follows it
        return plan

    def _step2_replace_rows(self, plan: Plan, updates: list[_Update]) -> int:
        """Returns how many rows were deleted (their bytes are purged after step 3)."""
        if self.sealed:
            return self._step2_replace_sealed_rows(plan, updates)
        # Only files that have rows: a new file costs LanceDB nothing. (_prepare_write
        # made the index equal LanceDB's rows, so the row table knows every file's rows.)
        old = sorted(f for f in plan.fids if self._rows.has_file(f))
        n = sum(len(u.chunk_ids) for u in updates)
        rids = np.arange(plan.first_rid, plan.first_rid + n, dtype=np.int64)
        fids = np.repeat(
            np.array([fid_of(unscoped(u.file_key)) for u in updates], dtype=np.int64),
            [len(u.chunk_ids) for u in updates],
        )
        chunk_ids = [c for u in updates for c in u.chunk_ids]
        metas = [m for u in updates for m in u.metas]
        vectors = (
            np.concatenate([u.vectors for u in updates])
            if n
            else np.empty((0, self.dim), np.float32)
        )
        try:
            for part in batched(old, LANCE_IN_BATCH):
                self._table.delete(f"fid IN ({','.join(map(str, part))})")
            if n:
                self._table.add(arrow_rows(self.dim, rids, chunk_ids, fids, vectors, metas))
        except BaseException:
            # LanceDB may hold part of the change; the index still agrees with its own
            # rows, so the next user catches it up to whatever LanceDB holds.
            self._index_behind = True
            raise
        try:
            with self._index_lock.write():
                index = self._index
                assert index is not None  # _prepare_write built it
                removed = self._rows.remove_files(old)
                index.remove(removed)
                index.add(vectors, rids)
                self._rows.append(rids, fids, chunk_id_array(chunk_ids), *pack(metas))
        except BaseException:
            self._index_stale = True  # the index and its rows may disagree now
            raise
        return len(removed)

    def _step2_replace_sealed_rows(self, plan: Plan, updates: list[_Update]) -> int:
        # One transaction: a crash keeps all of a blob's old rows or none of them. Only
        # uploaded blobs are written; the blobs the touched leaves named before stay
        # until step 3 (another ref may name them).
        rid = plan.first_rid
        blobs: dict[tuple[int, bytes], list[tuple[int, int, bytes, bytes]]] = {}
        for u in updates:
            if u.link:
                continue
            fid = fid_of(unscoped(u.file_key))
            rows = blobs.setdefault((fid, u.value), [])
            rows.clear()  # one file twice in a batch is refused; a blob twice: the last
            for cid, meta in zip(u.chunk_ids, u.metas, strict=True):
                rows.append((rid, fid, cid, meta))
                rid += 1
        named = {(fid_of(unscoped(u.file_key)), u.value) for u in updates}
        with sealed_reads(self._tree_path), transaction(self._wconn) as conn:
            deleted = replace_blob_rows(conn, blobs)
            # The blobs the touched leaves named (step 1 set them pending), and every
            # blob of a touched file (a crash between an earlier apply's steps may have
            # left one no leaf names): those no ref names now go, as the rows of a file
            # went before refs, or wait out the grace period with several refs.
            touched = plan.old_blobs | fid_blobs(conn, plan.fids)
            return deleted + release(conn, touched - named, now=ref_count(conn) <= 1)

    def _step3_commit(self, ref: bytes, plan: Plan, updates: list[_Update]
                      ) -> tuple[list[bytes], int]:
        """Returns the links left pending (their blob is not in the pool) and how many
        rows of blobs left without a ref were deleted."""
        missing: list[bytes] = []
        released = 0
        with sealed_reads(self._tree_path), transaction(self._wconn) as conn:
            if self.sealed:
                named = {(fid_of(unscoped(u.file_key)), u.value): u for u in updates}
                held = present(conn, [b for b, u in named.items() if u.link])
                lacking = {id(u) for b, u in named.items() if u.link and b not in held}
                missing = [unscoped(u.file_key) for u in updates if id(u) in lacking]
                updates = [u for u in updates if id(u) not in lacking]
            generation = commit_values(conn, plan, updates)
            if self.sealed:
                now = {(fid_of(unscoped(u.file_key)), u.value) for u in updates}
                adopt(conn, now)
                released = expire_orphans(conn, self.options.blob_grace_s)
                touch_ref(conn, ref)
        self._loaded_generation = generation
        return missing, released

    def _maybe_compact(self) -> None:
        # Each apply adds a LanceDB fragment and version; merging them now and then keeps
        # reads (index builds) fast and the folder small. Rows keep their rids, so the
        # faiss index is unaffected.
        self._applies_since_compact += 1
        if self._applies_since_compact < self.options.compact_every:
            return
        self._applies_since_compact = 0
        started = time.perf_counter()
        try:
            self._table.optimize(cleanup_older_than=CLEANUP_AFTER)
        except Exception:  # compaction is an optimisation: never fail an apply for it
            log.warning("workspace %s: compaction failed", self.workspace_id, exc_info=True)
            return
        log.debug("workspace %s: compacted in %.2fs", self.workspace_id,
                  time.perf_counter() - started)

    def _checkpoint(self) -> None:
        """After a sealed apply that deleted rows: the write-ahead log, which may hold
        their old page images, is copied into tree.sqlite and cut (sync.store.rows). If a
        reader keeps it from finishing, the next apply tries again."""
        started = time.perf_counter()
        try:
            done = checkpoint_superseded(self._wconn)
        except sqlite3.OperationalError:
            log.warning("workspace %s: checkpointing %s failed", self.workspace_id,
                        self._tree_path, exc_info=True)
            done = False
        self._checkpoint_due = not done
        if done:
            self.index_events["purged"] += 1
        log.debug("workspace %s: log checkpointed (%s) in %.3fs", self.workspace_id,
                  "done" if done else "readers left", time.perf_counter() - started)

    def _purge(self, added: int) -> None:
        """After an apply that deleted rows: their bytes leave the data dir now
        (sync.store.rows). It compacts the table too, so the count towards the next
        compaction starts again. A failure is logged: the rows are gone from the table
        already, and the next apply that deletes rows purges them too."""
        self._applies_since_compact = 0
        try:
            took = purge_superseded(self._table, added)
        except Exception:
            log.warning("workspace %s: removing superseded rows failed", self.workspace_id,
                        exc_info=True)
            return
        self.index_events["purged"] += 1
        log.debug("workspace %s: superseded rows removed in %.3fs", self.workspace_id, took)
