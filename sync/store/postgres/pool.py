"""Refs and the pool of sealed file blobs in PostgreSQL (docs/architecture.md, "Refs and
the blob pool"): the same semantics as the embedded store's (sync.store.embedded.pool,
sync.store.embedded.sealed_rows) over the tables `refs`, `blobs` and `rows.value`
(sync.store.postgres.schema).

The functions take the connection of the caller's transaction, which holds the
workspace's row lock (`SELECT ... FOR UPDATE`), so an apply, a dropped ref and the GC
of one workspace run one at a time across replicas: a blob a sync is about to link is
never deleted under it. `PgPool` is a workspace's ref requests (`WorkspaceBackend.refs`,
`drop_ref`, `collect_garbage`); `blob_rows` and `blob_problems` are a sealed workspace's
(sync.store.postgres.sealed_rows).

Times (a ref's last write, a blob's orphaning) are the database's clock (`NOW`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import psycopg

from sync.records import RefInfo
from sync.store.core.checks import Update, gc_settings, pool_problems, ref_id
from sync.store.core.rows import fid_of
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.postgres.conn import Pool, sealed_copy_rows
from sync.store.postgres.schema import NOW, SCHEMA
from sync.wire import RefNotFound

if TYPE_CHECKING:
    from sync.store.postgres.options import PgOptions

W = SCHEMA
DAY = 86_400.0
Blob = tuple[int, bytes]  # (fid, leaf value)
# A node key's fid (its first 8 bytes as a signed big-endian integer, rows.fid_of).
FID = "('x' || encode(substr({}, 1, 8), 'hex'))::bit(64)::bigint"


def _columns(blobs: Iterable[Blob]) -> tuple[list[int], list[bytes]]:
    items = sorted(set(blobs))
    return [f for f, _ in items], [v for _, v in items]


def touch_ref(conn: psycopg.Connection, ws: str, ref: bytes) -> None:
    conn.execute(f"INSERT INTO {W}.refs (workspace, ref, synced) VALUES (%s, %s, {NOW})"
                 " ON CONFLICT (workspace, ref) DO UPDATE SET synced = excluded.synced",
                 (ws, ref))


def ref_count(conn: psycopg.Connection, ws: str) -> int:
    """How many refs hold a tree (a root)."""
    row = conn.execute(f"SELECT count(*) FROM {W}.nodes WHERE workspace = %s"
                       " AND parent IS NULL", (ws,)).fetchone()
    return int(row[0]) if row else 0


def present(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob]) -> set[Blob]:
    """Those of `blobs` the pool holds."""
    return {(f, bytes(v)) for f, v in conn.execute(
        "SELECT b.fid, b.value FROM unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        f" JOIN {W}.blobs b ON b.workspace = %s AND b.fid = w.fid AND b.value = w.value",
        (*_columns(blobs), ws))}


def referenced(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob]) -> set[Blob]:
    """Those of `blobs` a leaf of some ref names."""
    return {(f, bytes(v)) for f, v in conn.execute(
        "SELECT w.fid, w.value FROM unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        f" WHERE EXISTS (SELECT 1 FROM {W}.nodes n WHERE n.workspace = %s"
        f"  AND n.value = w.value AND NOT n.is_dir AND {FID.format('n.key')} = w.fid)",
        (*_columns(blobs), ws))}


def delete_blobs(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob]) -> int:
    """Delete blobs with their rows; returns the rows deleted."""
    fids, values = _columns(blobs)
    if not fids:
        return 0
    gone = conn.execute(
        f"DELETE FROM {W}.rows r USING unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " WHERE r.workspace = %s AND r.fid = w.fid AND r.value = w.value",
        (fids, values, ws)).rowcount
    conn.execute(
        f"DELETE FROM {W}.blobs b USING unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " WHERE b.workspace = %s AND b.fid = w.fid AND b.value = w.value", (fids, values, ws))
    return max(gone, 0)


def _mark_orphaned(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob]) -> None:
    conn.execute(
        f"UPDATE {W}.blobs b SET orphaned = {NOW}"
        " FROM unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " WHERE b.workspace = %s AND b.fid = w.fid AND b.value = w.value"
        " AND b.orphaned IS NULL", (*_columns(blobs), ws))


def adopt(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob]) -> None:
    """Blobs a leaf names again: no longer orphaned."""
    conn.execute(
        f"UPDATE {W}.blobs b SET orphaned = NULL"
        " FROM unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " WHERE b.workspace = %s AND b.fid = w.fid AND b.value = w.value"
        " AND b.orphaned IS NOT NULL", (*_columns(blobs), ws))


def release(conn: psycopg.Connection, ws: str, blobs: Iterable[Blob], *, now: bool) -> int:
    """Blobs a change may have left without a ref: deleted with their rows if `now`,
    otherwise marked orphaned (the GC deletes them after the grace period). Returns
    the rows deleted."""
    blobs = set(blobs)
    loose = blobs - referenced(conn, ws, blobs)
    if now:
        return delete_blobs(conn, ws, loose)
    _mark_orphaned(conn, ws, loose)
    return 0


def fid_blobs(conn: psycopg.Connection, ws: str, fids: Iterable[int]) -> set[Blob]:
    """Every blob of the files `fids` (each file's versions) the pool holds."""
    return {(f, bytes(v)) for f, v in conn.execute(
        f"SELECT fid, value FROM {W}.blobs WHERE workspace = %s AND fid = ANY(%s::bigint[])",
        (ws, sorted(set(fids))))}


def replace_blob_rows(conn: psycopg.Connection, ws: str, uploads: list[Update]) -> int:
    """Replace the rows of each uploaded blob with its new rows and list it as held;
    returns the rows deleted."""
    if not uploads:
        return 0
    fids, values = [fid_of(u.file_key) for u in uploads], [u.value for u in uploads]
    # Rows are stored only with their blob listed (same transaction), so only a blob
    # sent again has rows to replace: one look-up of the blobs instead of a join of
    # every upload with the rows.
    again = present(conn, ws, zip(fids, values, strict=True))
    deleted = conn.execute(
        f"DELETE FROM {W}.rows r USING unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " WHERE r.workspace = %s AND r.fid = w.fid AND r.value = w.value",
        (*_columns(again), ws)).rowcount if again else 0
    if any(u.chunk_ids for u in uploads):
        with conn.cursor().copy(
            f"COPY {W}.rows (workspace, fid, chunk_id, meta, vector, value)"
            " FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.write(sealed_copy_rows(ws, uploads))
    conn.execute(
        f"INSERT INTO {W}.blobs (workspace, fid, value, orphaned)"
        " SELECT %s, fid, value, NULL FROM unnest(%s::bigint[], %s::bytea[]) AS w (fid, value)"
        " ON CONFLICT (workspace, fid, value) DO UPDATE SET orphaned = NULL",
        (ws, fids, values))
    return max(deleted, 0)


def expire_orphans(conn: psycopg.Connection, ws: str, grace_s: float) -> int:
    """Delete the blobs orphaned for longer than `grace_s`; returns the rows deleted."""
    old = [(f, bytes(v)) for f, v in conn.execute(
        f"SELECT fid, value FROM {W}.blobs WHERE workspace = %s"
        f" AND orphaned <= {NOW} - %s", (ws, grace_s))]
    return delete_blobs(conn, ws, old)


def collect(conn: psycopg.Connection, ws: str, grace_s: float) -> tuple[int, int]:
    """The GC's pass over the pool: a blob no ref names is marked orphaned (as
    `sync.store.embedded.pool.collect`), one orphaned longer than `grace_s` is deleted with its
    rows, one named again is adopted. Returns (blobs deleted, rows deleted)."""
    found = conn.execute(
        f"SELECT b.fid, b.value, b.orphaned IS NOT NULL, b.orphaned <= {NOW} - %s,"
        f" EXISTS (SELECT 1 FROM {W}.nodes n WHERE n.workspace = b.workspace"
        f"  AND n.value = b.value AND NOT n.is_dir AND {FID.format('n.key')} = b.fid)"
        f" FROM {W}.blobs b WHERE b.workspace = %s", (grace_s, ws)).fetchall()
    named = [(f, bytes(v)) for f, v, orphaned, _, used in found if used and orphaned]
    loose = [(f, bytes(v)) for f, v, orphaned, _, used in found if not used and not orphaned]
    expired = [(f, bytes(v)) for f, v, orphaned, due, used in found
               if not used and orphaned and due]
    adopt(conn, ws, named)
    _mark_orphaned(conn, ws, loose)
    return len(expired), delete_blobs(conn, ws, expired)


def blob_rows(pool: Pool, ws: str, wanted: list[tuple[bytes, bytes]], *, rows: bool
              ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """The rows of each blob (file key, value) of `wanted` the pool holds, in one
    statement: one committed state. Without `rows`, only which it holds: each found key
    once, row-less."""
    found: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
    if not wanted:
        return found
    columns, join = ("r.rid, r.chunk_id, r.meta", f" LEFT JOIN {W}.rows r ON"
                     " r.workspace = b.workspace AND r.fid = b.fid AND r.value = b.value"
                     ) if rows else ("NULL::bigint, NULL::bytea, NULL::bytea", "")
    with pool.connection() as conn:
        for key, rid, cid, meta in conn.execute(
            f"SELECT w.key, {columns}"
            " FROM unnest(%s::bytea[], %s::bigint[], %s::bytea[]) AS w (key, fid, value)"
            f" JOIN {W}.blobs b ON b.workspace = %s AND b.fid = w.fid"
            "  AND b.value = w.value" + join,
            ([k for k, _ in wanted], [fid_of(k) for k, _ in wanted],
             [v for _, v in wanted], ws)):
            entry = found.setdefault(bytes(key), [])
            if rid is not None:
                entry.append((rid, bytes(cid), bytes(meta)))
    return found


def blob_problems(conn: psycopg.Connection, ws: str) -> list[str]:
    """The pool's invariants (as the embedded store's `check`): every row of a listed
    blob, every committed leaf naming a blob the pool holds."""
    found = conn.execute(
        f"SELECT (SELECT count(*) FROM {W}.rows r WHERE r.workspace = %s"
        f"   AND NOT EXISTS (SELECT 1 FROM {W}.blobs b WHERE b.workspace = r.workspace"
        "   AND b.fid = r.fid AND b.value = r.value)),"
        f" (SELECT count(*) FROM {W}.nodes n WHERE n.workspace = %s AND NOT n.is_dir"
        f"   AND n.value IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {W}.blobs b"
        f"   WHERE b.workspace = n.workspace AND b.fid = {FID.format('n.key')}"
        "   AND b.value = n.value))", (ws, ws)).fetchone()
    loose, lacking = (int(found[0]), int(found[1])) if found else (0, 0)
    return pool_problems(f"workspace {ws}", loose, lacking, "let its clients index again")


class PoolSide(Protocol):
    """What the pool requests leave to the workspace's mode (sync.store.postgres.mode_rows):
    a server-search workspace has no pool."""

    def released(self, conn: psycopg.Connection, blobs: list[Blob]) -> int: ...
    def collect(self, conn: psycopg.Connection, grace_s: float) -> tuple[int, int]: ...


class PgPool:
    """One workspace's ref requests, each in a transaction of its own under the
    workspace's row lock (`lock`); what they do to the pool is the mode's (`side`)."""

    def __init__(self, pool: Pool, head: WorkspaceHead, options: PgOptions,
                 lock: Callable[[psycopg.Connection], None], side: PoolSide) -> None:
        self._pool, self._lock, self._side = pool, lock, side
        self.workspace_id, self.sealed = head.workspace_id, head.sealed
        self.options = options

    def refs(self) -> list[RefInfo]:
        """Every ref with a tree: id, last write, files and rows of their blobs."""
        with self._pool.connection() as conn:
            found = conn.execute(
                f"SELECT f.ref, f.synced,"
                f" (SELECT count(*) FROM {W}.nodes n WHERE n.workspace = f.workspace"
                "   AND n.ref = f.ref AND NOT n.is_dir),"
                f" (SELECT count(*) FROM {W}.nodes n JOIN {W}.rows r"
                f"   ON r.workspace = n.workspace AND r.fid = {FID.format('n.key')}"
                "   AND r.value = n.value"
                "   WHERE n.workspace = f.workspace AND n.ref = f.ref AND NOT n.is_dir)"
                f" FROM {W}.refs f WHERE f.workspace = %s ORDER BY f.ref",
                (self.workspace_id,)).fetchall()
        return [RefInfo(bytes(r), float(s), int(n), int(m)) for r, s, n, m in found]

    def drop_ref(self, ref: bytes) -> None:
        """As `WorkspaceStore.drop_ref`."""
        ref = ref_id(ref, self.sealed)
        with self._pool.connection() as conn, conn.transaction():
            self._lock(conn)
            if conn.execute(f"SELECT 1 FROM {W}.refs WHERE workspace = %s AND ref = %s",
                            (self.workspace_id, ref)).fetchone() is None:
                raise RefNotFound(f"workspace {self.workspace_id} has no ref {ref.hex()}")
            self._drop(conn, ref)

    def _drop(self, conn: psycopg.Connection, ref: bytes) -> int:
        ws = self.workspace_id
        blobs = [(fid_of(bytes(k)), bytes(v)) for k, v in conn.execute(
            f"DELETE FROM {W}.nodes WHERE workspace = %s AND ref = %s"
            " RETURNING key, CASE WHEN is_dir THEN NULL ELSE value END", (ws, ref))
            if v is not None]
        conn.execute(f"DELETE FROM {W}.refs WHERE workspace = %s AND ref = %s", (ws, ref))
        return self._side.released(conn, blobs)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        """As `WorkspaceStore.collect_garbage`: the same counts."""
        age, grace = gc_settings(max_ref_age_days, grace_s, self.options.ref_max_age_days,
                                 self.options.blob_grace_s)
        ws = self.workspace_id
        with self._pool.connection() as conn, conn.transaction():
            self._lock(conn)
            dropped = [] if age is None else [bytes(r) for (r,) in conn.execute(
                f"SELECT ref FROM {W}.refs WHERE workspace = %s AND synced < {NOW} - %s",
                (ws, age * DAY))]
            released = sum(self._drop(conn, r) for r in dropped)
            blobs, rows = self._side.collect(conn, grace)
        return {"refs": len(dropped), "blobs": blobs, "rows": rows + released}
