"""The SQL of one ref's Merkle tree in PostgreSQL (sync.store.postgres.workspace): the reads the
tree plan takes (sync.store.core.tree_plan) and the writes of an apply's first and last
steps, each inside the caller's transaction, which holds the workspace's row lock.

A node is (workspace, ref, key): every statement here names its ref, so two refs never
see each other's nodes and the write order and compare-and-set hold per ref, as in the
embedded store's `ref || key` (sync.store.embedded.pool).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from sync.store.core.checks import Update
from sync.store.core.rows import fid_bounds, fid_of
from sync.store.core.tree_plan import TreePlan, plan_tree
from sync.store.postgres.conn import Pool
from sync.store.postgres.schema import SCHEMA

W = SCHEMA


class PgTreeReads:
    """What the tree plan reads of `ref`'s tree (sync.store.core.tree_plan.TreeReads)."""

    def __init__(self, conn: psycopg.Connection, ws: str, ref: bytes) -> None:
        self.conn, self.ws, self.ref = conn, ws, ref

    def roots(self) -> list[bytes]:
        return [bytes(r) for (r,) in self.conn.execute(
            f"SELECT key FROM {W}.nodes WHERE workspace = %s AND ref = %s"
            " AND parent IS NULL", (self.ws, self.ref))]

    def subtree(self, roots: Sequence[bytes]) -> dict[bytes, bool]:
        return subtree(self.conn, self.ws, self.ref, roots)

    def existing(self, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes | None, bool]]:
        return {bytes(key): (None if parent is None else bytes(parent), is_dir)
                for key, parent, is_dir in self.conn.execute(
                    f"SELECT key, parent, is_dir FROM {W}.nodes WHERE workspace = %s"
                    " AND ref = %s AND key = ANY(%s::bytea[])", (self.ws, self.ref, list(keys)))}

    def near(self, file_keys: Sequence[bytes]) -> list[bytes]:
        bounds = [fid_bounds(k) for k in file_keys]
        return [bytes(k) for (k,) in self.conn.execute(
            "SELECT n.key FROM unnest(%s::bytea[], %s::bytea[]) AS b (lo, hi)"
            f" JOIN {W}.nodes n ON n.workspace = %s AND n.ref = %s"
            "  AND n.key >= b.lo AND n.key < b.hi",
            ([lo for lo, _ in bounds], [hi for _, hi in bounds], self.ws, self.ref))]


def mark_pending(conn: psycopg.Connection, ws: str, ref: bytes, updates: list[Update],
                 deletes: list[bytes]) -> tuple[TreePlan, set[tuple[int, bytes]]]:
    """Step 1 of `PgWorkspace.apply`: the plan written (its nodes pending), and the blobs
    (fid, value) the touched leaves named before it, which may be left without a ref."""
    plan = plan_tree(updates, deletes, PgTreeReads(conn, ws, ref))
    old_blobs = leaf_blobs(conn, ws, ref, [*plan.gone, *plan.replaced])
    conn.execute(f"UPDATE {W}.nodes SET value = NULL WHERE workspace = %s AND ref = %s"
                 " AND key = ANY(%s::bytea[])", (ws, ref, sorted(plan.gone)))
    shape = plan.shape
    conn.execute(
        f"INSERT INTO {W}.nodes (workspace, ref, key, parent, value, is_dir)"
        " SELECT %s, %s, k, p, NULL, d"
        " FROM unnest(%s::bytea[], %s::bytea[], %s::boolean[]) AS s (k, p, d)"
        " ON CONFLICT (workspace, ref, key) DO UPDATE SET parent = excluded.parent,"
        " value = NULL, is_dir = excluded.is_dir",
        (ws, ref, list(shape), [p for p, _ in shape.values()], [d for _, d in shape.values()]),
    )
    if plan.seeds:
        conn.execute(
            f"WITH RECURSIVE up (k) AS (SELECT unnest(%s::bytea[]) UNION"
            f" SELECT n.parent FROM {W}.nodes n JOIN up ON n.workspace = %s AND n.ref = %s"
            "  AND n.key = up.k WHERE n.parent IS NOT NULL)"
            f" UPDATE {W}.nodes SET value = NULL WHERE workspace = %s AND ref = %s"
            "  AND key IN (SELECT k FROM up)",
            (list(plan.seeds), ws, ref, ws, ref),
        )
    return plan, old_blobs


def commit_values(conn: psycopg.Connection, ws: str, ref: bytes, updates: list[Update],
                  remove: frozenset[bytes]) -> None:
    """Step 3 of `PgWorkspace.apply`: the leaf values set, the nodes of deleted subtrees
    deleted."""
    conn.execute(
        f"UPDATE {W}.nodes n SET value = u.value"
        " FROM unnest(%s::bytea[], %s::bytea[]) AS u (key, value)"
        " WHERE n.workspace = %s AND n.ref = %s AND n.key = u.key AND NOT n.is_dir",
        ([u.file_key for u in updates], [u.value for u in updates], ws, ref),
    )
    conn.execute(f"DELETE FROM {W}.nodes WHERE workspace = %s AND ref = %s"
                 " AND key = ANY(%s::bytea[])", (ws, ref, sorted(remove)))


def leaf_blobs(conn: psycopg.Connection, ws: str, ref: bytes, keys: Sequence[bytes]
               ) -> set[tuple[int, bytes]]:
    """The blobs (fid, value) the committed leaves among `keys` name."""
    if not keys:
        return set()
    return {(fid_of(bytes(k)), bytes(v)) for k, v in conn.execute(
        f"SELECT key, value FROM {W}.nodes WHERE workspace = %s AND ref = %s"
        " AND key = ANY(%s::bytea[]) AND NOT is_dir AND value IS NOT NULL",
        (ws, ref, list(keys)))}


def subtree(conn: psycopg.Connection, ws: str, ref: bytes, roots: Sequence[bytes]
            ) -> dict[bytes, bool]:
    """Every existing node of `ref`'s tree at or below `roots`: key -> is_dir."""
    if not roots:
        return {}
    # UNION (not UNION ALL) also ends the walk should the parent links ever form a cycle.
    return {bytes(key): is_dir for key, is_dir in conn.execute(
        f"WITH RECURSIVE sub (k) AS (SELECT unnest(%s::bytea[]) UNION"
        f" SELECT n.key FROM {W}.nodes n JOIN sub ON n.workspace = %s AND n.ref = %s"
        "  AND n.parent = sub.k)"
        f" SELECT n.key, n.is_dir FROM {W}.nodes n JOIN sub ON n.workspace = %s"
        "  AND n.ref = %s AND n.key = sub.k",
        (list(roots), ws, ref, ws, ref))}


def committed_rows(pool: Pool, ws: str, ref: bytes, wanted: list[bytes], match: str = ""
                   ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """(rid, chunk id, meta) of the rows of each key of `wanted` whose leaf in `ref`'s
    tree is committed, in one statement: one committed state. `match` narrows the rows
    joined to a leaf `n` (a sealed workspace's: those of the blob it names)."""
    with pool.connection() as conn:
        rows = conn.execute(
            f"SELECT w.key, r.rid, r.chunk_id, r.meta"
            f" FROM unnest(%s::bytea[], %s::bigint[]) AS w (key, fid)"
            f" JOIN {W}.nodes n ON n.workspace = %s AND n.ref = %s AND n.key = w.key"
            "   AND n.value IS NOT NULL AND NOT n.is_dir"
            f" JOIN {W}.rows r ON r.workspace = %s AND r.fid = w.fid" + match,
            (wanted, [fid_of(k) for k in wanted], ws, ref, ws),
        ).fetchall()
    found: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
    for key, rid, cid, meta in rows:
        found.setdefault(key, []).append((rid, cid, meta))
    return found
