"""The files of one workspace and the locks over them: its tree.sqlite (a connection to
write on, one to read on), the LanceDB table of a server-search workspace (opened on
first use), and `writer.lock`, the flock writers in any process take; creating them, and
moving a format-2 sealed workspace's rows into tree.sqlite on its first open.

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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sync.records import MODE_SEALED, MODE_SERVER_SEARCH
from sync.store.backend import WorkspaceRecord
from sync.store.lance_table import SCAN_BATCH, TABLE, import_lancedb, lance_reads
from sync.store.options import StoreOptions
from sync.store.pool import adopt_rows
from sync.store.rows import SEALED_SCHEMA, has_sealed_rows, table_schema
from sync.store.sqlite_tree import connect, init_tree_db, sealed_reads, transaction
from sync.wire import StoreCorrupt, StoreError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one writing process per data dir
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


class WorkspaceFiles:
    """A workspace's record, options, files and locks: what its search index
    (sync.store.search_index) and its store (sync.store.workspace) are built on."""

    def __init__(self, path: Path, record: WorkspaceRecord, options: StoreOptions) -> None:
        self.path = path
        self.options = options
        self.workspace_id = record.workspace_id
        self.dim = record.dim
        self.mode = record.mode
        self.sealed = record.mode == MODE_SEALED
        self.limits = options.limits
        self._record = record
        self._tree_path = path / "tree.sqlite"
        self._wconn = connect(self._tree_path)  # used under _write_lock only
        # Deleted rows' bytes are overwritten, not left in free space (sync.store.rows).
        self._wconn.execute("PRAGMA secure_delete = ON")
        init_tree_db(self._wconn)
        self._rconn = connect(self._tree_path)  # reads; WAL lets them run during writes
        self._rlock = threading.Lock()
        self._write_lock = threading.Lock()
        self._lock_path = path / "writer.lock"
        self._table_handle: Any = None  # opened on first use, under _write_lock only
        self._closed = False

    @property
    def _table(self) -> Any:
        """The LanceDB table (callers hold _write_lock)."""
        if self._table_handle is None:
            with lance_reads(self.path / f"{TABLE}.lance"):
                self._table_handle = import_lancedb().connect(self.path).open_table(TABLE)
        return self._table_handle

    @staticmethod
    def initialize(path: Path, dim: int, mode: str = MODE_SERVER_SEARCH) -> None:
        """Create the files of a new, empty workspace."""
        path.mkdir(parents=True)
        conn = connect(path / "tree.sqlite")
        try:
            init_tree_db(conn)
            if mode == MODE_SEALED:
                with transaction(conn):
                    for statement in SEALED_SCHEMA:
                        conn.execute(statement)
        finally:
            conn.close()
        if mode != MODE_SEALED:
            import_lancedb().connect(path).create_table(TABLE, schema=table_schema(dim, mode))
        (path / "writer.lock").touch()

    def _move_sealed_rows(self) -> None:
        """A sealed workspace written by store format 2 or before keeps its rows in a
        LanceDB table: copy them into tree.sqlite in one transaction, which also creates
        the rows table (its presence marks the move as done), then remove the table.
        A crash before the commit leaves the table as it was, and the next open starts
        again; one after it leaves a table that the next open only removes. So rows are
        never lost or copied twice. Only this imports lancedb for a sealed workspace."""
        lance_dir = self.path / f"{TABLE}.lance"
        if not lance_dir.exists():
            return  # the common case: a stat, no lock
        with self._write_lock, self._flock():
            if not has_sealed_rows(self._wconn):  # another process may have moved them
                started = time.perf_counter()
                moved = 0
                with transaction(self._wconn) as conn:
                    for statement in SEALED_SCHEMA:
                        conn.execute(statement)
                    for b in self._scan(["rid", "fid", "chunk_id", "meta"]):
                        rows = list(zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                                        b.column("chunk_id").to_pylist(),
                                        b.column("meta").to_pylist(), strict=True))
                        conn.executemany("INSERT INTO rows (rid, fid, chunk_id, meta)"
                                         " VALUES (?, ?, ?, ?)", rows)
                        moved += len(rows)
                    adopt_rows(conn)  # each row gets its blob (sync.store.pool)
                log.info("workspace %s: %d sealed rows moved from LanceDB into %s in %.2fs",
                         self.workspace_id, moved, self._tree_path,
                         time.perf_counter() - started)
            self._table_handle = None
            try:
                shutil.rmtree(lance_dir)
            except OSError as exc:  # the rows are safe in tree.sqlite; the next open retries
                log.warning("workspace %s: could not remove %s: %s", self.workspace_id,
                            lance_dir, exc)

    # -- reading the files ------------------------------------------------------------

    def _scan(
        self, columns: list[str], where: str | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Batches of the table at the version checked out (the handle does not move
        until the next checkout_latest, so successive scans agree)."""
        with lance_reads(self.path / f"{TABLE}.lance"):
            query = self._table.search().select(columns).limit(None)
            if where is not None:
                query = query.where(where)
            yield from query.to_batches(SCAN_BATCH)

    def _generation(self) -> int:
        with self._rlock:
            (gen,) = self._rconn.execute(
                "SELECT value FROM state WHERE name = 'generation'"
            ).fetchone()
        return int(gen)

    def _sealed_row_count(self) -> int:
        """A sealed workspace's rows, counted in tree.sqlite (through the index on fid)."""
        with self._rlock, sealed_reads(self._tree_path):
            (rows,) = self._rconn.execute("SELECT count(*) FROM rows").fetchone()
        return int(rows)

    def _record_row_count(self) -> None:
        """Note the table's rows at this generation, for `info` to read where the
        snapshot is not current (applies save it now and then) without LanceDB."""
        rows = int(self._table.count_rows())
        with transaction(self._wconn) as conn:
            (gen,) = conn.execute("SELECT value FROM state WHERE name = 'generation'").fetchone()
            conn.executemany("INSERT OR REPLACE INTO state (name, value) VALUES (?, ?)",
                             [("counted_generation", gen), ("counted_rows", rows)])

    def _counted_rows(self) -> int | None:
        """The rows noted by the last apply, if nothing was written since."""
        with self._rlock:
            noted = dict(self._rconn.execute(
                "SELECT name, value FROM state WHERE name IN"
                " ('generation', 'counted_generation', 'counted_rows')"))
        if noted.get("counted_generation") != noted.get("generation"):
            return None
        return noted.get("counted_rows")

    def _count_rows(self) -> int:
        """The table's rows, from a fresh handle (it sees the latest version whoever
        wrote it). Read without the flock, so a writer may remove the version being read
        (sync.store.rows); then it is read again under the flock, where a failure is
        damage."""
        def count() -> int:
            with lance_reads(self.path / f"{TABLE}.lance"):
                return int(import_lancedb().connect(self.path).open_table(TABLE).count_rows())

        try:
            return count()
        except StoreCorrupt:
            with self._flock():
                return count()

    # -- locks ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self, *, blocking: bool = True) -> Iterator[bool]:
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

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"workspace {self.workspace_id} is closed")
