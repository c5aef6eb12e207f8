"""A sealed workspace's rows in PostgreSQL (sync.store.core.mode_rows): a pool of blobs
shared by every ref (sync.store.postgres.pool), with no vector. Every hook that writes
runs in the caller's transaction, which holds the workspace's row lock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from sync.records import MODE_SEALED, SearchHit
from sync.store.core.checks import Update
from sync.store.core.mode_rows import SEALED_EXTRA, FoundRows, refuse_search
from sync.store.core.rows import fid_of
from sync.store.core.tree_plan import TreePlan
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.postgres.conn import Pool
from sync.store.postgres.pool import (
    adopt,
    blob_problems,
    blob_rows,
    collect,
    expire_orphans,
    fid_blobs,
    present,
    ref_count,
    release,
    replace_blob_rows,
    touch_ref,
)
from sync.store.postgres.schema import SCHEMA
from sync.store.postgres.tree import committed_rows

if TYPE_CHECKING:
    from sync.store.postgres.options import PgOptions

W = SCHEMA


class PgSealedRows:
    """The rows of a sealed workspace: the blobs of its pool."""

    def __init__(self, pool: Pool, head: WorkspaceHead, options: PgOptions) -> None:
        self._pool = pool
        self.workspace_id = head.workspace_id
        self.options = options

    def describe(self) -> dict[str, Any]:
        return dict(SEALED_EXTRA)

    def file_rows(self, wanted: list[bytes], ref: bytes) -> FoundRows:
        """The rows of the blob each committed leaf names."""
        return committed_rows(self._pool, self.workspace_id, ref, wanted,
                              "   AND r.value = n.value")

    def search(self, vector: object, k: int) -> list[SearchHit]:
        refuse_search(self.workspace_id)

    def blob_rows(self, wanted: list[tuple[bytes, bytes]], *, rows: bool) -> FoundRows:
        return blob_rows(self._pool, self.workspace_id, wanted, rows=rows)

    # -- the steps of an apply ---------------------------------------------------------

    def write(self, conn: psycopg.Connection, plan: TreePlan,
              old_blobs: set[tuple[int, bytes]], updates: list[Update]) -> None:
        """Only uploaded blobs are written; those the touched leaves named before (and
        any blob of a touched file a lost apply left unnamed) go if no ref names them,
        at once with one ref, after the grace with several."""
        ws = self.workspace_id
        replace_blob_rows(conn, ws, [u for u in updates if not u.link])
        named = {(fid_of(u.file_key), u.value) for u in updates}
        touched = old_blobs | fid_blobs(conn, ws, plan.fids)
        release(conn, ws, touched - named, now=ref_count(conn, ws) <= 1)

    def held(self, conn: psycopg.Connection, updates: list[Update]
             ) -> tuple[list[bytes], list[Update]]:
        """A link's leaf is set only over a blob the pool holds."""
        ws = self.workspace_id
        have = present(conn, ws, [(fid_of(u.file_key), u.value) for u in updates if u.link])
        lacking = {id(u) for u in updates
                   if u.link and (fid_of(u.file_key), u.value) not in have}
        return ([u.file_key for u in updates if id(u) in lacking],
                [u for u in updates if id(u) not in lacking])

    def settle(self, conn: psycopg.Connection, ref: bytes, updates: list[Update]) -> int:
        ws = self.workspace_id
        adopt(conn, ws, {(fid_of(u.file_key), u.value) for u in updates})
        released = expire_orphans(conn, ws, self.options.blob_grace_s)
        touch_ref(conn, ws, ref)
        return released

    def touch(self, conn: psycopg.Connection, ref: bytes) -> None:
        touch_ref(conn, self.workspace_id, ref)

    def after_commit(self, updates: list[Update]) -> None:
        pass

    # -- refs, the pool and checks ---------------------------------------------------------

    def released(self, conn: psycopg.Connection, blobs: list[tuple[int, bytes]]) -> int:
        """A dropped ref's blobs no ref names now: deleted if at most one ref is left,
        orphaned otherwise."""
        ws = self.workspace_id
        left = conn.execute(f"SELECT count(*) FROM {W}.refs WHERE workspace = %s",
                            (ws,)).fetchone()
        return release(conn, ws, blobs, now=left is None or left[0] <= 1)

    def collect(self, conn: psycopg.Connection, grace_s: float) -> tuple[int, int]:
        return collect(conn, self.workspace_id, grace_s)

    def problems(self, conn: psycopg.Connection, rows: int, with_vector: int) -> list[str]:
        """No row holds a vector; the pool's invariants hold."""
        found = [] if not with_vector else [
            f"workspace {self.workspace_id} ({MODE_SEALED}) holds {with_vector} of {rows}"
            " rows with a vector"]
        return found + blob_problems(conn, self.workspace_id)

    def close(self) -> None:
        pass
