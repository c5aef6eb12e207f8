"""A sealed embedded workspace's rows (sync.store.core.mode_rows): in its tree.sqlite, a
pool of blobs shared by every ref (sync.store.embedded.pool). Each step of an apply that
touches them runs inside a transaction of tree.sqlite; a link uploads no rows, and its
leaf is set only over a blob the pool holds. A workspace written by store format 2 or
before has its rows moved into tree.sqlite when it opens
(`WorkspaceFiles.move_sealed_rows`)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from sync.records import SearchHit
from sync.store.core.checks import Update, pool_problems
from sync.store.core.mode_rows import SEALED_EXTRA, FoundRows, refuse_search
from sync.store.core.rows import (
    SEALED_SCHEMA,
    blob_rows_of,
    fid_of,
    replace_blob_rows,
    rows_by_fid,
    sealed_rows_scan,
)
from sync.store.embedded.pool import (
    adopt,
    collect,
    expire_orphans,
    fid_blobs,
    present,
    ref_count,
    release,
    scoped,
    touch_ref,
    unscoped,
)
from sync.store.embedded.sqlite_tree import (
    TREE_ADVICE,
    Plan,
    connect,
    sealed_reads,
    transaction,
)
from sync.store.embedded.workspace_files import WorkspaceFiles


class SealedRows:
    """The rows of a sealed workspace, on its files."""

    def __init__(self, files: WorkspaceFiles) -> None:
        self.files = files
        files.move_sealed_rows()

    @staticmethod
    def create(path: Path, dim: int) -> None:
        """The rows table of a new workspace, in its tree.sqlite."""
        conn = connect(path / "tree.sqlite")
        try:
            with transaction(conn):
                for statement in SEALED_SCHEMA:
                    conn.execute(statement)
        finally:
            conn.close()

    def counts(self) -> tuple[int, dict[str, Any]]:
        return self.files.sealed_row_count(), dict(SEALED_EXTRA)

    def file_rows(self, wanted: list[bytes], ref: bytes) -> FoundRows:
        """The rows of the blobs the committed leaves of `wanted` (in `ref`'s tree)
        name, read in one read transaction of tree.sqlite, concurrently with writers: an
        apply sets the leaves it touches pending before it moves their rows and their
        values only after, so any committed state pairs a value with its own rows."""
        files = self.files
        with files.rlock, sealed_reads(files.tree_path):
            files.rconn.execute("BEGIN")
            try:
                values = files.leaf_values([scoped(ref, k) for k in wanted], files.rconn)
                blobs = {unscoped(k): (fid_of(unscoped(k)), value)
                         for k, (value, is_dir) in values.items()
                         if value is not None and not is_dir}
                return blob_rows_of(files.rconn, blobs) if blobs else {}
            finally:
                files.rconn.execute("COMMIT")

    def search(self, vector: object, k: int) -> list[SearchHit]:
        refuse_search(self.files.workspace_id)

    def blob_rows(self, wanted: list[tuple[bytes, bytes]], *, rows: bool) -> FoundRows:
        """Read in one snapshot, whichever ref sent each blob."""
        f = self.files
        with f.rlock, sealed_reads(f.tree_path):
            f.rconn.execute("BEGIN")
            try:
                return blob_rows_of(f.rconn, {k: (fid_of(k), v) for k, v in wanted},
                                    rows=rows)
            finally:
                f.rconn.execute("COMMIT")

    # -- the steps of an apply ---------------------------------------------------------

    def prepare_write(self) -> None:
        pass  # nothing kept in memory

    def follow(self, generation: int) -> None:
        pass

    def write(self, plan: Plan, updates: list[Update]) -> int:
        """Step 2 in one transaction of tree.sqlite (a crash keeps all of a blob's old
        rows or none of them): the rows of each uploaded blob replaced. Only uploaded
        blobs are written; the blobs the touched leaves named before stay until step 3
        (another ref may name them)."""
        with sealed_reads(self.files.tree_path), transaction(self.files.wconn) as conn:
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
            # The blobs the touched leaves named (step 1 set them pending), and every blob
            # of a touched file (a crash between an earlier apply's steps may have left one
            # no leaf names): those no ref names now go, as the rows of a file went before
            # refs, or wait out the grace period with several refs.
            touched = plan.old_blobs | fid_blobs(conn, plan.fids)
            return deleted + release(conn, touched - named, now=ref_count(conn) <= 1)

    def statements(self) -> contextlib.AbstractContextManager[None]:
        return sealed_reads(self.files.tree_path)

    def held(self, conn: sqlite3.Connection, updates: list[Update]
             ) -> tuple[list[bytes], list[Update]]:
        named = {(fid_of(unscoped(u.file_key)), u.value): u for u in updates}
        have = present(conn, [b for b, u in named.items() if u.link])
        lacking = {id(u) for b, u in named.items() if u.link and b not in have}
        return ([unscoped(u.file_key) for u in updates if id(u) in lacking],
                [u for u in updates if id(u) not in lacking])

    def settle(self, conn: sqlite3.Connection, ref: bytes, updates: list[Update]) -> int:
        """The blobs the leaves name again are no longer orphaned, those orphaned past
        the grace period go, and `ref` is marked synced; returns the rows deleted."""
        adopt(conn, {(fid_of(unscoped(u.file_key)), u.value) for u in updates})
        released = expire_orphans(conn, self.files.options.blob_grace_s)
        touch_ref(conn, ref)
        return released

    def touch(self, conn: sqlite3.Connection, ref: bytes) -> None:
        touch_ref(conn, ref)

    def purge(self, deleted: int, added: int) -> None:
        """The write-ahead log checkpointed and cut (sync.store.core.rows), or again
        after a reader kept an earlier cut from finishing."""
        if deleted or self.files.checkpoint_due:
            self.files.checkpoint()

    # -- refs and the pool ---------------------------------------------------------------

    def ref_rows(self, conn: sqlite3.Connection, lo: bytes, hi: bytes) -> int:
        rows = 0
        for k, v in conn.execute("SELECT key, value FROM nodes WHERE key >= ? AND key < ?"
                                 " AND is_dir = 0 AND value IS NOT NULL", (lo, hi)):
            (n,) = conn.execute("SELECT COUNT(*) FROM rows WHERE fid = ? AND value = ?",
                                (fid_of(unscoped(bytes(k))), v)).fetchone()
            rows += int(n)
        return rows

    def released(self, conn: sqlite3.Connection, blobs: list[tuple[int, bytes]]) -> int:
        (left,) = conn.execute("SELECT COUNT(*) FROM refs").fetchone()
        return release(conn, set(blobs), now=left <= 1)

    def collect(self, conn: sqlite3.Connection, grace_s: float) -> tuple[int, int]:
        return collect(conn, grace_s)

    # -- checks --------------------------------------------------------------------------

    def verify(self, *, deep: bool) -> None:
        """The rows table of tree.sqlite read (counted, through its index on fid, if
        `deep`); a damaged file is named by its connection."""
        files = self.files
        if deep:
            files.sealed_row_count()
            return
        with files.rlock, sealed_reads(files.tree_path):
            files.rconn.execute("SELECT rid FROM rows LIMIT 1").fetchall()

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        files = self.files
        with files.rlock, sealed_reads(files.tree_path):
            return rows_by_fid(sealed_rows_scan(files.rconn))

    def table(self) -> tuple[str, str]:
        return f"the chunk table of {self.files.tree_path}", TREE_ADVICE

    def pooled_fids(self) -> set[int]:
        with self.files.rlock:
            return {f for (f,) in self.files.rconn.execute("SELECT fid FROM blobs")}

    def problems(self, rids: np.ndarray) -> list[str]:
        """The pool's invariants (sync.store.embedded.pool): every row of a listed blob,
        every committed leaf naming a blob the pool holds."""
        files = self.files
        with files.rlock, sealed_reads(files.tree_path):
            (loose,) = files.rconn.execute(
                "SELECT COUNT(*) FROM rows r WHERE NOT EXISTS (SELECT 1 FROM blobs b"
                " WHERE b.fid = r.fid AND b.value = r.value)").fetchone()
            lacking = sum(1 for k, v in files.rconn.execute(
                "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")
                if files.rconn.execute("SELECT 1 FROM blobs WHERE fid = ? AND value = ?",
                                       (fid_of(unscoped(bytes(k))), v)).fetchone() is None)
        table, advice = self.table()
        return pool_problems(table, loose, lacking, advice)

    def close(self) -> None:
        pass
