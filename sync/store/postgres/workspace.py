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

Search (server-search workspaces). A small workspace is searched exactly: `ORDER BY
vector <-> q LIMIT k` over its rows (found by the (workspace, fid) index), which below
some tens of thousands of rows is both cheaper than a graph and exact. Once a workspace
holds `PgOptions.hnsw_threshold` rows it gets a partial HNSW index of its own (`CREATE
INDEX ... USING hnsw ((vector::vector(dim)) vector_l2_ops) WHERE workspace = '<id>'`):
partial, because one index over all workspaces would rank candidates from every
workspace and filter afterwards, leaving a workspace with fewer than k hits; an
expression, because the column has no dimension and HNSW needs one. The planner uses it
only for a query with the same expression and the same literal filter, so the
approximate query is written that way (see `_hnsw_search`). The indexes are not part of
the fixed layout: a replica that finds one uses it, one that does not searches exactly,
and every insert keeps it in step whoever writes.

Connections and the binary COPY of new rows: sync.store.postgres.conn. A database that cannot
be reached is a `StoreUnavailable` (503) naming it with its password masked.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql

from sync.records import (
    DEFAULT_REF,
    MODE_SEALED,
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
from sync.store.core.rows import bounded_answer, fid_of, file_keys
from sync.store.postgres.conn import Pool, copy_rows, vector_text
from sync.store.postgres.pool import (
    PgPool,
    adopt,
    expire_orphans,
    fid_blobs,
    present,
    ref_count,
    release,
    replace_blob_rows,
    touch_ref,
)
from sync.store.postgres.schema import SCHEMA
from sync.store.postgres.tree import commit_values, mark_pending
from sync.wire import (
    BadRequest,
    SealedWorkspaceError,
    StoreCorrupt,
    StoreError,
    WorkspaceNotFound,
)

if TYPE_CHECKING:
    from sync.store.postgres.options import PgOptions

__all__ = ["PgWorkspace"]

log = logging.getLogger(__name__)

W = SCHEMA  # table prefix in queries

# The graph's shape and the candidates a search keeps (hnsw.ef_search, when k is
# smaller). On 100k synthetic code embeddings (bench/replicas.py), recall@10 against
# exact: m 16 / ef_construction 64 (pgvector's defaults) reach 0.78 at ef_search 100 and
# 0.94 at 400; ef_construction 200 reaches 0.97 at 200 and 0.99 at 400 (8.6 ms against
# 88 ms for the exact scan), for a build three times as long (50 s); m 32 gains little
# more for a slower build and slower searches.
#
# A larger graph needs more candidates for the same recall. At 1M rows (the same
# benchmark, one run) m 16 reaches recall@10 0.900 at ef_search 400, 0.935 at 600, 0.957
# at 800 and 0.968 at 1000 (pgvector's most): so ef_search grows with the square root of
# the rows, from EF_SEARCH at EF_SEARCH_ROWS up to MAX_EF_SEARCH (reached at 625k rows).
# Even so m 16 tops out at 0.972 there; m 24 reaches 0.982 (95.6 ms p50 through HTTP)
# and 0.988 at 100k, for builds 1.3-1.6 times as long (112 s at 100k, 20 min at 1M on 2
# busy cores). The graph is built when a workspace reaches HNSW_THRESHOLD and then only
# grows, so its m is chosen for the size it may reach: 24.
HNSW_M = 24
HNSW_EF_CONSTRUCTION = 200
EF_SEARCH = 400
EF_SEARCH_ROWS = 100_000
ROWS_ESTIMATE_TTL_S = 60.0  # how long a workspace's row estimate (for ef_search) is kept
# pgvector's limits: hnsw.ef_search at most 1000 (and a graph search returns at most
# ef_search rows, so a larger k is searched exactly); HNSW over `vector` up to 2000 dims.
MAX_EF_SEARCH = 1000
MAX_HNSW_DIM = 2000


def ef_search_for(rows: float, k: int) -> int:
    """hnsw.ef_search for a search of `k` rows in a graph of `rows` (see HNSW_M)."""
    grown = EF_SEARCH * math.sqrt(max(rows, 0) / EF_SEARCH_ROWS)
    return min(MAX_EF_SEARCH, max(k, EF_SEARCH, math.ceil(grown)))
# maintenance_work_mem for a build. pgvector builds fast while the graph fits in it and
# much slower once it spills (it says so in a notice); the graph takes about a vector
# and two neighbour lists per row. Sized per build from the workspace's rows, between
# these bounds; the upper one can be changed per replica (CODEVEIL_PG_BUILD_MEMORY_MB),
# since the database host needs that much free memory while a build runs.
HNSW_BUILD_MEMORY_MIN_MB = 64
HNSW_BUILD_MEMORY_MAX_MB = 4096
BUILD_MEMORY_ENV = "CODEVEIL_PG_BUILD_MEMORY_MB"


def hnsw_build_memory_mb(rows: int, dim: int, m: int = HNSW_M) -> int:
    """maintenance_work_mem (MB) under which an HNSW graph of `rows` fits, bounded."""
    raw = os.environ.get(BUILD_MEMORY_ENV, str(HNSW_BUILD_MEMORY_MAX_MB))
    try:
        cap = int(raw)
    except ValueError:
        raise StoreError(f"{BUILD_MEMORY_ENV} must be a whole number of MB, got {raw!r}") from None
    per_row = 4 * dim + 2 * m * 8 + 96  # the vector, level-0 neighbours, tuple overhead
    wanted = math.ceil(rows * per_row * 1.25 / 2**20)
    return max(HNSW_BUILD_MEMORY_MIN_MB, min(max(cap, HNSW_BUILD_MEMORY_MIN_MB), wanted))


# -- one workspace --------------------------------------------------------------------------


class PgWorkspace:
    """The Merkle tree and chunk rows of one workspace in the database; the operations
    of `WorkspaceStore` (sync.store.embedded.workspace). Thread-safe: every call takes its
    own connection."""

    def __init__(self, pool: Pool, record: WorkspaceRecord, options: PgOptions) -> None:
        self._pool = pool
        self._record = record
        self.options = options
        self.workspace_id = record.workspace_id
        self.dim = record.dim
        self.mode = record.mode
        self.sealed = record.mode == MODE_SEALED
        self.limits = options.limits
        # Names are at most 63 bytes; a workspace id may be longer.
        digest = hashlib.sha256(record.workspace_id.encode()).hexdigest()
        self.index_name = f"rows_hnsw_{digest[:16]}"
        self._hnsw_ready = False  # once seen valid it stays: indexes go only with the workspace
        self._rows_estimate: tuple[float, float] | None = None  # (when read, rows)
        self._builder: threading.Thread | None = None
        self._builder_lock = threading.Lock()
        self._closed = False
        self._refs = PgPool(pool, record.workspace_id, self.sealed, options,
                            self._lock_workspace)

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
        r = self._record
        extra: dict[str, Any] = {"created_at": r.created_at, "limits": self.limits.as_dict()}
        if not self.sealed:
            extra["distance"] = "l2"
            hnsw = self.has_hnsw_index()
            extra["index"] = {"kind": "pgvector-hnsw" if hnsw else "pgvector", "exact": not hnsw}
        else:
            extra["pool"] = True  # one tree per ref over a pool of blobs (sync.store.postgres.pool)
        return WorkspaceInfo(
            workspace_id=r.workspace_id, dim=r.dim, model_id=r.model_id,
            key_check=r.key_check, chunks=int(row[1]), nodes=int(row[0]), extra=extra,
            mode=r.mode,
        )

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        self._check_open()
        ref = ref_id(ref, self.sealed)
        with self._pool.connection() as conn:
            rows = conn.execute(
                f"SELECT key, value, is_dir FROM {W}.nodes WHERE workspace = %s"
                " AND ref = %s AND parent IS NULL ORDER BY key", (self.workspace_id, ref),
            ).fetchall()
        if len(rows) > 1:  # apply() refuses a second root; this would be a bug
            log.error("workspace %s has %d root nodes", self.workspace_id, len(rows))
        return NodeInfo(rows[0][0], rows[0][1], rows[0][2]) if rows else None

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
        ref = ref_id(ref, self.sealed)
        wanted = file_keys(keys, self.limits)
        if not wanted:
            return {}
        with self._pool.connection() as conn:
            rows = conn.execute(
                f"SELECT w.key, r.rid, r.chunk_id, r.meta"
                f" FROM unnest(%s::bytea[], %s::bigint[]) AS w (key, fid)"
                f" JOIN {W}.nodes n ON n.workspace = %s AND n.ref = %s AND n.key = w.key"
                "   AND n.value IS NOT NULL AND NOT n.is_dir"
                f" JOIN {W}.rows r ON r.workspace = %s AND r.fid = w.fid"
                + ("   AND r.value = n.value" if self.sealed else ""),
                (wanted, [fid_of(k) for k in wanted], self.workspace_id, ref,
                 self.workspace_id),
            ).fetchall()
        found: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
        for key, rid, cid, meta in rows:
            found.setdefault(key, []).append((rid, cid, meta))
        return bounded_answer(wanted, found, self.limits.max_row_bytes)

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean distance (not squared)."""
        self._check_open()
        if self.sealed:
            raise SealedWorkspaceError(
                f"workspace {self.workspace_id} is sealed: search runs on the client"
            )
        query = _vector(vector, self.dim, "vector")
        try:
            if isinstance(k, bool):
                raise TypeError
            k = operator.index(k)
        except TypeError:
            raise BadRequest(f"k must be an integer, got {type(k).__name__}") from None
        if not 1 <= k <= self.limits.max_k:
            raise BadRequest(f"k must be between 1 and {self.limits.max_k}, got {k}")
        if k <= MAX_EF_SEARCH and self.has_hnsw_index():
            rows = self._hnsw_search(vector_text(query), k)
        else:
            with self._pool.connection() as conn:
                rows = conn.execute(
                    f"SELECT chunk_id, meta, vector <-> %s::vector AS d FROM {W}.rows"
                    " WHERE workspace = %s ORDER BY d, rid LIMIT %s",
                    (vector_text(query), self.workspace_id, k),
                ).fetchall()
        return [SearchHit(cid, float(d), meta) for cid, meta, d in rows]

    def hnsw_query(self) -> sql.Composed:
        """The approximate search: the index's expression and its filter as a literal
        (a bound parameter would not prove the partial index's predicate under a
        generic plan); no tie-break on rid, which would keep the planner off the index."""
        cast = sql.SQL("vector::vector({})").format(sql.Literal(self.dim))
        return sql.SQL(
            "SELECT chunk_id, meta, {cast} <-> %s::vector({dim}) AS d FROM {rows}"
            " WHERE workspace = {ws} ORDER BY d LIMIT %s"
        ).format(cast=cast, dim=sql.Literal(self.dim), rows=sql.Identifier(W, "rows"),
                 ws=sql.Literal(self.workspace_id))

    def _hnsw_search(self, query: str, k: int) -> list[tuple[bytes, bytes, float]]:
        with self._pool.connection() as conn, conn.transaction():
            self.hnsw_settings(conn, k)
            return conn.execute(self.hnsw_query(), (query, k)).fetchall()

    def hnsw_settings(self, conn: psycopg.Connection, k: int) -> None:
        """For the rest of `conn`'s transaction: the candidates a graph search keeps,
        and the graph taken over an exact scan.

        The planner costs the exact scan by its estimate of the workspace's rows, from
        statistics that know nothing of rows written since the table was last analysed:
        a workspace that just grew past the threshold, in a table of other workspaces,
        is estimated at one row, and its searches scanned all 100k of them in a sorted
        exact plan (0.30 s, against 0.004 s through the graph; 600k rows of other
        workspaces, bench/replicas.py). The exact plan sorts and the graph does not, so
        sorting is priced out here, where the index is known to exist."""
        ef = ef_search_for(self._graph_rows(conn), k)
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
        conn.execute("SET LOCAL enable_sort = off")

    def _graph_rows(self, conn: psycopg.Connection) -> float:
        """The rows of the workspace's HNSW index, as the planner's statistics estimate
        them (a catalog read, not a count), kept for ROWS_ESTIMATE_TTL_S."""
        now = time.monotonic()
        if self._rows_estimate is None or now - self._rows_estimate[0] > ROWS_ESTIMATE_TTL_S:
            row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                               (f"{W}.{self.index_name}",)).fetchone()
            self._rows_estimate = (now, float(row[0]) if row and row[0] > 0 else 0.0)
        return self._rows_estimate[1]

    def has_hnsw_index(self) -> bool:
        """Whether the workspace's HNSW index exists and is valid (built by any replica)."""
        if self._hnsw_ready:
            return True
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
                (f"{W}.{self.index_name}",),
            ).fetchone()
        self._hnsw_ready = bool(row and row[0])
        return self._hnsw_ready

    # -- writes -------------------------------------------------------------------------

    def apply(self, updates: Sequence[FileUpdate], deletes: Sequence[bytes],
              ref: bytes = DEFAULT_REF) -> list[bytes]:
        """As `WorkspaceStore.apply`, its three steps in one transaction (the module
        docstring), under the workspace's row lock: the tree's steps per ref
        (sync.store.postgres.tree), a sealed workspace's rows as blobs of the pool shared by
        every ref (sync.store.postgres.pool). Returns the links left pending."""
        self._check_open()
        ref = ref_id(ref, self.sealed)
        ups, dels = validate_apply(self, updates, deletes)
        if not ups and not dels:
            return []
        ws = self.workspace_id
        missing: list[bytes] = []
        with self._pool.connection() as conn, conn.transaction():
            self._lock_workspace(conn)
            plan, old_blobs = mark_pending(conn, ws, ref, ups, dels)
            self._reached("pending")
            if self.sealed:
                # Only uploaded blobs are written; those the touched leaves named before
                # (and any blob of a touched file a lost apply left unnamed) go if no
                # ref names them, at once with one ref, after the grace with several.
                replace_blob_rows(conn, ws, [u for u in ups if not u.link])
                named = {(fid_of(u.file_key), u.value) for u in ups}
                touched = old_blobs | fid_blobs(conn, ws, plan.fids)
                release(conn, ws, touched - named, now=ref_count(conn, ws) <= 1)
            else:
                conn.execute(f"DELETE FROM {W}.rows WHERE workspace = %s"
                             " AND fid = ANY(%s::bigint[])", (ws, sorted(plan.fids)))
                if any(u.chunk_ids for u in ups):
                    with conn.cursor().copy(
                        f"COPY {W}.rows (workspace, fid, chunk_id, meta, vector, value)"
                        " FROM STDIN (FORMAT BINARY)"
                    ) as copy:
                        copy.write(copy_rows(ws, ups, self.dim, self.sealed))
            self._reached("rows")
            if self.sealed:  # a link's leaf is set only over a blob the pool holds
                held = present(conn, ws, [(fid_of(u.file_key), u.value) for u in ups if u.link])
                lacking = {id(u) for u in ups
                           if u.link and (fid_of(u.file_key), u.value) not in held}
                missing = [u.file_key for u in ups if id(u) in lacking]
                ups = [u for u in ups if id(u) not in lacking]
            commit_values(conn, ws, ref, ups, plan.remove)
            if self.sealed:
                adopt(conn, ws, {(fid_of(u.file_key), u.value) for u in ups})
                expire_orphans(conn, ws, self.options.blob_grace_s)
                touch_ref(conn, ws, ref)
        self._reached("committed")
        if any(u.chunk_ids for u in ups):
            self._maybe_start_index()
        return missing

    def _reached(self, point: str) -> None:
        """Tell the crash hook (PgOptions.crash_hook) that the apply passed `point`."""
        if self.options.crash_hook is not None:
            self.options.crash_hook(point)

    # -- refs and the pool (sync.store.postgres.pool) -----------------------------------------

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        self._check_open()
        return self._refs.blob_rows(items, rows=rows)

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

    # -- the HNSW index -----------------------------------------------------------------

    def _maybe_start_index(self) -> None:
        """Start building the HNSW index in the background once the workspace is large
        enough: the apply that crossed the threshold answers at once."""
        if self.sealed or self.dim > MAX_HNSW_DIM or self._hnsw_ready:
            return
        with self._builder_lock:
            if self._builder is not None and self._builder.is_alive():
                return
            if not self._large_enough():
                return
            self._builder = threading.Thread(target=self._build_quietly, daemon=True,
                                             name=f"hnsw-{self.workspace_id}")
            self._builder.start()

    def _large_enough(self) -> bool:
        with self._pool.connection() as conn:
            row = conn.execute(  # stops counting at the threshold
                f"SELECT count(*) FROM (SELECT 1 FROM {W}.rows WHERE workspace = %s"
                " LIMIT %s) s", (self.workspace_id, self.options.hnsw_threshold),
            ).fetchone()
        return row is not None and row[0] >= self.options.hnsw_threshold

    def _build_quietly(self) -> None:
        try:
            self.build_hnsw_index()
        except (StoreError, psycopg.Error) as exc:  # searches stay exact; the next apply retries
            log.warning("workspace %s: HNSW index not built (%s)", self.workspace_id, exc)

    def build_hnsw_index(self) -> bool:
        """Build the workspace's HNSW index unless it exists; False if another replica is
        building it now.

        CONCURRENTLY: writes go on during the build (it takes no lock that blocks
        inserts). Rows committed while it runs are added by its second pass; once it is
        valid every insert adds its row to the graph, and searches use it only from then
        on (`has_hnsw_index`). A build that fails leaves an invalid index, dropped here
        before the next try."""
        if self.has_hnsw_index():
            return True
        lock = int.from_bytes(hashlib.sha256(self.index_name.encode()).digest()[:8], "big",
                              signed=True)
        name = sql.Identifier(W, self.index_name)
        with self._pool.connection() as conn:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock,)).fetchone()
            if got is None or not got[0]:
                return False  # another replica holds it: one build per workspace
            try:
                if self.has_hnsw_index():  # finished by another replica meanwhile
                    return True
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(name))
                counted = conn.execute(f"SELECT count(*) FROM {W}.rows WHERE workspace = %s",
                                       (self.workspace_id,)).fetchone()
                memory = hnsw_build_memory_mb(counted[0] if counted else 0, self.dim)
                conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(
                    sql.Literal(f"{memory}MB")))
                conn.execute(sql.SQL(
                    "CREATE INDEX CONCURRENTLY {name} ON {rows} USING hnsw"
                    " ((vector::vector({dim})) vector_l2_ops)"
                    " WITH (m = {m}, ef_construction = {efc}) WHERE workspace = {ws}"
                ).format(name=sql.Identifier(self.index_name), rows=sql.Identifier(W, "rows"),
                         dim=sql.Literal(self.dim), m=sql.Literal(HNSW_M),
                         efc=sql.Literal(HNSW_EF_CONSTRUCTION),
                         ws=sql.Literal(self.workspace_id)))
                conn.execute("RESET maintenance_work_mem")
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
        log.info("workspace %s: built its HNSW index", self.workspace_id)
        return self.has_hnsw_index()

    def set_dir_values(self, values: Sequence[DirValue | tuple[bytes, bytes, bytes]],
                       ref: bytes = DEFAULT_REF) -> None:
        """As `WorkspaceStore.set_dir_values`: each value only over the children it was
        computed from (compare-and-set), in one transaction under the workspace lock;
        checked bottom-up, each after the values the call gives its children."""
        self._check_open()
        ref = ref_id(ref, self.sealed)
        pending = dir_value_checks(values, self.limits)
        ws = self.workspace_id
        with self._pool.connection() as conn, conn.transaction():
            self._lock_workspace(conn)
            if self.sealed:
                touch_ref(conn, ws, ref)
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
        if refused:
            log.info(
                "workspace %s: %d directory values refused: computed over other children"
                " (another writer, or a pending node below)", ws, refused,
            )

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
            pool = self._refs.problems(conn) if self.sealed else []
            stats = conn.execute(
                f"SELECT fid, count(*), count(vector) FROM {W}.rows WHERE workspace = %s"
                " GROUP BY fid", (ws,)).fetchall()
            twice = conn.execute(
                f"SELECT count(*) - count(DISTINCT rid), count(*) - count(DISTINCT chunk_id)"
                f" FROM {W}.rows WHERE workspace = %s", (ws,)).fetchone()
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
        with_vector = sum(v for _, _, v in stats)
        rows = sum(n for _, n, _ in stats)
        if with_vector != (0 if self.sealed else rows):
            problems.append(f"workspace {ws} ({self.mode}) holds {with_vector} of {rows}"
                            " rows with a vector")
        return problems + pool

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every row of the workspace."""
        out: dict[int, tuple[list[int], list[bytes]]] = {}
        with self._pool.connection() as conn:
            for fid, rid, cid in conn.execute(
                f"SELECT fid, rid, chunk_id FROM {W}.rows WHERE workspace = %s ORDER BY rid",
                (self.workspace_id,),
            ):
                entry = out.setdefault(fid, ([], []))
                entry[0].append(rid)
                entry[1].append(cid)
        return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}

    def close(self) -> None:
        self._closed = True

    def _lock_workspace(self, conn: psycopg.Connection) -> None:
        """Serialise this transaction with every other write to the workspace."""
        row = conn.execute(f"SELECT mode FROM {W}.workspaces WHERE id = %s FOR UPDATE",
                           (self.workspace_id,)).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"no workspace {self.workspace_id!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"workspace {self.workspace_id} is closed")
