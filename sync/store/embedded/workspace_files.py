"""The files of one workspace and the locks over them: its tree.sqlite (a connection to
write on, one to read on), `writer.lock`, the flock writers in any process take, and
the write-ahead log's cut after rows were deleted; creating them, and moving a format-2
sealed workspace's rows into tree.sqlite on its first open. Every other part of a
workspace (sync.store.embedded.workspace) holds this one and reads its record, options and
locks here.

Several processes may open the same data dir (the embedded store is used by the daemon
and by the CLI at once): writers take an flock on `writer.lock`, and every change bumps a
generation counter in tree.sqlite, which a reader compares with the one its in-memory
index was built at before it searches. Readers of tree.sqlite (the tree, a sealed
workspace's rows) read a committed snapshot while a writer writes (WAL).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from sync.store.core.rows import SEALED_SCHEMA, checkpoint_superseded, has_sealed_rows
from sync.store.core.workspace_head import WorkspaceHead
from sync.store.embedded.lance_table import TABLE, open_table, scan_table
from sync.store.embedded.options import StoreOptions
from sync.store.embedded.pool import adopt_rows
from sync.store.embedded.sqlite_tree import (
    SQL_BATCH,
    batched,
    connect,
    init_tree_db,
    sealed_reads,
    transaction,
)
from sync.wire import StoreError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one writing process per data dir
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class WorkspaceFiles:
    """A workspace's record, options, tree.sqlite connections and locks.

    `wconn` is used under `write_lock` only, `rconn` under `rlock`; writers also hold
    `flock()`. `events` counts what happened to the rows and the search index (built,
    loaded, caught_up, rebuilt, saved, purged), where it happened, for logs and tests."""

    def __init__(self, path: Path, head: WorkspaceHead, options: StoreOptions) -> None:
        self.path = path
        self.options = options
        self.head = head  # the record and limits, as the workspace holds them
        self.workspace_id = head.workspace_id
        self.dim = head.dim
        self.limits = head.limits
        self.tree_path = path / "tree.sqlite"
        self.wconn = connect(self.tree_path)
        # Deleted rows' bytes are overwritten, not left in free space (sync.store.core.rows).
        self.wconn.execute("PRAGMA secure_delete = ON")
        init_tree_db(self.wconn)
        self.rconn = connect(self.tree_path)  # reads; WAL lets them run during writes
        self.rlock = threading.Lock()
        self.write_lock = threading.Lock()
        self.events: Counter[str] = Counter()
        self.checkpoint_due = False  # the log may hold deleted rows: cut it (sealed)
        self.closed = False
        self._lock_path = path / "writer.lock"

    @staticmethod
    def initialize(path: Path) -> None:
        """Create the files every new, empty workspace has: an empty tree and the
        writers' lock file (its mode's rows add theirs, sync.store.embedded.mode_rows)."""
        path.mkdir(parents=True)
        conn = connect(path / "tree.sqlite")
        try:
            init_tree_db(conn)
        finally:
            conn.close()
        (path / "writer.lock").touch()

    def move_sealed_rows(self) -> None:
        """A sealed workspace written by store format 2 or before keeps its rows in a
        LanceDB table: copy them into tree.sqlite in one transaction, which also creates
        the rows table (its presence marks the move as done), then remove the table.
        A crash before the commit leaves the table as it was, and the next open starts
        again; one after it leaves a table that the next open only removes. So rows are
        never lost or copied twice. Only this imports lancedb for a sealed workspace."""
        lance_dir = self.path / f"{TABLE}.lance"
        if not lance_dir.exists():
            return  # the common case: a stat, no lock
        with self.write_lock, self.flock():
            if not has_sealed_rows(self.wconn):  # another process may have moved them
                started = time.perf_counter()
                moved = 0
                table = open_table(self.path)
                with transaction(self.wconn) as conn:
                    for statement in SEALED_SCHEMA:
                        conn.execute(statement)
                    for b in scan_table(table, lance_dir, ["rid", "fid", "chunk_id", "meta"]):
                        rows = list(zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                                        b.column("chunk_id").to_pylist(),
                                        b.column("meta").to_pylist(), strict=True))
                        conn.executemany("INSERT INTO rows (rid, fid, chunk_id, meta)"
                                         " VALUES (?, ?, ?, ?)", rows)
                        moved += len(rows)
                    adopt_rows(conn)  # each row gets its blob (sync.store.embedded.pool)
                log.info("workspace %s: %d sealed rows moved from LanceDB into %s in %.2fs",
                         self.workspace_id, moved, self.tree_path,
                         time.perf_counter() - started)
            try:
                shutil.rmtree(lance_dir)
            except OSError as exc:  # the rows are safe in tree.sqlite; the next open retries
                log.warning("workspace %s: could not remove %s: %s", self.workspace_id,
                            lance_dir, exc)

    # -- reading tree.sqlite ----------------------------------------------------------

    def generation(self) -> int:
        with self.rlock:
            (gen,) = self.rconn.execute(
                "SELECT value FROM state WHERE name = 'generation'"
            ).fetchone()
        return int(gen)

    def next_rid(self) -> int:
        with self.rlock:
            (rid,) = self.rconn.execute(
                "SELECT value FROM state WHERE name = 'next_rid'"
            ).fetchone()
        return int(rid)

    def leaf_values(self, keys: list[bytes], conn: sqlite3.Connection | None = None
                    ) -> dict[bytes, tuple[bytes | None, bool]]:
        """key -> (value, is_dir) of those of `keys` in the tree. Caller holds
        write_lock (this reads on the writer's connection), or passes `conn` and holds
        what guards it."""
        out: dict[bytes, tuple[bytes | None, bool]] = {}
        for part in batched(keys, SQL_BATCH):
            marks = ",".join("?" * len(part))
            for k, v, is_dir in (conn or self.wconn).execute(
                f"SELECT key, value, is_dir FROM nodes WHERE key IN ({marks})", part
            ):
                out[bytes(k)] = (None if v is None else bytes(v), bool(is_dir))
        return out

    def sealed_row_count(self) -> int:
        """A sealed workspace's rows, counted in tree.sqlite (through the index on fid)."""
        with self.rlock, sealed_reads(self.tree_path):
            (rows,) = self.rconn.execute("SELECT count(*) FROM rows").fetchone()
        return int(rows)

    # -- the write-ahead log ----------------------------------------------------------

    def checkpoint(self) -> None:
        """After a sealed write that deleted rows (caller holds write_lock): the
        write-ahead log, which may hold their old page images, is copied into tree.sqlite
        and cut (sync.store.core.rows). If a reader keeps it from finishing, the next apply
        tries again (`checkpoint_due`)."""
        started = time.perf_counter()
        try:
            done = checkpoint_superseded(self.wconn)
        except sqlite3.OperationalError:
            log.warning("workspace %s: checkpointing %s failed", self.workspace_id,
                        self.tree_path, exc_info=True)
            done = False
        self.checkpoint_due = not done
        if done:
            self.events["purged"] += 1
        log.debug("workspace %s: log checkpointed (%s) in %.3fs", self.workspace_id,
                  "done" if done else "readers left", time.perf_counter() - started)

    # -- locks ------------------------------------------------------------------------

    @contextlib.contextmanager
    def flock(self, *, blocking: bool = True) -> Iterator[bool]:
        """Excludes writers in other processes; yields whether the lock is held (always,
        when blocking). Opened per write, so an idle store holds no descriptor; closing
        the file releases the lock even if the process dies."""
        if fcntl is None:
            yield True
            return
        with open(self._lock_path, "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def check_open(self) -> None:
        if self.closed:
            raise StoreError(f"workspace {self.workspace_id} is closed")

    def close(self) -> None:
        """Mark closed and close the connections (caller holds write_lock)."""
        self.closed = True
        with self.rlock:
            self.rconn.close()
        self.wconn.close()
