"""The ref and pool operations of an embedded workspace (sync.store.embedded.pool): a pull by
blob, the refs listed and dropped, and the garbage collection (`PoolOps`, a part of
`sync.store.embedded.workspace.WorkspaceStore` built on its files); and the pool's share of a
sealed apply's steps 2 and 3 (`write_blobs`, `held_links`, `settle_blobs`), each inside
the transaction the apply opened."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sync.records import BlobRows, RefInfo
from sync.store.core.blobs import blob_answer, blob_items
from sync.store.core.checks import Update, gc_settings, ref_id
from sync.store.core.rows import blob_rows_of, fid_of, replace_blob_rows
from sync.store.embedded.pool import (
    adopt,
    collect,
    drop_ref_nodes,
    expire_orphans,
    fid_blobs,
    list_refs,
    present,
    ref_count,
    release,
    stale_refs,
    touch_ref,
    unscoped,
)
from sync.store.embedded.sqlite_tree import Plan, sealed_reads, transaction
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import BadRequest, RefNotFound

DAY = 86_400.0


class PoolOps:
    """The pool and refs requests of one workspace, on its files (sync.store.embedded.pool)."""

    def __init__(self, files: WorkspaceFiles) -> None:
        self.files = files

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        """The rows of each blob (file key, value) the pool holds, whichever ref sent
        it; the keys of those it lacks in `missing`. Bounded like `file_rows`."""
        f = self.files
        f.check_open()
        wanted = blob_items(items, f.limits)
        if not f.sealed:
            raise BadRequest("a server-search workspace has no blob pool", status=409)
        with f.rlock, sealed_reads(f.tree_path):
            f.rconn.execute("BEGIN")
            try:
                found = blob_rows_of(f.rconn, {k: (fid_of(k), v) for k, v in wanted},
                                     rows=rows)
            finally:
                f.rconn.execute("COMMIT")
        return blob_answer(wanted, found, f.limits.max_row_bytes)

    def refs(self) -> list[RefInfo]:
        """Every ref with a tree: id, last write, files and rows (`codeveil refs`)."""
        f = self.files
        f.check_open()
        with f.rlock, sealed_reads(f.tree_path):
            f.rconn.execute("BEGIN")
            try:
                return list_refs(f.rconn, f.sealed)
            finally:
                f.rconn.execute("COMMIT")

    def drop_ref(self, ref: bytes) -> None:
        """Delete `ref`'s tree; blobs it alone named are orphaned (deleted at once if no
        ref is left). RefNotFound (404) for a ref without a tree."""
        f = self.files
        f.check_open()
        ref = ref_id(ref, f.sealed)
        with f.write_lock, f.flock():
            with sealed_reads(f.tree_path), transaction(f.wconn) as conn:
                if not conn.execute("SELECT 1 FROM refs WHERE ref = ?", (ref,)).fetchone():
                    raise RefNotFound(f"workspace {f.workspace_id} has no ref {ref.hex()}")
                released = self._drop(conn, ref)
            if released:
                f.checkpoint()

    def _drop(self, conn: sqlite3.Connection, ref: bytes) -> int:
        blobs = drop_ref_nodes(conn, ref)
        if not self.files.sealed:
            return 0
        (left,) = conn.execute("SELECT COUNT(*) FROM refs").fetchone()
        return release(conn, set(blobs), now=left <= 1)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        """Drop refs not synced for `max_ref_age_days` (the store's option if None), then
        delete the blobs no ref has named for `grace_s` seconds (likewise). Returns what
        went: refs, blobs, rows."""
        f = self.files
        f.check_open()
        age, grace = gc_settings(max_ref_age_days, grace_s, f.options.ref_max_age_days,
                                 f.options.blob_grace_s)
        with f.write_lock, f.flock():
            with sealed_reads(f.tree_path), transaction(f.wconn) as conn:
                dropped = stale_refs(conn, age * DAY) if age is not None else []
                released = sum(self._drop(conn, r) for r in dropped)
                blobs, rows = collect(conn, grace) if f.sealed else (0, 0)
            if released or rows:
                f.checkpoint()
        return {"refs": len(dropped), "blobs": blobs, "rows": rows + released}


# -- a sealed apply's steps over the pool (WorkspaceStore.apply) -------------------------


def write_blobs(conn: sqlite3.Connection, plan: Plan, updates: list[Update]) -> int:
    """Step 2, sealed, in the caller's one transaction (a crash keeps all of a blob's old
    rows or none of them): the rows of each uploaded blob replaced. Only uploaded blobs
    are written; the blobs the touched leaves named before stay until step 3 (another
    ref may name them). Returns the rows deleted."""
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
    deleted = replace_blob_rows(conn, blobs)
    # The blobs the touched leaves named (step 1 set them pending), and every blob of a
    # touched file (a crash between an earlier apply's steps may have left one no leaf
    # names): those no ref names now go, as the rows of a file went before refs, or wait
    # out the grace period with several refs.
    touched = plan.old_blobs | fid_blobs(conn, plan.fids)
    return deleted + release(conn, touched - named, now=ref_count(conn) <= 1)


def held_links(conn: sqlite3.Connection, updates: list[Update]
               ) -> tuple[list[bytes], list[Update]]:
    """Step 3, sealed, before the values are set: the keys of the links whose blob the
    pool lacks (their leaves stay pending; the client sends those files), and the
    updates whose values may be set."""
    named = {(fid_of(unscoped(u.file_key)), u.value): u for u in updates}
    held = present(conn, [b for b, u in named.items() if u.link])
    lacking = {id(u) for b, u in named.items() if u.link and b not in held}
    return ([unscoped(u.file_key) for u in updates if id(u) in lacking],
            [u for u in updates if id(u) not in lacking])


def settle_blobs(conn: sqlite3.Connection, ref: bytes, updates: list[Update],
                 grace_s: float) -> int:
    """Step 3, sealed, after the values are set: the blobs the leaves name again are no
    longer orphaned, those orphaned past `grace_s` go, and `ref` is marked synced.
    Returns the rows deleted."""
    adopt(conn, {(fid_of(unscoped(u.file_key)), u.value) for u in updates})
    released = expire_orphans(conn, grace_s)
    touch_ref(conn, ref)
    return released
