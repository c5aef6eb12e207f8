"""A server-search workspace's rows in PostgreSQL (sync.store.core.mode_rows): each with
its vector, searched by pgvector, exactly or through a graph of the workspace's own.

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
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from sync.records import MODE_SERVER_SEARCH, SearchHit
from sync.store.core.checks import Update, search_request
from sync.store.core.mode_rows import FoundRows, NoPool, search_extra
from sync.store.core.tree_plan import TreePlan
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.postgres.conn import Pool, search_copy_rows, vector_text
from sync.store.postgres.schema import SCHEMA
from sync.store.postgres.tree import committed_rows
from sync.wire import StoreError

if TYPE_CHECKING:
    from sync.store.postgres.options import PgOptions

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


class PgSearchRows(NoPool[psycopg.Connection]):
    """The rows of a server-search workspace and its HNSW index."""

    def __init__(self, pool: Pool, head: WorkspaceHead, options: PgOptions) -> None:
        self._pool = pool
        self.options = options
        self.workspace_id = head.workspace_id
        self.dim = head.dim
        self.limits = head.limits
        # Names are at most 63 bytes; a workspace id may be longer.
        digest = hashlib.sha256(head.workspace_id.encode()).hexdigest()
        self.index_name = f"rows_hnsw_{digest[:16]}"
        self._hnsw_ready = False  # once seen valid it stays: indexes go only with the workspace
        self._rows_estimate: tuple[float, float] | None = None  # (when read, rows)
        self._builder: threading.Thread | None = None
        self._builder_lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        hnsw = self.has_hnsw_index()
        return search_extra({"kind": "pgvector-hnsw" if hnsw else "pgvector", "exact": not hnsw})

    def file_rows(self, wanted: list[bytes], ref: bytes) -> FoundRows:
        """The rows of each file whose leaf is committed."""
        return committed_rows(self._pool, self.workspace_id, ref, wanted)

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """By Euclidean distance (not squared): through the graph once it is built (for a
        `k` it can return), exactly otherwise."""
        query, k = search_request(vector, k, self.dim, self.limits)
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

    # -- the steps of an apply ---------------------------------------------------------

    def write(self, conn: psycopg.Connection, plan: TreePlan,
              old_blobs: set[tuple[int, bytes]], updates: list[Update]) -> None:
        """The rows of the plan's files replaced by those of `updates`."""
        conn.execute(f"DELETE FROM {W}.rows WHERE workspace = %s"
                     " AND fid = ANY(%s::bigint[])", (self.workspace_id, sorted(plan.fids)))
        if any(u.chunk_ids for u in updates):
            with conn.cursor().copy(
                f"COPY {W}.rows (workspace, fid, chunk_id, meta, vector, value)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.write(search_copy_rows(self.workspace_id, updates, self.dim))

    def after_commit(self, updates: list[Update]) -> None:
        """New rows may have made the workspace large enough for its graph."""
        if any(u.chunk_ids for u in updates):
            self._maybe_start_index()

    # -- refs, the pool and checks ---------------------------------------------------------

    def problems(self, conn: psycopg.Connection, rows: int, with_vector: int) -> list[str]:
        """Every row holds a vector."""
        if with_vector == rows:
            return []
        return [f"workspace {self.workspace_id} ({MODE_SERVER_SEARCH}) holds {with_vector}"
                f" of {rows} rows with a vector"]

    def close(self) -> None:
        pass

    # -- the HNSW index -----------------------------------------------------------------

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


    def _maybe_start_index(self) -> None:
        """Start building the HNSW index in the background once the workspace is large
        enough: the apply that crossed the threshold answers at once."""
        if self.dim > MAX_HNSW_DIM or self._hnsw_ready:
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
