"""One workspace of the embedded store: its Merkle tree, chunk rows and search index,
read and written (sync.store, "Crash safety").

`WorkspaceStore` is composed of members, each owning its state and its job:

- `files` (sync.store.embedded.workspace_files.WorkspaceFiles): the record and options,
  tree.sqlite's connections, the thread locks and the flock, the write-ahead log's cut;
  every other member is built on it;
- `search_index` (sync.store.embedded.search_index.SearchIndex, server-search only): the faiss
  index, its rows, its snapshot, and the LanceDB rows it is kept equal to (its `table`,
  sync.store.embedded.lance_rows.LanceRows);
- `pool` (sync.store.embedded.pool_ops.PoolOps): the refs and blob pool requests.

The request checks are functions (sync.store.core.checks, sync.store.embedded.workspace_checks), and
so is the SQL of the tree (sync.store.embedded.sqlite_tree), of the pool (sync.store.embedded.pool,
sync.store.embedded.pool_ops) and of the rows (sync.store.core.rows). This module holds the
operations of the backend interface and the write order of `apply`, top to bottom.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sync.records import (
    DEFAULT_REF,
    BlobRows,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.store.core.backend import WorkspaceRecord
from sync.store.core.checks import (
    Children,
    _key,
    _vector,
    decide_dir_values,
    dir_value_checks,
    ref_id,
    validate_apply,
)
from sync.store.core.rows import blob_rows_of, bounded_answer, fid_of, file_keys
from sync.store.embedded.lance_rows import LanceRows
from sync.store.embedded.options import StoreOptions
from sync.store.embedded.pool import ref_bounds, scoped, touch_ref, unscoped
from sync.store.embedded.pool_ops import PoolOps, held_links, settle_blobs, write_blobs
from sync.store.embedded.search_index import SearchIndex
from sync.store.embedded.sqlite_tree import (
    SQL_BATCH,
    batched,
    commit_values,
    mark_pending,
    sealed_reads,
    transaction,
)
from sync.store.embedded.workspace_checks import rows_by_file, workspace_problems
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import BadRequest, SealedWorkspaceError

log = logging.getLogger(__name__)


class WorkspaceStore:
    """The Merkle tree, chunk rows and search index of one workspace.

    Thread-safe: applies (and directory updates) are serialised by a lock, across
    processes by an flock; reads of the tree (and of a sealed workspace's rows) and
    searches run concurrently with them and with each other. Implements the operations
    of `sync.client.StoreClient`. Tuned by its store's `StoreOptions`.
    """

    initialize = staticmethod(WorkspaceFiles.initialize)

    def __init__(self, path: Path, record: WorkspaceRecord, options: StoreOptions) -> None:
        self.files = WorkspaceFiles(path, record, options)
        # A sealed workspace has no search index: its client searches.
        self.search_index = None if self.files.sealed else SearchIndex(self.files)
        self.pool = PoolOps(self.files)
        self.path = path
        self.options = options
        self.workspace_id = record.workspace_id
        self.dim = record.dim
        self.mode = record.mode
        self.sealed = self.files.sealed
        self.limits = options.limits
        self.index_events = self.files.events
        if self.sealed:
            try:
                self.files.move_sealed_rows()
            except BaseException:
                self.files.rconn.close()
                self.files.wconn.close()
                raise

    # -- reads --------------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self.files.check_open()
        with self.files.rlock:
            (nodes,) = self.files.rconn.execute("SELECT COUNT(*) FROM nodes").fetchone()
        index: dict[str, Any] | None = None
        if self.search_index is None:
            chunks = self.files.sealed_row_count()
        else:
            chunks, index = self.search_index.count()
        r = self.files.record
        extra: dict[str, Any] = {"created_at": r.created_at, "limits": self.limits.as_dict()}
        if not self.sealed:
            extra["distance"] = "l2"
        else:
            extra["pool"] = True  # one tree per ref over a pool of blobs (sync.store.embedded.pool)
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
        files = self.files
        files.check_open()
        ref = ref_id(ref, self.sealed)
        wanted = file_keys(keys, self.limits)
        if not wanted:
            return {}
        if self.search_index is None:
            return bounded_answer(wanted, self._sealed_file_rows(wanted, ref),
                                  self.limits.max_row_bytes)
        with files.write_lock, files.flock():
            committed = [unscoped(k) for k, (value, is_dir) in files.leaf_values(
                [scoped(ref, k) for k in wanted]).items() if value is not None and not is_dir]
            fid_keys: dict[int, list[bytes]] = {}
            for k in committed:
                fid_keys.setdefault(fid_of(k), []).append(k)
            found = self.search_index.table.file_rows(fid_keys)
        return bounded_answer(wanted, found, self.limits.max_row_bytes)

    def _sealed_file_rows(self, wanted: list[bytes], ref: bytes
                          ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
        """The rows of the blobs the committed leaves of `wanted` (in `ref`'s tree)
        name, read in one snapshot."""
        files = self.files
        with files.rlock, sealed_reads(files.tree_path):
            files.rconn.execute("BEGIN")
            try:
                values = files.leaf_values([scoped(ref, k) for k in wanted], files.rconn)
                blobs = {unscoped(k): (fid_of(unscoped(k)), value)
                         for k, (value, is_dir) in values.items()
                         if value is not None and not is_dir}
                return blob_rows_of(files.rconn, blobs) if blobs else {}
            finally:
                files.rconn.execute("COMMIT")

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        self.files.check_open()
        ref = ref_id(ref, self.sealed)
        with self.files.rlock:
            rows = self.files.rconn.execute(
                "SELECT key, value, is_dir FROM nodes WHERE parent IS NULL"
                " AND key >= ? AND key < ? ORDER BY key", ref_bounds(ref)
            ).fetchall()
        if len(rows) > 1:  # apply() refuses a second root; this would be a bug
            log.error("workspace %s has %d root nodes", self.workspace_id, len(rows))
        return NodeInfo(unscoped(rows[0][0]), rows[0][1], bool(rows[0][2])) if rows else None

    def children(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF
                 ) -> dict[bytes, list[NodeInfo]]:
        self.files.check_open()
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
        with self.files.rlock:
            # One read transaction: every batch sees the same snapshot.
            self.files.rconn.execute("BEGIN")
            try:
                for part in batched([scoped(ref, k) for k in unique], SQL_BATCH):
                    marks = ",".join("?" * len(part))
                    for parent, key, value, is_dir in self.files.rconn.execute(
                        "SELECT parent, key, value, is_dir FROM nodes"
                        f" WHERE parent IN ({marks}) ORDER BY parent, key",
                        part,
                    ):
                        out[unscoped(parent)].append(
                            NodeInfo(unscoped(key), value, bool(is_dir)))
            finally:
                self.files.rconn.execute("COMMIT")
        return out

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean distance (not squared)."""
        self.files.check_open()
        if self.search_index is None:
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
        return self.search_index.search(query, k)

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
        4. If rows were deleted, their bytes leave the data dir (sync.store.core.rows): the
           write-ahead log is checkpointed and cut (sealed), or the table compacted and
           its older versions removed (server-search).

        A crash anywhere leaves NULL values on every path it touched, which never match
        a client value, so the next sync re-sends them; no value ever claims chunks the
        store lacks. Re-applying the same batch is harmless (rows are replaced per file).

        Sealed, the rows are a pool of blobs shared by every ref (sync.store.embedded.pool): step
        2 replaces the rows of each uploaded blob, a link uploads none, and step 3 sets
        a link's leaf only if the pool holds its blob (otherwise the leaf stays pending
        and its key is returned: the client sends the file). Blobs the apply left
        without a ref are deleted in step 3 while the workspace has one ref (as before
        refs), marked orphaned otherwise (the GC deletes them after its grace period).
        """
        files, index = self.files, self.search_index  # index None: sealed
        files.check_open()
        ref = ref_id(ref, self.sealed)
        ups, dels = validate_apply(files, updates, deletes)
        if not ups and not dels:
            return []
        ups = [dataclasses.replace(u, file_key=scoped(ref, u.file_key),
                                   ancestors=tuple(scoped(ref, a) for a in u.ancestors))
               for u in ups]
        dels = [scoped(ref, d) for d in dels]
        with files.write_lock, files.flock():
            if index is not None:
                index.prepare_write()  # the index equal to LanceDB's rows, as it stands

            # 1. Pending.
            with transaction(files.wconn) as conn:
                plan, generation = mark_pending(conn, ref, ups, dels)
            if index is not None:
                index.follow(generation)  # our own change: the index follows it
            self._reached("pending")

            # 2. Rows: how many went is what step 4 purges.
            if index is None:
                with sealed_reads(files.tree_path), transaction(files.wconn) as conn:
                    deleted = write_blobs(conn, plan, ups)
            else:
                deleted = index.replace_rows(plan, ups)
            self._reached("rows")

            # 3. Values: a link's only if the pool holds its blob.
            missing: list[bytes] = []
            released = 0  # rows of blobs left without a ref, deleted
            with sealed_reads(files.tree_path), transaction(files.wconn) as conn:
                if index is None:
                    missing, ups = held_links(conn, ups)
                generation = commit_values(conn, plan, ups)
                if index is None:
                    released = settle_blobs(conn, ref, ups, self.options.blob_grace_s)
            if index is not None:
                index.follow(generation)
            self._reached("committed")

            # 4. Deleted rows' bytes leave the data dir.
            if index is None:
                if deleted or released or files.checkpoint_due:
                    files.checkpoint()
                return missing
            if deleted:
                index.table.purge(added=sum(len(u.chunk_ids) for u in ups))
            else:
                index.table.maybe_compact()
            index.table.record_count()
            index.after_apply(deleted)  # retrain, snapshot or drop the snapshot
        return []

    def _reached(self, point: str) -> None:
        """Tell the crash hook (StoreOptions.crash_hook) that the apply passed `point`."""
        if self.options.crash_hook is not None:
            self.options.crash_hook(point)

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
        self.files.check_open()
        ref = ref_id(ref, self.sealed)
        pending = dir_value_checks(values, self.limits)
        with self.files.write_lock, self.files.flock(), transaction(self.files.wconn) as conn:
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

            refused = decide_dir_values(pending, children_of, write)  # sync.store.core.checks
        if refused:
            log.info(
                "workspace %s: %d directory values refused: computed over other children"
                " (another writer, or a pending node below)",
                self.workspace_id,
                refused,
            )

    # -- the pool (sync.store.embedded.pool_ops) -------------------------------------------------

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        return self.pool.blob_rows(items, rows=rows)

    def refs(self) -> list[RefInfo]:
        return self.pool.refs()

    def drop_ref(self, ref: bytes) -> None:
        self.pool.drop_ref(ref)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        return self.pool.collect_garbage(max_ref_age_days=max_ref_age_days,
                                         grace_s=grace_s)

    # -- checks (`codeveil doctor`, and `codeveil index` before it reports success) -----

    def verify(self, *, deep: bool = True) -> None:
        """Raise StoreCorrupt if the chunk rows plainly cannot be read. Cheap. Sealed: the
        rows table of tree.sqlite is read (counted, through its index on fid, if `deep`);
        a damaged file is named by its connection. Server-search: with the table open
        (this process wrote or read it) and `deep`, its rows are counted and compared
        with the index's; otherwise only its files are looked at, so an index with
        nothing to send does not pay LanceDB's import (nor a server's root request the
        write lock)."""
        files = self.files
        files.check_open()
        if self.search_index is not None:
            self.search_index.verify(deep=deep)
        elif deep:
            files.sealed_row_count()
        else:
            with files.rlock, sealed_reads(files.tree_path):
                files.rconn.execute("SELECT rid FROM rows LIMIT 1").fetchall()

    def check(self) -> list[str]:
        """Every problem found in this workspace's files, one line each (empty: none);
        sync.store.embedded.workspace_checks."""
        return workspace_problems(self.files, self._table())

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every chunk row, read in full."""
        return rows_by_file(self.files, self._table())

    def _table(self) -> LanceRows | None:
        """The LanceDB table of a server-search workspace's rows (a sealed one's are in
        tree.sqlite)."""
        return None if self.search_index is None else self.search_index.table

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot, then close."""
        if self.files.closed:
            return
        with self.files.write_lock:
            if self.search_index is not None:
                self.search_index.close()
            self.files.close()
