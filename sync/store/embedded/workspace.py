"""One workspace of the embedded store: its Merkle tree, chunk rows and search index,
read and written (sync.store, "Crash safety").

`WorkspaceStore` is composed of members, each owning its state and its job:

- `files` (sync.store.embedded.workspace_files.WorkspaceFiles): the record and options,
  tree.sqlite's connections, the thread locks and the flock, the write-ahead log's cut;
  every other member is built on it;
- `rows` (sync.store.embedded.mode_rows.EmbeddedRows): the rows as the workspace's mode
  keeps them, chosen when it opens: a sealed workspace's in tree.sqlite, a pool of blobs
  (sync.store.embedded.sealed_rows.SealedRows); a server-search workspace's in LanceDB
  under its search index (sync.store.embedded.search_rows.SearchRows, holding the
  `SearchIndex`, which holds its `LanceRows`);
- `pool` (sync.store.embedded.pool_ops.PoolOps): the refs requests and the GC.

The request checks are functions (sync.store.core.checks, sync.store.embedded.workspace_checks), and
so is the SQL of the tree (sync.store.embedded.sqlite_tree), of the pool (sync.store.embedded.pool)
and of the rows (sync.store.core.rows). This module holds the operations of the backend
interface and the write order of `apply`, top to bottom; it never asks which mode the
workspace is of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sync.records import (
    DEFAULT_REF,
    MODE_SEALED,
    MODE_SERVER_SEARCH,
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
    children_keys,
    decide_dir_values,
    dir_value_checks,
    ref_id,
    validate_apply,
)
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.embedded.mode_rows import RowsKind
from sync.store.embedded.options import StoreOptions
from sync.store.embedded.pool import ref_bounds, scoped, unscoped
from sync.store.embedded.pool_ops import PoolOps
from sync.store.embedded.sealed_rows import SealedRows
from sync.store.embedded.search_rows import SearchRows
from sync.store.embedded.sqlite_tree import (
    SQL_BATCH,
    batched,
    commit_values,
    mark_pending,
    transaction,
)
from sync.store.embedded.workspace_checks import workspace_problems
from sync.store.embedded.workspace_files import WorkspaceFiles

#: The rows of each mode, chosen when a workspace opens.
MODE_ROWS: dict[str, RowsKind] = {
    MODE_SEALED: SealedRows,
    MODE_SERVER_SEARCH: SearchRows,
}


class WorkspaceStore:
    """The Merkle tree, chunk rows and search index of one workspace.

    Thread-safe: applies (and directory updates) are serialised by a lock, across
    processes by an flock; reads of the tree (and of a sealed workspace's rows) and
    searches run concurrently with them and with each other. Implements the operations
    of `sync.client.StoreClient`. Tuned by its store's `StoreOptions`.
    """

    @staticmethod
    def initialize(path: Path, dim: int, mode: str = MODE_SERVER_SEARCH) -> None:
        """Create the files of a new, empty workspace of `mode`."""
        WorkspaceFiles.initialize(path)
        MODE_ROWS[mode].create(path, dim)

    def __init__(self, path: Path, record: WorkspaceRecord, options: StoreOptions) -> None:
        self.head = WorkspaceHead(record, options.limits, options.crash_hook)
        self.files = WorkspaceFiles(path, self.head, options)
        try:
            self.rows = MODE_ROWS[record.mode](self.files)
        except BaseException:
            self.files.close()
            raise
        self.pool = PoolOps(self.files, self.rows)
        self.path = path
        self.options = options
        self.index_events = self.files.events

    # -- reads --------------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self.files.check_open()
        with self.files.rlock:
            (nodes,) = self.files.rconn.execute("SELECT COUNT(*) FROM nodes").fetchone()
        chunks, extra = self.rows.counts()
        return self.head.info(chunks, nodes, extra)

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
        self.files.check_open()
        return self.head.file_rows(self.rows, keys, ref)

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        self.files.check_open()
        ref = ref_id(ref, self.head.sealed)
        with self.files.rlock:
            rows = self.files.rconn.execute(
                "SELECT key, value, is_dir FROM nodes WHERE parent IS NULL"
                " AND key >= ? AND key < ? ORDER BY key", ref_bounds(ref)
            ).fetchall()
        return self.head.root([NodeInfo(unscoped(k), v, bool(d)) for k, v, d in rows])

    def children(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF
                 ) -> dict[bytes, list[NodeInfo]]:
        self.files.check_open()
        ref = ref_id(ref, self.head.sealed)
        out: dict[bytes, list[NodeInfo]] = {k: [] for k in children_keys(keys, self.head.limits)}
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
        return self.rows.search(vector, k)

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

        What differs between the modes is done by the workspace's `rows`
        (sync.store.embedded.mode_rows), at the steps named there.
        """
        files, rows = self.files, self.rows
        files.check_open()
        ref = ref_id(ref, self.head.sealed)
        ups, dels = validate_apply(self.head, updates, deletes)
        if not ups and not dels:
            return []
        ups = [dataclasses.replace(u, file_key=scoped(ref, u.file_key),
                                   ancestors=tuple(scoped(ref, a) for a in u.ancestors))
               for u in ups]
        dels = [scoped(ref, d) for d in dels]
        with files.write_lock, files.flock():
            rows.prepare_write()

            # 1. Pending.
            with transaction(files.wconn) as conn:
                plan, generation = mark_pending(conn, ref, ups, dels)
            rows.follow(generation)
            self.head.reached("pending")

            # 2. Rows: how many went is what step 4 purges.
            deleted = rows.write(plan, ups)
            self.head.reached("rows")

            # 3. Values: a link's only if the pool holds its blob.
            with rows.statements(), transaction(files.wconn) as conn:
                missing, ups = rows.held(conn, ups)
                generation = commit_values(conn, plan, ups)
                released = rows.settle(conn, ref, ups)  # blobs left without a ref
            rows.follow(generation)
            self.head.reached("committed")

            # 4. Deleted rows' bytes leave the data dir.
            rows.purge(deleted + released, added=sum(len(u.chunk_ids) for u in ups))
        return missing

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
        ref = ref_id(ref, self.head.sealed)
        pending = dir_value_checks(values, self.head.limits)
        with self.files.write_lock, self.files.flock(), transaction(self.files.wconn) as conn:
            self.rows.touch(conn, ref)
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
        self.head.refused(refused)

    # -- refs and the pool (sync.store.embedded.pool_ops, the mode's rows) ----------------

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        """The rows of each blob (file key, value) the pool holds, whichever ref sent
        it; the keys of those it lacks in `missing`. Bounded like `file_rows`."""
        self.files.check_open()
        return self.head.blob_rows(self.rows, items, with_rows=rows)

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
        self.files.check_open()
        self.rows.verify(deep=deep)

    def check(self) -> list[str]:
        """Every problem found in this workspace's files, one line each (empty: none);
        sync.store.embedded.workspace_checks."""
        return workspace_problems(self.files, self.rows)

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every chunk row, read in full."""
        return self.rows.rows_by_file()

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot, then close."""
        if self.files.closed:
            return
        with self.files.write_lock:
            self.rows.close()
            self.files.close()
