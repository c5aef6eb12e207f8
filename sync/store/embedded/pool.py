"""Refs and the pool of sealed file blobs in an embedded store's tree.sqlite
(docs/architecture.md, "Refs and the blob pool").

A workspace holds one Merkle tree per *ref* (a branch of a teammate, named by the client
and sent as an opaque 16-byte id). The trees share one table: a node's stored key is its
ref id followed by its node key, so the SQL of one tree (sync.store.embedded.sqlite_tree) runs
unchanged over `ref || key` and never sees another ref's nodes. Workspaces of store
format 3 had one tree: its keys get the default ref (16 zero bytes) when tree.sqlite is
migrated to format 4, in the migration's one transaction.

In a sealed workspace a file's rows belong to a *blob*, (fid, leaf value): the leaf
value is HMAC(k_tree, path, digest), so a blob is one version of one file, and every
ref whose tree holds that version points at the same rows. `blobs` lists the blobs the
pool holds (a blob of no rows is a file of no chunks) and when each was left without a
ref (`orphaned`, NULL while one points at it). Rows are written before any leaf names
their blob and deleted only once no leaf does, so no leaf value ever claims a blob the
pool lacks.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence

from sync.records import DEFAULT_REF, KEY_BYTES, RefInfo
from sync.store.core.rows import SEALED_SCHEMA, fid_of

REF_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS refs (ref BLOB PRIMARY KEY, synced REAL NOT NULL)"
    " WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS nodes_value ON nodes (value)",
)


def scoped(ref: bytes, key: bytes) -> bytes:
    """The stored key of node `key` of `ref`'s tree."""
    return ref + key


def unscoped(stored: bytes) -> bytes:
    """The node key of a stored key."""
    return bytes(stored[KEY_BYTES:])


def ref_bounds(ref: bytes) -> tuple[bytes, bytes]:
    """[low, high) of the stored keys of `ref`'s nodes."""
    return ref, ref + b"\xff" * (KEY_BYTES + 1)


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def tree_to_4(conn: sqlite3.Connection) -> None:
    """Store format 3 -> 4 of a tree.sqlite, in one transaction (crash: format 3 as it
    was, and the next open migrates again): its one tree becomes the default ref's, and
    a sealed workspace's rows name their blob, the value of their file's committed leaf
    (rows of a pending leaf, whose file the next sync sends again, are dropped)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN IMMEDIATE")
    try:
        tables = table_names(conn)
        if "nodes" in tables:
            # In Python: SQL's || would turn the keys into text.
            old = conn.execute("SELECT key, parent, value, is_dir FROM nodes"
                               " WHERE length(key) = ?", (KEY_BYTES,)).fetchall()
            conn.execute("DELETE FROM nodes WHERE length(key) = ?", (KEY_BYTES,))
            conn.executemany(
                "INSERT INTO nodes (key, parent, value, is_dir) VALUES (?, ?, ?, ?)",
                [(DEFAULT_REF + bytes(k), None if p is None else DEFAULT_REF + bytes(p), v, d)
                 for k, p, v, d in old])
            for statement in REF_SCHEMA:
                conn.execute(statement)
            if conn.execute("SELECT 1 FROM nodes LIMIT 1").fetchone():
                conn.execute("INSERT OR IGNORE INTO refs (ref, synced) VALUES (?, ?)",
                             (DEFAULT_REF, time.time()))
        if "rows" in tables:
            adopt_rows(conn)
        conn.execute("PRAGMA user_version = 4")
    except BaseException:
        if own:
            conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT")


def adopt_rows(conn: sqlite3.Connection) -> None:
    """Give rows written before the pool their blob (the caller holds a transaction)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(rows)")}
    if "value" not in columns:
        conn.execute("ALTER TABLE rows ADD COLUMN value BLOB")
    conn.execute("DROP INDEX IF EXISTS rows_fid")
    for statement in SEALED_SCHEMA:
        conn.execute(statement)
    leaves = [(fid_of(unscoped(k)), bytes(v)) for k, v in conn.execute(
        "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")]
    conn.executemany("UPDATE rows SET value = ? WHERE fid = ? AND value IS NULL",
                     [(v, f) for f, v in leaves])
    conn.execute("DELETE FROM rows WHERE value IS NULL")
    conn.executemany("INSERT OR IGNORE INTO blobs (fid, value, orphaned) VALUES (?, ?, NULL)",
                     leaves)


def touch_ref(conn: sqlite3.Connection, ref: bytes) -> None:
    conn.execute("INSERT INTO refs (ref, synced) VALUES (?, ?) ON CONFLICT (ref)"
                 " DO UPDATE SET synced = excluded.synced", (ref, time.time()))


def ref_count(conn: sqlite3.Connection) -> int:
    (n,) = conn.execute("SELECT COUNT(*) FROM nodes WHERE parent IS NULL").fetchone()
    return int(n)


def list_refs(conn: sqlite3.Connection,
              ref_rows: Callable[[sqlite3.Connection, bytes, bytes], int]) -> list[RefInfo]:
    """Every ref with a tree, by id (the caller holds a read transaction); its rows
    counted by `ref_rows` over the bounds of its stored keys (the mode's,
    sync.store.embedded.mode_rows)."""
    out = []
    for ref, synced in conn.execute("SELECT ref, synced FROM refs ORDER BY ref").fetchall():
        lo, hi = ref_bounds(bytes(ref))
        (files,) = conn.execute("SELECT COUNT(*) FROM nodes WHERE key >= ? AND key < ?"
                                " AND is_dir = 0", (lo, hi)).fetchone()
        out.append(RefInfo(bytes(ref), float(synced), int(files), ref_rows(conn, lo, hi)))
    return out


def referenced(conn: sqlite3.Connection, fid: int, value: bytes) -> bool:
    """Whether a leaf of any ref names the blob (fid, value)."""
    for (key,) in conn.execute("SELECT key FROM nodes WHERE value = ? AND is_dir = 0",
                               (value,)):
        if fid_of(unscoped(bytes(key))) == fid:
            return True
    return False


def present(conn: sqlite3.Connection, blobs: Iterable[tuple[int, bytes]]) -> set[tuple[int, bytes]]:
    """Those of `blobs` the pool holds."""
    return {b for b in blobs if conn.execute(
        "SELECT 1 FROM blobs WHERE fid = ? AND value = ?", b).fetchone()}


def release(conn: sqlite3.Connection, blobs: Iterable[tuple[int, bytes]], *, now: bool
            ) -> int:
    """Blobs a change may have left without a ref: deleted with their rows if `now`,
    otherwise marked orphaned (the GC deletes them after the grace period). Returns
    the rows deleted."""
    deleted = 0
    for fid, value in blobs:
        if referenced(conn, fid, value):
            continue
        if now:
            deleted += delete_blob(conn, fid, value)
        else:
            conn.execute("UPDATE blobs SET orphaned = ? WHERE fid = ? AND value = ?"
                         " AND orphaned IS NULL", (time.time(), fid, value))
    return deleted


def delete_blob(conn: sqlite3.Connection, fid: int, value: bytes) -> int:
    cursor = conn.execute("DELETE FROM rows WHERE fid = ? AND value = ?", (fid, value))
    conn.execute("DELETE FROM blobs WHERE fid = ? AND value = ?", (fid, value))
    return max(cursor.rowcount, 0)


def adopt(conn: sqlite3.Connection, blobs: Iterable[tuple[int, bytes]]) -> None:
    """Blobs a leaf names again: no longer orphaned."""
    conn.executemany("UPDATE blobs SET orphaned = NULL WHERE fid = ? AND value = ?",
                     list(blobs))


def collect(conn: sqlite3.Connection, grace_s: float) -> tuple[int, int]:
    """The GC's pass over the pool (the caller holds a write transaction): a blob no
    ref names is marked orphaned (a crash between an apply's steps can leave one
    unmarked), and one orphaned for longer than `grace_s` is deleted with its rows.
    Returns (blobs deleted, rows deleted)."""
    cutoff = time.time() - grace_s
    blobs = rows = 0
    for fid, value, orphaned in conn.execute(
            "SELECT fid, value, orphaned FROM blobs").fetchall():
        value = bytes(value)
        if referenced(conn, fid, value):
            if orphaned is not None:
                adopt(conn, [(fid, value)])
            continue
        if orphaned is None:
            conn.execute("UPDATE blobs SET orphaned = ? WHERE fid = ? AND value = ?",
                         (time.time(), fid, value))
        elif orphaned <= cutoff:
            rows += delete_blob(conn, fid, value)
            blobs += 1
    return blobs, rows


def fid_blobs(conn: sqlite3.Connection, fids: Iterable[int]) -> set[tuple[int, bytes]]:
    """Every blob of the files `fids` (each file's versions) the pool holds."""
    return {(f, bytes(v)) for fid in fids for f, v in conn.execute(
        "SELECT fid, value FROM blobs WHERE fid = ?", (fid,))}


def expire_orphans(conn: sqlite3.Connection, grace_s: float) -> int:
    """Delete the blobs orphaned for longer than `grace_s` (a blob is orphaned only while
    no leaf names it: step 3 of an apply adopts every blob it names); returns the rows
    deleted."""
    cutoff = time.time() - grace_s
    rows = 0
    for fid, value in conn.execute("SELECT fid, value FROM blobs WHERE orphaned <= ?",
                                   (cutoff,)).fetchall():
        rows += delete_blob(conn, fid, bytes(value))
    return rows


def stale_refs(conn: sqlite3.Connection, max_age_s: float) -> list[bytes]:
    cutoff = time.time() - max_age_s
    return [bytes(r) for (r,) in conn.execute("SELECT ref FROM refs WHERE synced < ?",
                                              (cutoff,))]


def drop_ref_nodes(conn: sqlite3.Connection, ref: bytes) -> list[tuple[int, bytes]]:
    """Delete `ref`'s tree; returns the blobs its leaves named."""
    lo, hi = ref_bounds(ref)
    blobs = [(fid_of(unscoped(bytes(k))), bytes(v)) for k, v in conn.execute(
        "SELECT key, value FROM nodes WHERE key >= ? AND key < ? AND is_dir = 0"
        " AND value IS NOT NULL", (lo, hi))]
    conn.execute("DELETE FROM nodes WHERE key >= ? AND key < ?", (lo, hi))
    conn.execute("DELETE FROM refs WHERE ref = ?", (ref,))
    return blobs


def blob_items(items: Sequence[tuple[bytes, bytes]]) -> list[tuple[int, bytes]]:
    return [(fid_of(k), v) for k, v in items]
