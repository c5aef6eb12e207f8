"""The ref and pool requests of an embedded workspace (sync.store.embedded.pool): the refs
listed and dropped, and the garbage collection (`PoolOps`, a part of
`sync.store.embedded.workspace.WorkspaceStore` built on its files). What the pool does in
each is its mode's (sync.store.embedded.mode_rows): a server-search workspace has none."""

from __future__ import annotations

import sqlite3

from sync.records import RefInfo
from sync.store.core.checks import gc_settings, ref_id
from sync.store.embedded.mode_rows import EmbeddedRows
from sync.store.embedded.pool import drop_ref_nodes, list_refs, stale_refs
from sync.store.embedded.sqlite_tree import sealed_reads, transaction
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import RefNotFound

DAY = 86_400.0


class PoolOps:
    """The refs requests of one workspace, on its files and its mode's rows."""

    def __init__(self, files: WorkspaceFiles, rows: EmbeddedRows) -> None:
        self.files = files
        self.rows = rows

    def refs(self) -> list[RefInfo]:
        """Every ref with a tree: id, last write, files and rows (`codeveil refs`)."""
        f = self.files
        f.check_open()
        with f.rlock, sealed_reads(f.tree_path):
            f.rconn.execute("BEGIN")
            try:
                return list_refs(f.rconn, self.rows.ref_rows)
            finally:
                f.rconn.execute("COMMIT")

    def drop_ref(self, ref: bytes) -> None:
        """Delete `ref`'s tree; blobs it alone named are orphaned (deleted at once if no
        ref is left). RefNotFound (404) for a ref without a tree."""
        f = self.files
        f.check_open()
        ref = ref_id(ref, f.head.sealed)
        with f.write_lock, f.flock():
            with sealed_reads(f.tree_path), transaction(f.wconn) as conn:
                if not conn.execute("SELECT 1 FROM refs WHERE ref = ?", (ref,)).fetchone():
                    raise RefNotFound(f"workspace {f.workspace_id} has no ref {ref.hex()}")
                released = self._drop(conn, ref)
            if released:
                f.checkpoint()

    def _drop(self, conn: sqlite3.Connection, ref: bytes) -> int:
        return self.rows.released(conn, drop_ref_nodes(conn, ref))

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
                blobs, rows = self.rows.collect(conn, grace)
            if released or rows:
                f.checkpoint()
        return {"refs": len(dropped), "blobs": blobs, "rows": rows + released}
