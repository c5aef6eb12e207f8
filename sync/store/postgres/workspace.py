"""One workspace of the store on PostgreSQL with pgvector (sync.store.postgres): the same
operations, limits, errors and answers as the embedded store's (sync.store.embedded.workspace);
the tables are in sync.store.postgres.schema.

Write order. The embedded store's `apply` writes in three steps (mark pending, replace
rows, commit values) because SQLite and LanceDB cannot commit together (a sealed
workspace, whose rows are in SQLite too, keeps the same steps). Here all three
are ONE transaction: PostgreSQL commits the nodes and the rows at once or not at all, so
no reader ever sees a value without its rows, and a crash leaves nothing to converge.
The steps still set every node above a change pending (NULL), because that is what the
client sees after an apply until it sends directory values.

Refs and the pool. A sealed workspace holds one tree per ref (the nodes' `ref` column;
the tree's SQL in sync.store.postgres.tree, step 1's plan in sync.store.core.tree_plan) over one
pool of blobs shared by every ref (sync.store.postgres.pool), as the embedded store does.

Concurrency. Every write to a workspace (`apply`, `set_dir_values`, `drop_ref`, the GC)
first takes `SELECT ... FOR UPDATE` on the workspace's row, so two replicas' writes to
one workspace run one after the other, whichever refs they write (the pool is shared);
under READ COMMITTED each statement after the lock sees what the previous writer
committed. Reads run without locks: each is one statement, so it sees one committed
state.

Modes. What a sealed and a server-search workspace do differently is the workspace's
`rows`, chosen when it opens (sync.store.postgres.mode_rows): a sealed workspace's
blobs (sync.store.postgres.sealed_rows), or a server-search workspace's rows with their
vectors and its HNSW index (sync.store.postgres.search_rows); this module never asks
which mode the workspace is of.

Connections and the binary COPY of new rows: sync.store.postgres.conn. A database that cannot
be reached is a `StoreUnavailable` (503) naming it with its password masked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import psycopg

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
from sync.store.core.rows import fid_of, rows_by_fid
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.postgres.conn import Pool
from sync.store.postgres.mode_rows import PgRows
from sync.store.postgres.pool import PgPool
from sync.store.postgres.schema import SCHEMA
from sync.store.postgres.sealed_rows import PgSealedRows
from sync.store.postgres.search_rows import PgSearchRows
from sync.store.postgres.tree import commit_values, mark_pending
from sync.wire import StoreCorrupt, StoreError, WorkspaceNotFound

if TYPE_CHECKING:
    from sync.store.postgres.options import PgOptions

__all__ = ["PgWorkspace"]

log = logging.getLogger(__name__)

W = SCHEMA  # table prefix in queries

#: The rows of each mode, chosen when a workspace opens.
MODE_ROWS: dict[str, Callable[[Pool, WorkspaceHead, PgOptions], PgRows]] = {
    MODE_SEALED: PgSealedRows,
    MODE_SERVER_SEARCH: PgSearchRows,
}


class PgWorkspace:
    """The Merkle tree and chunk rows of one workspace in the database; the operations
    of `WorkspaceStore` (sync.store.embedded.workspace). Thread-safe: every call takes its
    own connection."""

    def __init__(self, pool: Pool, record: WorkspaceRecord, options: PgOptions) -> None:
        self._pool = pool
        self.head = WorkspaceHead(record, options.limits, options.crash_hook)
        self.options = options
        self.workspace_id = record.workspace_id
        self.rows = MODE_ROWS[record.mode](pool, self.head, options)
        self._closed = False
        self._refs = PgPool(pool, self.head, options, self._lock_workspace, self.rows)

    # -- reads --------------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self._check_open()
        ws = self.workspace_id
        with self._pool.connection() as conn:
            row = conn.execute(
                f"SELECT (SELECT count(*) FROM {W}.nodes WHERE workspace = %s),"
                f" (SELECT count(*) FROM {W}.rows WHERE workspace = %s)", (ws, ws),
            ).fetchone()
        assert row is not None
        return self.head.info(int(row[1]), int(row[0]), self.rows.describe())

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        self._check_open()
        ref = ref_id(ref, self.head.sealed)
        with self._pool.connection() as conn:
            rows = conn.execute(
                f"SELECT key, value, is_dir FROM {W}.nodes WHERE workspace = %s"
                " AND ref = %s AND parent IS NULL ORDER BY key", (self.workspace_id, ref),
            ).fetchall()
        return self.head.root([NodeInfo(k, v, d) for k, v, d in rows])

    def children(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF
                 ) -> dict[bytes, list[NodeInfo]]:
        self._check_open()
        ref = ref_id(ref, self.head.sealed)
        out: dict[bytes, list[NodeInfo]] = {k: [] for k in children_keys(keys, self.head.limits)}
        with self._pool.connection() as conn:
            found = conn.execute(
                f"SELECT parent, key, value, is_dir FROM {W}.nodes WHERE workspace = %s"
                " AND ref = %s AND parent = ANY(%s::bytea[]) ORDER BY parent, key",
                (self.workspace_id, ref, list(out)),
            ).fetchall()
        for parent, key, value, is_dir in found:
            out[parent].append(NodeInfo(key, value, is_dir))
        return out

    def file_rows(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF) -> FileRows:
        """(chunk id, meta) of every row of each committed leaf of `keys`, as
        `WorkspaceStore.file_rows`. One statement: one committed state. Sealed, the rows
        of the blob the leaf names (sync.store.postgres.pool)."""
        self._check_open()
        return self.head.file_rows(self.rows, keys, ref)

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean distance (not squared)."""
        self._check_open()
        return self.rows.search(vector, k)

    # -- writes -------------------------------------------------------------------------

    def apply(self, updates: Sequence[FileUpdate], deletes: Sequence[bytes],
              ref: bytes = DEFAULT_REF) -> list[bytes]:
        """As `WorkspaceStore.apply`, its three steps in one transaction (the module
        docstring), under the workspace's row lock: the tree's steps per ref
        (sync.store.postgres.tree), the rows as the mode keeps them (`rows`: a sealed
        workspace's as blobs of the pool shared by every ref, sync.store.postgres.pool).
        Returns the links left pending."""
        self._check_open()
        ref = ref_id(ref, self.head.sealed)
        ups, dels = validate_apply(self.head, updates, deletes)
        if not ups and not dels:
            return []
        ws, rows = self.workspace_id, self.rows
        with self._pool.connection() as conn, conn.transaction():
            self._lock_workspace(conn)
            plan, old_blobs = mark_pending(conn, ws, ref, ups, dels)
            self.head.reached("pending")
            rows.write(conn, plan, old_blobs, ups)
            self.head.reached("rows")
            missing, ups = rows.held(conn, ups)  # a link's leaf only over a blob held
            commit_values(conn, ws, ref, ups, plan.remove)
            rows.settle(conn, ref, ups)
        self.head.reached("committed")
        rows.after_commit(ups)
        return missing

    def set_dir_values(self, values: Sequence[DirValue | tuple[bytes, bytes, bytes]],
                       ref: bytes = DEFAULT_REF) -> None:
        """As `WorkspaceStore.set_dir_values`: each value only over the children it was
        computed from (compare-and-set), in one transaction under the workspace lock;
        checked bottom-up, each after the values the call gives its children."""
        self._check_open()
        ref = ref_id(ref, self.head.sealed)
        pending = dir_value_checks(values, self.head.limits)
        ws = self.workspace_id
        with self._pool.connection() as conn, conn.transaction():
            self._lock_workspace(conn)
            self.rows.touch(conn, ref)
            dirs = {key for (key,) in conn.execute(
                f"SELECT key FROM {W}.nodes WHERE workspace = %s AND ref = %s"
                " AND key = ANY(%s::bytea[]) AND is_dir",
                (ws, ref, list(pending)))}
            pending = {k: v for k, v in pending.items() if k in dirs}  # others are ignored

            def children_of(keys: list[bytes]) -> Children:
                kids: Children = {k: [] for k in keys}
                for parent, key, value in conn.execute(
                    f"SELECT parent, key, value FROM {W}.nodes WHERE workspace = %s"
                    " AND ref = %s AND parent = ANY(%s::bytea[])", (ws, ref, keys)):
                    kids[bytes(parent)].append((bytes(key), value))
                return kids

            def write(items: list[tuple[bytes, bytes]]) -> None:
                conn.execute(
                    f"UPDATE {W}.nodes n SET value = u.value"
                    " FROM unnest(%s::bytea[], %s::bytea[]) AS u (key, value)"
                    " WHERE n.workspace = %s AND n.ref = %s AND n.key = u.key",
                    ([k for k, _ in items], [v for _, v in items], ws, ref),
                )

            refused = decide_dir_values(pending, children_of, write)  # sync.store.core.checks
        self.head.refused(refused)

    # -- refs and the pool (sync.store.postgres.pool, the mode's rows) -------------------

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        """As `WorkspaceStore.blob_rows`, in one statement: one committed state."""
        self._check_open()
        return self.head.blob_rows(self.rows, items, with_rows=rows)

    def refs(self) -> list[RefInfo]:
        self._check_open()
        return self._refs.refs()

    def drop_ref(self, ref: bytes) -> None:
        self._check_open()
        self._refs.drop_ref(ref)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        self._check_open()
        return self._refs.collect_garbage(max_ref_age_days=max_ref_age_days, grace_s=grace_s)

    # -- checks -------------------------------------------------------------------------

    def verify(self, *, deep: bool = True) -> None:
        """Raise StoreUnavailable if the database cannot be reached, StoreCorrupt if the
        workspace's row is gone."""
        self._check_open()
        with self._pool.connection() as conn:
            found = conn.execute(f"SELECT 1 FROM {W}.workspaces WHERE id = %s",
                                 (self.workspace_id,)).fetchone()
        if found is None:
            raise StoreCorrupt(f"workspace {self.workspace_id} is no longer in the database"
                               f" {self._pool.where}; restore it from a backup (pg_dump)")

    def check(self) -> list[str]:
        """Every problem found in this workspace's rows, one line each (empty: none)."""
        self._check_open()
        ws = self.workspace_id
        with self._pool.connection() as conn:
            leaves = {fid_of(k) for (k,) in conn.execute(
                f"SELECT key FROM {W}.nodes WHERE workspace = %s AND NOT is_dir", (ws,))}
            # A blob no ref names yet waits for the GC: not damage.
            leaves |= {f for (f,) in conn.execute(
                f"SELECT fid FROM {W}.blobs WHERE workspace = %s", (ws,))}
            stats = conn.execute(
                f"SELECT fid, count(*), count(vector) FROM {W}.rows WHERE workspace = %s"
                " GROUP BY fid", (ws,)).fetchall()
            twice = conn.execute(
                f"SELECT count(*) - count(DISTINCT rid), count(*) - count(DISTINCT chunk_id)"
                f" FROM {W}.rows WHERE workspace = %s", (ws,)).fetchone()
            # Every row with a vector or none, and a sealed workspace's pool.
            mode = self.rows.problems(conn, sum(n for _, n, _ in stats),
                                      sum(v for _, _, v in stats))
        problems = []
        assert twice is not None
        # rid is the primary key, and every send makes fresh chunk ids: either seen
        # twice means a table restored without its constraints, or a row written twice.
        if twice[0]:
            problems.append(f"workspace {ws} holds {twice[0]} rows whose rid another row"
                            f" has too; restore {W}.rows's primary key (from a pg_dump)")
        if twice[1]:
            problems.append(f"workspace {ws} holds {twice[1]} rows twice (same chunk id);"
                            " let its clients index again")
        orphans = sum(n for fid, n, _ in stats if fid not in leaves)
        if orphans:
            problems.append(f"workspace {ws} holds {orphans} rows of files its tree does"
                            " not have; let its clients index again")
        return problems + mode

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every row of the workspace."""
        with self._pool.connection() as conn:
            return rows_by_fid(conn.execute(
                f"SELECT rid, fid, chunk_id FROM {W}.rows WHERE workspace = %s ORDER BY rid",
                (self.workspace_id,)))

    def close(self) -> None:
        self._closed = True
        self.rows.close()

    def _lock_workspace(self, conn: psycopg.Connection) -> None:
        """Serialise this transaction with every other write to the workspace."""
        row = conn.execute(f"SELECT mode FROM {W}.workspaces WHERE id = %s FOR UPDATE",
                           (self.workspace_id,)).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"no workspace {self.workspace_id!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"workspace {self.workspace_id} is closed")
