"""Storage of one data dir holding many workspaces: what a server keeps, and what the
embedded default keeps under a repo's `.codeveil/store/`.

Everything stored is a keyed hash or ciphertext (the client never sends anything else);
the only cleartext is each workspace's dim, model id and creation time.

Layout::

    DATA/registry.sqlite                     workspaces: id, sha256(token), dim, model id,
                                             key check, created_at, mode
    DATA/workspaces/<id>/tree.sqlite         the Merkle tree: nodes(key, parent, value,
                                             is_dir), and counters (generation, next_rid);
                                             a sealed workspace's chunk rows too:
                                             rows(rid, fid, chunk_id, meta)
    DATA/workspaces/<id>/chunks.lance/       server-search only: LanceDB table of chunk
                                             rows: rid, chunk_id, fid, vector, meta
    DATA/workspaces/<id>/writer.lock         empty; flock'ed by the writing process
    DATA/workspaces/<id>/search.index        server-search only: snapshot of the search
                                             index and its rows (sync.store.vector_index), and
                                             its generation

Crash safety. `apply` writes in three steps (see `WorkspaceStore.apply`) so that a node's
value is only ever set after the chunks it stands for are stored, and every node above
a change is pending (value NULL) before any chunk row moves. NULL never equals a client's
value, so whatever point a writer dies at, the next diff descends into what it touched.
In a sealed workspace each step is a transaction of tree.sqlite; in a server-search one
step 2 writes LanceDB.

SQLite runs in WAL mode with synchronous=FULL: each commit is fsynced before the next
step starts. With NORMAL a power cut could lose the step-1 commit (the pending marks)
while step 2's rows were kept, and an old leaf value would then claim content the store
no longer has. FULL costs one fsync per step, i.e. three per apply batch. (LanceDB's own
durability on power loss is LanceDB's; a process crash is covered fully.)

A workspace is of one of two modes (sync.records.MODES). A sealed workspace's rows hold
no vector and it has no search index: its rows are only stored and read back
(`file_rows`), and the client searches; they live in tree.sqlite, and LanceDB, pyarrow
and faiss are never imported for it. A server-search workspace ranks vectors here.
Row layout, reading rows back and removing superseded rows' bytes: sync.store.rows.
A sealed workspace written by store format 2 or before keeps its rows in LanceDB; its
first open copies them into tree.sqlite in one transaction and then removes the table
(`WorkspaceStore._move_sealed_rows`; a crash before the commit leaves the table as it
was, and the next open starts again; after it, the next open only removes the table).

Search runs on one faiss index per workspace (sync.store.vector_index): exact L2 while the
workspace is small, IVF beyond `IndexPolicy.exact_max_rows` rows, retrained as it grows.
`apply` keeps it in step. Chunk rows get their faiss ids (`rid`) from a counter in
tree.sqlite, not from their chunk ids, so two rows with the same chunk id (a client bug,
or a 64-bit prefix collision) can never remove each other from the index, and a rid
always stands for the same row: an index of any earlier state can be brought up to date
by comparing its rids with LanceDB's ("catching up"), without a rebuild.

The index and its rows are written to `search.index` now and then, with the generation
they reflect: by an apply, at most every `index_save_interval` seconds or right after a
rebuild, and on close; never while a search waits. A snapshot is only written from an
index known to equal LanceDB's rows at that generation: one built or caught up while
holding the writer lock, and kept in step by this process's own applies since. On open,
a snapshot of the current generation is used as it is; an older one is caught up; none,
or one that does not fit, means a rebuild from LanceDB. A crash between saves costs a
catch-up, never correctness.

Several processes may open the same data dir (the embedded store is used by the daemon
and by the CLI at once): writers take an flock on `writer.lock`, and every change bumps a
generation counter in tree.sqlite, which a reader compares with the one its in-memory
index was built at before it searches. Readers of tree.sqlite (the tree, a sealed
workspace's rows) read a committed snapshot while a writer writes (WAL).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import operator
import os
import secrets
import shutil
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer import sqlite_files
from indexer.formats import FormatError, check_sqlite_format
from indexer.lazy import LazyModule
from sync.records import (
    KEY_BYTES,
    MODE_SEALED,
    MODE_SERVER_SEARCH,
    MODES,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.store.checks import (
    WORKSPACE_ID_RE,
    ApplyChecks,
    Children,
    _key,
    _Update,
    _vector,
    decide_dir_values,
    dir_value_checks,
    new_workspace_id,
)
from sync.store.rows import (
    SEALED_SCHEMA,
    bounded_answer,
    checkpoint_superseded,
    file_keys,
    group_rows,
    has_sealed_rows,
    purge_superseded,
    replace_sealed_rows,
    sealed_rows_of,
    sealed_rows_scan,
    table_schema,
)
from sync.store.vector_index import (
    IndexPolicy,
    RowTable,
    SnapshotError,
    VectorIndex,
    chunk_id_array,
    pack,
    read_snapshot,
    read_snapshot_info,
    write_snapshot,
)
from sync.wire import (
    LIMITS,
    AuthError,
    BadRequest,
    Limits,
    PermissionDenied,
    SealedWorkspaceError,
    StoreCorrupt,
    StoreError,
    WorkspaceExists,
    WorkspaceNotFound,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one writing process per data dir
    fcntl = None  # type: ignore[assignment]

# faiss and pyarrow take ~90 ms to import; a sync with nothing to send needs neither.
if TYPE_CHECKING:
    import faiss
    import pyarrow as pa
else:
    faiss = LazyModule("faiss")
    pa = LazyModule("pyarrow")

__all__ = [
    "AuthError",
    "BadRequest",
    "IndexPolicy",
    "PermissionDenied",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "WorkspaceExists",
    "WorkspaceNotFound",
    "WorkspaceStore",
]

log = logging.getLogger(__name__)

TABLE = "chunks"
# Old LanceDB versions are removed at compaction once this old. Another process reading
# the table always moves to the latest version first, so a short grace period suffices.
CLEANUP_AFTER = timedelta(minutes=2)
_SQL_BATCH = 500  # bound on parameters per statement
_LANCE_IN_BATCH = 2000  # bound on values per `fid IN (...)` filter
_SCAN_BATCH = 65_536  # rows per batch when reading the table for the index
SNAPSHOT = "search.index"
# Seconds between index snapshots while applies keep coming (see `WorkspaceStore`).
DEFAULT_SAVE_INTERVAL = 60.0
# A snapshot temp file this old was left by a writer that died mid-save.
_STALE_TEMP_SECONDS = 3600.0


# -- small helpers ----------------------------------------------------------------------


TREE_ADVICE = (
    "for the embedded store run `codeveil doctor --repair` in the repo (it is rebuilt from"
    " the working tree); for a server, restore its data dir from a backup or delete this"
    " workspace's folder and let the clients index again"
)
REGISTRY_ADVICE = (
    "restore it from a backup of the data dir: it lists the workspaces and their tokens"
)


# The layout of tree.sqlite and registry.sqlite; raise it, with a migration, when either
# changes (indexer.formats). A server refuses a data dir written by a newer codeveil.
# 2: the registry records each workspace's mode (an older codeveil would take a sealed
# workspace for a server-search one, so it must refuse the data dir).
# 3: a sealed workspace's rows live in its tree.sqlite, not in LanceDB (an older codeveil
# would find no chunk table). Its rows are moved when the workspace is first opened, not
# by the format step: that needs the workspace's mode, which only the registry knows, and
# the rows table itself marks the move as done.
STORE_FORMAT = 3


def _registry_to_2(conn: sqlite3.Connection) -> None:
    """Format 1 -> 2: workspaces gain their mode; those of format 1 are server-search."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(workspaces)")}
    if columns and "mode" not in columns:  # no table yet: a new registry is created whole
        conn.execute("ALTER TABLE workspaces ADD COLUMN mode TEXT NOT NULL"
                     f" DEFAULT '{MODE_SERVER_SEARCH}'")


def _unchanged(_conn: sqlite3.Connection) -> None:
    """A format step that leaves this file as it is (the format changed another file, or
    is completed elsewhere)."""


_REGISTRY_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _registry_to_2, 2: _unchanged,
}
# Format 2 changed the registry alone; format 3's rows are moved on open (above).
_TREE_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _unchanged, 2: _unchanged,
}


def _connect(path: Path, advice: str = TREE_ADVICE,
             what: str = "a workspace's Merkle tree",
             migrations: dict[int, Callable[[sqlite3.Connection], None]] | None = None,
             ) -> sqlite3.Connection:
    # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE), never implicit.
    conn = sqlite_files.connect(path, advice, timeout=30.0, isolation_level=None,
                                check_same_thread=False)
    try:
        check_sqlite_format(conn, path, what=what, version=STORE_FORMAT, remedy=advice,
                            migrations=_TREE_MIGRATIONS if migrations is None else migrations)
    except FormatError as exc:
        conn.close()
        raise StoreCorrupt(str(exc)) from None
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # see the module docstring
    return conn


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _batched(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def fid_of(file_key: bytes) -> int:
    """The LanceDB column that groups a file's chunk rows: its key's first 8 bytes."""
    return int.from_bytes(file_key[:8], "big", signed=True)


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _lancedb() -> Any:
    """The lancedb module, imported on first use: the import takes seconds (its REST
    namespace client builds pydantic models), and a search answered from the index
    snapshot never touches LanceDB, so `codeveil search` does not pay for it."""
    if "lancedb" not in sys.modules:
        with _pydantic_builds_deferred():
            import lancedb  # noqa: F401
    return sys.modules["lancedb"]


@contextlib.contextmanager
def _pydantic_builds_deferred() -> Iterator[None]:
    """Pydantic models defined meanwhile build their validators on first use, not at
    definition: lancedb's namespace client defines some 300 (a second of its import,
    about a third) that a local table never uses. Ours and everyone else's models are
    untouched: the default is restored at once. (A pydantic without this setting is
    simply imported as it is.)"""
    try:
        from pydantic._internal import _config
    except ImportError:
        yield
        return
    defaults = getattr(_config, "config_defaults", None)
    if not isinstance(defaults, dict) or "defer_build" not in defaults:
        yield
        return
    before = defaults["defer_build"]
    defaults["defer_build"] = True
    try:
        yield
    finally:
        defaults["defer_build"] = before


LANCE_ADVICE = (
    "for the embedded store run `codeveil doctor --repair` in the repo (it is rebuilt from"
    " the working tree); for a server, restore the data dir from a backup, or delete the"
    " workspace's chunks.lance and tree.sqlite and let its clients index again"
)


@contextlib.contextmanager
def _lance_reads(table_dir: Path) -> Iterator[None]:
    """Reads of the LanceDB table: any failure (a damaged or missing data file or
    manifest; LanceDB raises RuntimeError, OSError, ValueError, or a Rust panic, which is
    a BaseException) becomes one `StoreCorrupt` naming the table and what to do."""
    try:
        yield
    except StoreError:
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise StoreCorrupt(
            f"the chunk table {table_dir} cannot be read ({type(exc).__name__}: {first});"
            f" {LANCE_ADVICE}"
        ) from exc


@contextlib.contextmanager
def _sealed_reads(tree: Path) -> Iterator[None]:
    """Reads and writes of a sealed workspace's rows table: a damaged tree.sqlite is named
    by its connection already (indexer.sqlite_files); a table or column that is missing
    becomes a `StoreCorrupt` naming the file and what to do. Other errors (a locked
    database) pass as they are."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith("no such"):
            raise
        raise StoreCorrupt(f"the chunk table of {tree} cannot be read ({exc}); {TREE_ADVICE}"
                           ) from exc


def _schema(dim: int, mode: str = MODE_SERVER_SEARCH) -> pa.Schema:
    return table_schema(dim, mode)


_COLUMNS = ["rid", "fid", "chunk_id", "meta", "vector"]


class _Scanned:
    """Chunk rows read from LanceDB, gathered as `RowTable.from_columns` takes them."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(self, batch: pa.RecordBatch, keep: np.ndarray | None = None) -> np.ndarray:
        """Take the rows of `batch` (those `keep` marks); returns their vectors."""
        if keep is not None:
            batch = batch.filter(pa.array(keep))
        rids = batch.column("rid").to_numpy()
        fids = batch.column("fid").to_numpy()
        id_offsets, ids = _binary(batch.column("chunk_id"))
        if np.any(np.diff(id_offsets) != KEY_BYTES):
            raise StoreError("a stored chunk id is not 16 bytes")
        meta_offsets, metas = _binary(batch.column("meta"))
        self._parts.append((rids, fids, ids.reshape(-1, KEY_BYTES), meta_offsets, metas))
        values = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(rids), self.dim)

    def columns(self) -> dict[str, np.ndarray]:
        parts = self._parts
        if not parts:
            return {
                "rid": np.empty(0, np.int64),
                "fid": np.empty(0, np.int64),
                "chunk_id": np.empty((0, KEY_BYTES), np.uint8),
                "meta_offsets": np.zeros(1, np.int64),
                "meta_data": np.empty(0, np.uint8),
            }
        bases = np.cumsum([0] + [int(p[3][-1]) for p in parts[:-1]])
        return {
            "rid": np.concatenate([p[0] for p in parts]),
            "fid": np.concatenate([p[1] for p in parts]),
            "chunk_id": np.concatenate([p[2] for p in parts]),
            "meta_offsets": np.concatenate(
                [np.zeros(1, np.int64)] + [p[3][1:] + b for p, b in zip(parts, bases, strict=True)]
            ),
            "meta_data": np.concatenate([p[4] for p in parts]),
        }


def _binary(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, bytes) of a binary column, without a Python object per value."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    column = column.cast(pa.large_binary())  # int64 offsets: one layout to read
    _validity, offsets_buf, data_buf = column.buffers()
    n, at = len(column), column.offset
    offsets = np.frombuffer(offsets_buf, np.int64)[at : at + n + 1] if n else np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    return offsets - offsets[0], data[offsets[0] : offsets[-1]]


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Delete temp files of snapshots whose writer died mid-save (they are large)."""
    cutoff = time.time() - _STALE_TEMP_SECONDS
    for tmp in folder.glob(f".{name}.*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()


class _RWLock:
    """Many readers or one writer: searches share the faiss index, updates swap it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            # Waiting writers go first, so a stream of searches cannot starve an apply.
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


# -- plans and records (validation: sync.store.checks) ----------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """What step 1 decided, for steps 2 and 3."""

    fids: frozenset[int]  # files whose chunk rows go
    remove: frozenset[bytes]  # nodes deleted at step 3
    first_rid: int  # rids reserved for the new rows: first_rid .. first_rid + n - 1


@dataclass(frozen=True, slots=True)
class _Record:
    workspace_id: str
    dim: int
    model_id: str
    key_check: bytes
    created_at: float
    mode: str = MODE_SERVER_SEARCH


# -- one workspace ----------------------------------------------------------------------


class WorkspaceStore(ApplyChecks):
    """The Merkle tree, chunk rows and search index of one workspace.

    Thread-safe: applies (and directory updates) are serialised by a lock, across
    processes by an flock; reads of the tree (and of a sealed workspace's rows) and
    searches run concurrently with them and with each other. Implements the operations
    of `sync.client.StoreClient`.

    `index_policy` picks and tunes the search index (sync.store.vector_index.IndexPolicy).
    `index_save_interval` bounds how often applies snapshot it; a snapshot never takes
    more than a tenth of the time either, however large the index. `build_threads` is
    the OpenMP thread count of index builds (None: all cores), which unlike a single
    search do gain from threads. `index_events` counts what happened to the index
    (built, loaded, caught_up, rebuilt, saved), for logs and tests.
    """

    def __init__(
        self,
        path: Path,
        record: _Record,
        *,
        limits: Limits = LIMITS,
        compact_every: int = 32,
        faiss_threads: int | None = 1,
        index_policy: IndexPolicy | None = None,
        index_save_interval: float = DEFAULT_SAVE_INTERVAL,
        build_threads: int | None = None,
    ) -> None:
        self.path = path
        self.faiss_threads = faiss_threads
        self.index_policy = index_policy or IndexPolicy()
        self.index_save_interval = index_save_interval
        self.build_threads = build_threads
        self.workspace_id = record.workspace_id
        self.dim = record.dim
        self.mode = record.mode
        self.sealed = record.mode == MODE_SEALED
        self.limits = limits
        self.compact_every = compact_every
        self._record = record
        self._tree_path = path / "tree.sqlite"
        self._wconn = _connect(self._tree_path)  # used under _write_lock only
        # Deleted rows' bytes are overwritten, not left in free space (sync.store.rows).
        self._wconn.execute("PRAGMA secure_delete = ON")
        _init_tree_db(self._wconn)
        self._rconn = _connect(self._tree_path)  # reads; WAL lets them run during writes
        self._rlock = threading.Lock()
        self._write_lock = threading.Lock()
        self._lock_path = path / "writer.lock"
        self._table_handle: Any = None  # opened on first use, under _write_lock only
        self._checkpoint_due = False  # the log may hold deleted rows: cut it (sealed)
        # _index and _rows change together, under _write_lock and _index_lock.write().
        self._index_lock = _RWLock()
        self._index: VectorIndex | None = None
        self._rows = RowTable()  # rid -> (chunk_id, meta); fid -> rids
        self._loaded_generation = -1
        self._index_stale = False  # may disagree with _rows: rebuild from LanceDB
        self._index_behind = False  # agrees with _rows, LanceDB may differ: catch up
        self._index_clean = False  # equals LanceDB's rows at _loaded_generation
        self._saved_generation = -1  # of the snapshot on disk, as far as we know
        self._next_save = 0.0  # time.monotonic() before which applies do not snapshot
        self.index_events: Counter[str] = Counter()
        self._applies_since_compact = 0
        self._closed = False
        if self.sealed:
            try:
                self._move_sealed_rows()
            except BaseException:
                self._rconn.close()
                self._wconn.close()
                raise

    @property
    def _table(self) -> Any:
        """The LanceDB table (callers hold _write_lock)."""
        if self._table_handle is None:
            with _lance_reads(self.path / f"{TABLE}.lance"):
                self._table_handle = _lancedb().connect(self.path).open_table(TABLE)
        return self._table_handle

    @staticmethod
    def initialize(path: Path, dim: int, mode: str = MODE_SERVER_SEARCH) -> None:
        """Create the files of a new, empty workspace."""
        path.mkdir(parents=True)
        conn = _connect(path / "tree.sqlite")
        try:
            _init_tree_db(conn)
            if mode == MODE_SEALED:
                with _transaction(conn):
                    for statement in SEALED_SCHEMA:
                        conn.execute(statement)
        finally:
            conn.close()
        if mode != MODE_SEALED:
            _lancedb().connect(path).create_table(TABLE, schema=_schema(dim, mode))
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
                with _transaction(self._wconn) as conn:
                    for statement in SEALED_SCHEMA:
                        conn.execute(statement)
                    for b in self._scan(["rid", "fid", "chunk_id", "meta"]):
                        rows = list(zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                                        b.column("chunk_id").to_pylist(),
                                        b.column("meta").to_pylist(), strict=True))
                        conn.executemany("INSERT INTO rows (rid, fid, chunk_id, meta)"
                                         " VALUES (?, ?, ?, ?)", rows)
                        moved += len(rows)
                log.info("workspace %s: %d sealed rows moved from LanceDB into %s in %.2fs",
                         self.workspace_id, moved, self._tree_path,
                         time.perf_counter() - started)
            self._table_handle = None
            try:
                shutil.rmtree(lance_dir)
            except OSError as exc:  # the rows are safe in tree.sqlite; the next open retries
                log.warning("workspace %s: could not remove %s: %s", self.workspace_id,
                            lance_dir, exc)

    # -- reads --------------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self._check_open()
        with self._rlock:
            (nodes,) = self._rconn.execute("SELECT COUNT(*) FROM nodes").fetchone()
        index: dict[str, Any] | None = None
        chunks: int | None
        if self.sealed:
            chunks = self._sealed_row_count()
        elif self._current():
            with self._index_lock.read():
                chunks = len(self._rows)
                if self._index is not None:
                    index = self._index.describe()
        else:
            # Counting must not build the index (`codeveil status` never searches). The
            # snapshot's trailer counts its rows; if it is of the current generation that
            # is the count, and LanceDB (seconds to import) is not needed.
            chunks = self._snapshot_rows()
            if chunks is None:
                chunks = self._counted_rows()
            if chunks is None:
                chunks = self._count_rows()
        assert chunks is not None
        r = self._record
        extra: dict[str, Any] = {"created_at": r.created_at, "limits": self.limits.as_dict()}
        if not self.sealed:
            extra["distance"] = "l2"
        if index is not None:
            extra["index"] = index
        return WorkspaceInfo(
            workspace_id=r.workspace_id,
            dim=r.dim,
            model_id=r.model_id,
            key_check=r.key_check,
            chunks=chunks,
            nodes=nodes,
            extra=extra,
            mode=r.mode,
        )

    def _sealed_row_count(self) -> int:
        """A sealed workspace's rows, counted in tree.sqlite (through the index on fid)."""
        with self._rlock, _sealed_reads(self._tree_path):
            (rows,) = self._rconn.execute("SELECT count(*) FROM rows").fetchone()
        return int(rows)

    def _record_row_count(self) -> None:
        """Note the table's rows at this generation, for `info` to read where the
        snapshot is not current (applies save it now and then) without LanceDB."""
        rows = int(self._table.count_rows())
        with _transaction(self._wconn) as conn:
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
            with _lance_reads(self.path / f"{TABLE}.lance"):
                return int(_lancedb().connect(self.path).open_table(TABLE).count_rows())

        try:
            return count()
        except StoreCorrupt:
            with self._flock():
                return count()

    def file_rows(self, keys: Sequence[bytes]) -> FileRows:
        """(chunk id, meta) of every row of each file of `keys`, in the order they were
        sent. A key that is not a committed leaf (unknown, pending or a directory) maps to
        []. The answer is bounded by `limits.max_row_bytes`: the keys after the bound are
        left out of it, and the caller asks for them again.

        Read so that no apply is halfway: a leaf's value and its rows are the ones one
        apply committed together. A sealed workspace's are read in one read transaction
        of tree.sqlite, concurrently with writers: an apply sets the leaves it touches
        pending before it moves their rows and their values only after, so any committed
        state pairs a value with its own rows. A server-search workspace's are read under
        the write locks."""
        self._check_open()
        wanted = file_keys(keys, self.limits)
        if not wanted:
            return {}
        if self.sealed:
            return bounded_answer(wanted, self._sealed_file_rows(wanted),
                                  self.limits.max_row_bytes)
        with self._write_lock, self._flock():
            committed = [k for k, (value, is_dir) in self._leaf_values(wanted).items()
                         if value is not None and not is_dir]
            fid_keys: dict[int, list[bytes]] = {}
            for k in committed:
                fid_keys.setdefault(fid_of(k), []).append(k)
            found = {}
            if fid_keys:
                with _lance_reads(self.path / f"{TABLE}.lance"):
                    self._table.checkout_latest()
                batches = (
                    b
                    for part in _batched(sorted(fid_keys), _LANCE_IN_BATCH)
                    for b in self._scan(["rid", "fid", "chunk_id", "meta"],
                                        where=f"fid IN ({','.join(map(str, part))})")
                )
                found = group_rows(batches, fid_keys)
        return bounded_answer(wanted, found, self.limits.max_row_bytes)

    def _sealed_file_rows(self, wanted: list[bytes]
                          ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
        """The rows of the committed leaves of `wanted`, read in one snapshot."""
        with self._rlock, _sealed_reads(self._tree_path):
            self._rconn.execute("BEGIN")
            try:
                values = self._leaf_values(wanted, self._rconn)
                fid_keys: dict[int, list[bytes]] = {}
                for k, (value, is_dir) in values.items():
                    if value is not None and not is_dir:
                        fid_keys.setdefault(fid_of(k), []).append(k)
                return sealed_rows_of(self._rconn, fid_keys) if fid_keys else {}
            finally:
                self._rconn.execute("COMMIT")

    def _leaf_values(self, keys: list[bytes], conn: sqlite3.Connection | None = None
                     ) -> dict[bytes, tuple[bytes | None, bool]]:
        """key -> (value, is_dir) of those of `keys` in the tree. Caller holds
        _write_lock (this reads on the writer's connection), or passes `conn` and holds
        what guards it."""
        out: dict[bytes, tuple[bytes | None, bool]] = {}
        for part in _batched(keys, _SQL_BATCH):
            marks = ",".join("?" * len(part))
            for k, v, is_dir in (conn or self._wconn).execute(
                f"SELECT key, value, is_dir FROM nodes WHERE key IN ({marks})", part
            ):
                out[bytes(k)] = (None if v is None else bytes(v), bool(is_dir))
        return out

    def root(self) -> NodeInfo | None:
        self._check_open()
        with self._rlock:
            rows = self._rconn.execute(
                "SELECT key, value, is_dir FROM nodes WHERE parent IS NULL ORDER BY key"
            ).fetchall()
        if len(rows) > 1:  # apply() refuses a second root; this would be a bug
            log.error("workspace %s has %d root nodes", self.workspace_id, len(rows))
        return NodeInfo(rows[0][0], rows[0][1], bool(rows[0][2])) if rows else None

    def children(self, keys: Sequence[bytes]) -> dict[bytes, list[NodeInfo]]:
        self._check_open()
        if not isinstance(keys, Sequence) or isinstance(keys, bytes | str):
            raise BadRequest("keys must be a list of keys")
        if len(keys) > self.limits.max_keys:
            raise BadRequest(
                f"too many keys: {len(keys)} > {self.limits.max_keys} per children call"
            )
        wanted = [_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
        out: dict[bytes, list[NodeInfo]] = {k: [] for k in wanted}
        unique = list(out)
        with self._rlock:
            # One read transaction: every batch sees the same snapshot.
            self._rconn.execute("BEGIN")
            try:
                for part in _batched(unique, _SQL_BATCH):
                    marks = ",".join("?" * len(part))
                    for parent, key, value, is_dir in self._rconn.execute(
                        "SELECT parent, key, value, is_dir FROM nodes"
                        f" WHERE parent IN ({marks}) ORDER BY parent, key",
                        part,
                    ):
                        out[parent].append(NodeInfo(key, value, bool(is_dir)))
            finally:
                self._rconn.execute("COMMIT")
        return out

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean distance (not squared)."""
        self._check_open()
        if self.sealed:
            raise SealedWorkspaceError(
                f"workspace {self.workspace_id} is sealed: search runs on the client"
            )
        query = _vector(vector, self.dim, "vector")[None, :]
        try:
            if isinstance(k, bool):
                raise TypeError
            k = operator.index(k)
        except TypeError:
            raise BadRequest(f"k must be an integer, got {type(k).__name__}") from None
        if not 1 <= k <= self.limits.max_k:
            raise BadRequest(f"k must be between 1 and {self.limits.max_k}, got {k}")
        self._refresh()
        self._set_faiss_threads()
        with self._index_lock.read():
            index = self._index
            if index is None or index.ntotal == 0:
                return []
            dist, ids = index.search(query, min(k, index.ntotal))
            found = [
                (d, rid) for d, rid in zip(dist[0].tolist(), ids[0].tolist(), strict=True)
                if rid >= 0
            ]
            rows = self._rows.lookup([rid for _, rid in found])
        return [
            SearchHit(chunk_id, max(d, 0.0) ** 0.5, meta)
            for (d, _), (chunk_id, meta) in zip(found, rows, strict=True)
        ]

    # -- writes -------------------------------------------------------------------------

    def apply(self, updates: Sequence[FileUpdate], deletes: Sequence[bytes]) -> None:
        """Replace the chunks and leaves of `updates`; remove the subtrees of `deletes`.

        Deletes take effect before updates, so one call can turn a file into a directory
        of the same key (delete it, upload what is now below it) or the other way round.
        A key that changes kind without being deleted is handled the same way.

        Write order, the crash-safety invariant:

        1. One SQLite transaction: create missing ancestors (`ancestors[0]` is the root),
           upsert each leaf with value NULL, set NULL the value of every node in a
           deleted subtree and of every ancestor of a touched leaf or deleted node;
           reserve rids for the new rows.
        2. Delete the rows of the updated files and of every leaf in a deleted subtree
           (`fid IN (...)`), then add the new rows. Sealed: one SQLite transaction on
           the rows table. Server-search: LanceDB, the new rows in one `add`; then
           faiss is brought into step.
        3. One SQLite transaction: set the leaf values; delete the nodes of deleted
           subtrees.
        4. If rows were deleted, their bytes leave the data dir (sync.store.rows): the
           write-ahead log is checkpointed and cut (sealed), or the table compacted and
           its older versions removed (server-search).

        A crash anywhere leaves NULL values on every path it touched, which never match
        a client value, so the next sync re-sends them; no value ever claims chunks the
        store lacks. Re-applying the same batch is harmless (rows are replaced per file).
        """
        self._check_open()
        ups, dels = self._validate_apply(updates, deletes)
        if not ups and not dels:
            return
        with self._write_lock, self._flock():
            self._prepare_write()
            plan = self._step1_mark_pending(ups, dels)
            deleted = self._step2_replace_rows(plan, ups)
            self._step3_commit(plan, ups)
            if self.sealed:
                if deleted or self._checkpoint_due:
                    self._checkpoint()
                return
            if deleted:
                self._purge(added=sum(len(u.chunk_ids) for u in ups))
            else:
                self._maybe_compact()
            self._record_row_count()
            self._maybe_rebuild()
            if self._save_due():
                self._save_index()

    def set_dir_values(self, values: Sequence[DirValue | tuple[bytes, bytes, bytes]]) -> None:
        """Set the values of existing directories, each only over the children it was
        computed from (compare-and-set); other keys are ignored.

        Each item is (key, value, children digest). A directory keeps its value unless
        its children, as stored now, digest to the one given (`children_digest`): a
        pending (NULL) child never does, and neither does a child another writer changed
        after this value was computed (two teammates syncing at once). The last writer
        therefore cannot make the tree claim its own files over another's rows. A
        directory is checked only once the values this call gives its children are set
        or refused, against the children as they are then, so the order of the values
        does not matter.
        """
        self._check_open()
        pending = dir_value_checks(values, self.limits)
        with self._write_lock, self._flock(), _transaction(self._wconn) as conn:
            pending = {k: v for k, v in pending.items() if (row := conn.execute(
                "SELECT is_dir FROM nodes WHERE key = ?", (k,)).fetchone()) and row[0]}

            def children_of(keys: list[bytes]) -> Children:
                return {k: [(bytes(c), None if v is None else bytes(v)) for c, v in conn.execute(
                    "SELECT key, value FROM nodes WHERE parent = ?", (k,))] for k in keys}

            def write(items: list[tuple[bytes, bytes]]) -> None:
                conn.executemany("UPDATE nodes SET value = ? WHERE key = ?",
                                 [(v, k) for k, v in items])

            refused = decide_dir_values(pending, children_of, write)  # sync.store.checks
        if refused:
            log.info(
                "workspace %s: %d directory values refused: computed over other children"
                " (another writer, or a pending node below)",
                self.workspace_id,
                refused,
            )

    # -- checks (`codeveil doctor`, and `codeveil index` before it reports success) -----

    def verify(self, *, deep: bool = True) -> None:
        """Raise StoreCorrupt if the chunk rows plainly cannot be read. Cheap. Sealed: the
        rows table of tree.sqlite is read (counted, through its index on fid, if `deep`);
        a damaged file is named by its connection. Server-search: with the table open
        (this process wrote or read it) and `deep`, its rows are counted and compared
        with the index's; otherwise only its files are looked at, so an index with
        nothing to send does not pay LanceDB's import (nor a server's root request the
        write lock)."""
        self._check_open()
        if self.sealed:
            if deep:
                self._sealed_row_count()
            else:
                with self._rlock, _sealed_reads(self._tree_path):
                    self._rconn.execute("SELECT rid FROM rows LIMIT 1").fetchall()
            return
        table_dir = self.path / f"{TABLE}.lance"
        with self._write_lock if deep else contextlib.nullcontext():
            if (deep and self._table_handle is not None and self._current()
                    and self._index_clean):
                with _lance_reads(table_dir):
                    self._table.checkout_latest()
                    stored = self._table.count_rows()
                if stored != len(self._rows):
                    raise StoreCorrupt(
                        f"the chunk table {table_dir} holds {stored} rows where the search"
                        f" index holds {len(self._rows)}; {LANCE_ADVICE}"
                    )
                return
        manifests = list((table_dir / "_versions").glob("*.manifest"))
        if not manifests or not any(m.stat().st_size for m in manifests):
            raise StoreCorrupt(f"the chunk table {table_dir} has no version manifest;"
                               f" {LANCE_ADVICE}")
        rows = self._snapshot_rows()
        if rows is None:
            rows = self._counted_rows()
        data = list((table_dir / "data").glob("*.lance"))
        if (rows and not data) or any(d.stat().st_size == 0 for d in data):
            raise StoreCorrupt(f"the chunk table {table_dir} lost its data files;"
                               f" {LANCE_ADVICE}")

    def check(self) -> list[str]:
        """Every problem found in this workspace's files, one line each (empty: none).

        tree.sqlite's integrity; the chunk rows read in full (every row's rid, file and
        chunk id); rids unique; every row belonging to a file of the tree; the search
        snapshot, when of the current generation, holding exactly the table's rows (a
        sealed workspace, whose rows are in tree.sqlite, has none)."""
        self._check_open()
        problems: list[str] = []
        tree = self.path / "tree.sqlite"
        bad = sqlite_files.integrity_problem(tree)
        if bad is not None:
            return [f"{tree} is corrupt ({bad}); {TREE_ADVICE}"]
        with self._rlock:
            leaves = {fid_of(bytes(k)) for (k,) in self._rconn.execute(
                "SELECT key FROM nodes WHERE is_dir = 0")}
        try:
            by_file = self.rows_by_file()
        except StoreCorrupt as exc:
            return [str(exc)]
        rids = np.concatenate([r for r, _ in by_file.values()] or [np.empty(0, np.int64)])
        if self.sealed:
            table, advice = f"the chunk table of {tree}", TREE_ADVICE
        else:
            table, advice = f"the chunk table {self.path / f'{TABLE}.lance'}", LANCE_ADVICE
        if len(np.unique(rids)) != len(rids):
            problems.append(f"{table} holds a row twice; {advice}")
        orphans = sum(len(r) for fid, (r, _) in by_file.items() if fid not in leaves)
        if orphans:
            problems.append(f"{table} holds {orphans} rows of files the tree does not have;"
                            f" {advice}")
        if self.sealed:
            return problems
        snapshot = self.path / SNAPSHOT
        try:
            info = read_snapshot_info(snapshot)
        except FileNotFoundError:
            info = None
        except (SnapshotError, OSError) as exc:
            problems.append(f"the search snapshot {snapshot} is unreadable ({exc}); it is"
                            " rebuilt from the chunk table (delete it to stop this message)")
            info = None
        if info is not None and info.get("generation") == self._generation():
            try:
                _index, rows, _ = read_snapshot(snapshot, self.index_policy)
                same = np.array_equal(np.sort(rows.rids()), np.sort(rids))
            except (SnapshotError, OSError, ValueError) as exc:
                same, rows = False, None
                problems.append(f"the search snapshot {snapshot} is unreadable ({exc})")
            if rows is not None and not same:
                problems.append(f"the search snapshot {snapshot} does not hold the chunk"
                                " table's rows; delete it (it is rebuilt from the table)")
        return problems

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every chunk row, read in full."""
        out: dict[int, tuple[list[int], list[bytes]]] = {}
        if self.sealed:
            with self._rlock, _sealed_reads(self._tree_path):
                for rid, fid, cid in sealed_rows_scan(self._rconn):
                    entry = out.setdefault(fid, ([], []))
                    entry[0].append(rid)
                    entry[1].append(cid)
            return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}
        with self._write_lock, _lance_reads(self.path / f"{TABLE}.lance"):
            self._table.checkout_latest()
            for b in self._scan(["rid", "fid", "chunk_id"]):
                for rid, fid, cid in zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                                         b.column("chunk_id").to_pylist(), strict=True):
                    entry = out.setdefault(fid, ([], []))
                    entry[0].append(rid)
                    entry[1].append(cid)
        return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot, then close."""
        if self._closed:
            return
        with self._write_lock:
            if self._index is not None and self._loaded_generation != self._saved_generation:
                with self._flock():
                    self._save_index()
            self._closed = True
            with self._index_lock.write():
                self._index = None
                self._rows = RowTable()
            with self._rlock:
                self._rconn.close()
            self._wconn.close()

    # -- apply, step by step (also called one by one by the crash tests) ------------------

    def _step1_mark_pending(self, updates: list[_Update], deletes: list[bytes]) -> _Plan:
        conn = self._wconn
        with _transaction(conn):
            shape: dict[bytes, tuple[bytes | None, bool]] = {}
            for u in updates:
                for j, key in enumerate(u.ancestors):
                    shape[key] = (u.ancestors[j - 1] if j else None, True)
                shape[u.file_key] = (u.ancestors[-1], False)
            if updates:
                roots = [r for (r,) in conn.execute("SELECT key FROM nodes WHERE parent IS NULL")]
                new_root = updates[0].ancestors[0]
                if roots and roots != [new_root]:
                    raise BadRequest(
                        "updates[0].ancestors[0] is not this workspace's root key; to"
                        " change roots, delete the old root in an apply of its own first"
                    )
            deleted = _subtree(conn, deletes)  # key -> is_dir, for nodes that exist
            existing = _rows(conn, shape)  # key -> (parent, is_dir)
            fids = {fid_of(u.file_key) for u in updates}
            fids.update(fid_of(k) for k, is_dir in deleted.items() if not is_dir)
            moved_from: set[bytes] = set()
            became_files: list[bytes] = []
            for key, (parent, is_dir) in shape.items():
                old = existing.get(key)
                if old is None:
                    continue
                if old[1] and not is_dir and key not in deleted:
                    became_files.append(key)  # its old subtree goes as if deleted
                elif is_dir and not old[1]:
                    fids.add(fid_of(key))  # a file that became a directory: drop its rows
                if old[0] != parent and old[0] is not None:
                    moved_from.add(old[0])
            below = _subtree(conn, became_files)
            fids.update(fid_of(k) for k, is_dir in below.items() if not is_dir)
            gone = set(deleted) | set(below)
            conn.executemany(
                "UPDATE nodes SET value = NULL WHERE key = ?", [(k,) for k in gone]
            )
            conn.executemany(
                "INSERT INTO nodes (key, parent, value, is_dir) VALUES (?, ?, NULL, ?)"
                " ON CONFLICT (key) DO UPDATE SET parent = excluded.parent, value = NULL,"
                " is_dir = excluded.is_dir",
                [(k, p, int(d)) for k, (p, d) in shape.items()],
            )
            seeds = [k for k in deletes if k in deleted] + sorted(moved_from)
            _mark_ancestors_pending(conn, seeds)
            n_rows = sum(len(u.chunk_ids) for u in updates)
            (first_rid,) = conn.execute(
                "UPDATE state SET value = value + ? WHERE name = 'next_rid' RETURNING value - ?",
                (n_rows, n_rows),
            ).fetchone()
            generation = _bump_generation(conn)
        self._loaded_generation = generation  # our own change: the index follows it
        return _Plan(frozenset(fids), frozenset(gone - shape.keys()), first_rid)

    def _step2_replace_rows(self, plan: _Plan, updates: list[_Update]) -> int:
        """Returns how many rows were deleted (their bytes are purged after step 3)."""
        if self.sealed:
            return self._step2_replace_sealed_rows(plan, updates)
        # Only files that have rows: a new file costs LanceDB nothing. (_prepare_write
        # made the index equal LanceDB's rows, so the row table knows every file's rows.)
        old = sorted(f for f in plan.fids if self._rows.has_file(f))
        n = sum(len(u.chunk_ids) for u in updates)
        rids = np.arange(plan.first_rid, plan.first_rid + n, dtype=np.int64)
        fids = np.repeat(
            np.array([fid_of(u.file_key) for u in updates], dtype=np.int64),
            [len(u.chunk_ids) for u in updates],
        )
        chunk_ids = [c for u in updates for c in u.chunk_ids]
        metas = [m for u in updates for m in u.metas]
        vectors = (
            np.concatenate([u.vectors for u in updates])
            if n
            else np.empty((0, self.dim), np.float32)
        )
        try:
            for part in _batched(old, _LANCE_IN_BATCH):
                self._table.delete(f"fid IN ({','.join(map(str, part))})")
            if n:
                self._table.add(
                    pa.Table.from_arrays(
                        [
                            pa.array(rids),
                            pa.array(chunk_ids, pa.binary()),
                            pa.array(fids),
                            pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), self.dim),
                            pa.array(metas, pa.binary()),
                        ],
                        schema=_schema(self.dim),
                    )
                )
        except BaseException:
            # LanceDB may hold part of the change; the index still agrees with its own
            # rows, so the next user catches it up to whatever LanceDB holds.
            self._index_behind = True
            raise
        try:
            with self._index_lock.write():
                index = self._index
                assert index is not None  # _prepare_write built it
                removed = self._rows.remove_files(old)
                index.remove(removed)
                index.add(vectors, rids)
                self._rows.append(rids, fids, chunk_id_array(chunk_ids), *pack(metas))
        except BaseException:
            self._index_stale = True  # the index and its rows may disagree now
            raise
        return len(removed)

    def _step2_replace_sealed_rows(self, plan: _Plan, updates: list[_Update]) -> int:
        # One transaction: a crash keeps all the old rows or none of them. Every touched
        # file's rows are deleted (the index on fid finds none for a new file).
        rid = plan.first_rid
        rows = []
        for u in updates:
            fid = fid_of(u.file_key)
            for cid, meta in zip(u.chunk_ids, u.metas, strict=True):
                rows.append((rid, fid, cid, meta))
                rid += 1
        with _sealed_reads(self._tree_path), _transaction(self._wconn) as conn:
            return replace_sealed_rows(conn, plan.fids, rows)

    def _step3_commit(self, plan: _Plan, updates: list[_Update]) -> None:
        with _transaction(self._wconn) as conn:
            conn.executemany(
                "UPDATE nodes SET value = ? WHERE key = ? AND is_dir = 0",
                [(u.value, u.file_key) for u in updates],
            )
            conn.executemany("DELETE FROM nodes WHERE key = ?", [(k,) for k in plan.remove])
            generation = _bump_generation(conn)
        self._loaded_generation = generation

    def _maybe_compact(self) -> None:
        # Each apply adds a LanceDB fragment and version; merging them now and then keeps
        # reads (index builds) fast and the folder small. Rows keep their rids, so the
        # faiss index is unaffected.
        self._applies_since_compact += 1
        if self._applies_since_compact < self.compact_every:
            return
        self._applies_since_compact = 0
        started = time.perf_counter()
        try:
            self._table.optimize(cleanup_older_than=CLEANUP_AFTER)
        except Exception:  # compaction is an optimisation: never fail an apply for it
            log.warning("workspace %s: compaction failed", self.workspace_id, exc_info=True)
            return
        log.debug("workspace %s: compacted in %.2fs", self.workspace_id,
                  time.perf_counter() - started)

    def _checkpoint(self) -> None:
        """After a sealed apply that deleted rows: the write-ahead log, which may hold
        their old page images, is copied into tree.sqlite and cut (sync.store.rows). If a
        reader keeps it from finishing, the next apply tries again."""
        started = time.perf_counter()
        try:
            done = checkpoint_superseded(self._wconn)
        except sqlite3.OperationalError:
            log.warning("workspace %s: checkpointing %s failed", self.workspace_id,
                        self._tree_path, exc_info=True)
            done = False
        self._checkpoint_due = not done
        if done:
            self.index_events["purged"] += 1
        log.debug("workspace %s: log checkpointed (%s) in %.3fs", self.workspace_id,
                  "done" if done else "readers left", time.perf_counter() - started)

    def _purge(self, added: int) -> None:
        """After an apply that deleted rows: their bytes leave the data dir now
        (sync.store.rows). It compacts the table too, so the count towards the next
        compaction starts again. A failure is logged: the rows are gone from the table
        already, and the next apply that deletes rows purges them too."""
        self._applies_since_compact = 0
        try:
            took = purge_superseded(self._table, added)
        except Exception:
            log.warning("workspace %s: removing superseded rows failed", self.workspace_id,
                        exc_info=True)
            return
        self.index_events["purged"] += 1
        log.debug("workspace %s: superseded rows removed in %.3fs", self.workspace_id, took)

    # -- the index --------------------------------------------------------------------

    def _generation(self) -> int:
        with self._rlock:
            (gen,) = self._rconn.execute(
                "SELECT value FROM state WHERE name = 'generation'"
            ).fetchone()
        return int(gen)

    def _current(self) -> bool:
        return (
            self._index is not None
            and not self._index_stale
            and not self._index_behind
            and self._generation() == self._loaded_generation
        )

    def _refresh(self) -> None:
        """Before a search: bring the index up to date if another process changed the
        workspace (or there is none yet)."""
        if self._current():
            return
        # An apply running in this process brings the index up to date before it writes
        # and keeps it in step as it goes; the generation it bumps is its own. Wait for it
        # only when there is no index at all yet.
        if not self._write_lock.acquire(blocking=self._index is None):
            return
        try:
            self._check_open()
            # With the writer lock the result is clean, so close() may snapshot it (a
            # search never waits for a snapshot to be written); without it (a writer is
            # busy, and a search never waits for one either) it may reflect half an
            # apply, which the generation check repairs on the next search.
            with self._flock(blocking=False) as held:
                try:
                    self._reload_if_needed(locked=held)
                    return
                except StoreCorrupt:
                    if held:
                        raise
            # Read while another process wrote: it may have removed the table version
            # being read (sync.store.rows). Read again once it is done; a failure now is
            # damage.
            with self._flock():
                self._reload_if_needed(locked=True)
        finally:
            self._write_lock.release()

    def _prepare_write(self) -> None:
        """Under the write locks: the table handle at the latest version, and the index
        equal to its rows (clean, see the module docstring). A sealed workspace has
        neither: its rows are in tree.sqlite, which every transaction reads afresh."""
        if self.sealed:
            return
        with _lance_reads(self.path / f"{TABLE}.lance"):
            self._table.checkout_latest()
        self._set_faiss_threads()  # for this thread's index updates in step 2
        self._reload_if_needed(locked=True)

    def _reload_if_needed(self, *, locked: bool) -> None:
        """Caller holds _write_lock, and the flock if `locked` (then the index ends up
        clean). Loads the snapshot if there is no index yet, catches the index up with
        LanceDB, or rebuilds it from LanceDB. New indexes are built aside and swapped in,
        so searches keep running on the old one meanwhile."""
        if self._current() and (self._index_clean or not locked):
            return
        generation = self._generation()  # before reading rows: a later change shows up
        self._set_faiss_threads()
        loaded = self._index is None and self._load_snapshot(generation)
        if loaded and self._loaded_generation == generation:
            # Saved clean at this generation, and no writer has begun since (its first
            # step would have bumped it): equal to LanceDB as it stands.
            self._index_clean = True
            self._maybe_rebuild()
            return
        with _lance_reads(self.path / f"{TABLE}.lance"):
            self._table.checkout_latest()
        if self._index is None or self._index_stale or not self._catch_up(generation):
            self._build_from_table(generation)
        self._index_clean = locked
        self._maybe_rebuild()

    def _snapshot_rows(self) -> int | None:
        """Rows in the snapshot on disk if it is of the current generation, else None."""
        try:
            info = read_snapshot_info(self.path / SNAPSHOT)
        except (FileNotFoundError, SnapshotError, OSError):
            return None
        rows = info.get("rows")
        if not isinstance(rows, int) or info.get("generation") != self._generation():
            return None
        return rows

    def _load_snapshot(self, generation: int) -> bool:
        """Install the snapshot on disk if there is one that fits this workspace."""
        path = self.path / SNAPSHOT
        started = time.perf_counter()
        try:
            info = read_snapshot_info(path)
            with self._rlock:
                (next_rid,) = self._rconn.execute(
                    "SELECT value FROM state WHERE name = 'next_rid'"
                ).fetchone()
            # A snapshot from the future (tree.sqlite restored from a backup, say) may
            # hold rids that now stand for other rows.
            if info.get("dim") != self.dim or not (
                info.get("generation", generation + 1) <= generation
                and info.get("next_rid", next_rid + 1) <= next_rid
            ):
                raise SnapshotError(f"{path} does not match the workspace's state")
            index, rows, info = read_snapshot(path, self.index_policy)
        except FileNotFoundError:
            return False
        except (SnapshotError, OSError) as exc:
            log.warning("workspace %s: ignoring the index snapshot: %s", self.workspace_id, exc)
            return False
        with self._index_lock.write():
            self._index, self._rows = index, rows
            self._loaded_generation = self._saved_generation = int(info["generation"])
            self._index_stale = self._index_behind = self._index_clean = False
        self.index_events["loaded"] += 1
        log.info(
            "workspace %s: search index (%s, %d rows, generation %d) loaded in %.2fs",
            self.workspace_id, index.kind, len(rows), info["generation"],
            time.perf_counter() - started,
        )
        return True

    def _catch_up(self, generation: int) -> bool:
        """Make the index hold exactly LanceDB's rows, by rid: a rid always stands for
        the same row, so rows are only ever missing or extra, never changed. False if
        LanceDB's rows did not add up (the caller rebuilds)."""
        started = time.perf_counter()
        index = self._index
        assert index is not None
        stored = np.sort(
            np.concatenate(
                [b.column("rid").to_numpy() for b in self._scan(["rid"])]
                or [np.empty(0, np.int64)]
            )
        )
        have = self._rows.rids()
        gone = np.setdiff1d(have, stored, assume_unique=True)
        new = np.setdiff1d(stored, have, assume_unique=True)
        added = _Scanned(self.dim)
        vectors = []
        if len(new):
            # New rows have the highest rids (the counter only grows): scan from there.
            for b in self._scan(_COLUMNS, where=f"rid >= {int(new[0])}"):
                vectors.append(added.add(b, keep=np.isin(b.column("rid").to_numpy(), new)))
        cols = added.columns()
        if len(stored) != len(np.unique(stored)) or not np.array_equal(
            np.sort(cols["rid"]), new
        ):
            log.warning("workspace %s: cannot catch the index up; rebuilding it",
                        self.workspace_id)
            return False
        with self._index_lock.write():
            try:
                index.remove(gone)
                self._rows.remove_rids(gone)
                if len(new):
                    index.add(np.concatenate(vectors), cols["rid"])
                    self._rows.append(**RowTable.from_columns(**cols).columns())  # rid order
            except BaseException:
                self._index_stale = True
                raise
            self._loaded_generation = generation
            self._index_behind = False
        self.index_events["caught_up"] += 1
        log.info(
            "workspace %s: search index caught up (-%d +%d rows) in %.2fs",
            self.workspace_id, len(gone), len(new), time.perf_counter() - started,
        )
        return True

    def _build_from_table(self, generation: int) -> None:
        """Build the index and its rows from every row in LanceDB."""
        started = time.perf_counter()
        policy = self.index_policy
        # Read into an exact index first: its storage is where an IVF build samples and
        # adds from, so LanceDB is read once, whatever the kind.
        exact = VectorIndex.exact(self.dim, policy)
        scanned = _Scanned(self.dim)
        for b in self._scan(_COLUMNS):
            vectors = scanned.add(b)
            exact.add(vectors, b.column("rid").to_numpy())
        table = RowTable.from_columns(**scanned.columns())
        index = exact
        if policy.wants_rebuild(exact, len(table)):
            with self._build_threads():
                index = exact.rebuilt(len(table))
            del exact
        with self._index_lock.write():
            self._index, self._rows = index, table
            self._loaded_generation = generation
            self._index_stale = self._index_behind = False
        self._next_save = 0.0  # that was expensive: keep it
        self.index_events["built"] += 1
        log.info(
            "workspace %s: search index (%s) built from %d rows in %.2fs",
            self.workspace_id, index.kind, len(table), time.perf_counter() - started,
        )

    def _maybe_rebuild(self) -> None:
        """Caller holds _write_lock. Switch index kind or retrain IVF cells when the
        workspace has outgrown (or shrunk below) what the index was built for."""
        index = self._index
        if index is None or self._index_stale:
            return
        rows = len(self._rows)
        if not self.index_policy.wants_rebuild(index, rows):
            return
        started = time.perf_counter()
        with self._build_threads():
            # From the index's own storage: no LanceDB read, and the same rows.
            fresh = index.rebuilt(rows)
        with self._index_lock.write():
            self._index = fresh
        self._next_save = 0.0
        self.index_events["rebuilt"] += 1
        log.info(
            "workspace %s: search index rebuilt %s -> %s for %d rows in %.2fs",
            self.workspace_id, index.kind, fresh.kind, rows, time.perf_counter() - started,
        )

    def _save_due(self) -> bool:
        return (
            self._index is not None
            and self._loaded_generation != self._saved_generation
            and time.monotonic() >= self._next_save
        )

    def _save_index(self) -> None:
        """Caller holds _write_lock and the flock. Snapshot the index if it is clean and
        current. An optimisation: a failure is logged, never raised."""
        if not (self._index_clean and self._current()):
            return
        assert self._index is not None
        started = time.perf_counter()
        try:
            with self._rlock:
                (next_rid,) = self._rconn.execute(
                    "SELECT value FROM state WHERE name = 'next_rid'"
                ).fetchone()
            _remove_stale_temps(self.path, SNAPSHOT)
            size = write_snapshot(
                self.path / SNAPSHOT,
                self._index,
                self._rows,
                {"generation": self._loaded_generation, "next_rid": int(next_rid),
                 "rows": len(self._rows)},
            )
        except Exception:
            log.warning(
                "workspace %s: could not save the search index", self.workspace_id,
                exc_info=True,
            )
            self._next_save = time.monotonic() + self.index_save_interval
            return
        took = time.perf_counter() - started
        self._saved_generation = self._loaded_generation
        self._next_save = time.monotonic() + max(self.index_save_interval, 10 * took)
        self.index_events["saved"] += 1
        log.info(
            "workspace %s: search index saved (%d rows, %.0f MB) in %.2fs",
            self.workspace_id, len(self._rows), size / 1e6, took,
        )

    def _scan(
        self, columns: list[str], where: str | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Batches of the table at the version checked out (the handle does not move
        until the next checkout_latest, so successive scans agree)."""
        with _lance_reads(self.path / f"{TABLE}.lance"):
            query = self._table.search().select(columns).limit(None)
            if where is not None:
                query = query.where(where)
            yield from query.to_batches(_SCAN_BATCH)

    # -- misc -------------------------------------------------------------------------

    def _set_faiss_threads(self) -> None:
        # OpenMP's thread count is per calling thread, and server requests run on worker
        # threads, so it is set where faiss is called, not once at start-up.
        if self.faiss_threads is not None:
            faiss.omp_set_num_threads(self.faiss_threads)

    @contextlib.contextmanager
    def _build_threads(self) -> Iterator[None]:
        faiss.omp_set_num_threads(self.build_threads or os.cpu_count() or 1)
        try:
            yield
        finally:
            self._set_faiss_threads()

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


def _init_tree_db(conn: sqlite3.Connection) -> None:
    conn.executescript(
        """
        CREATE TABLE IF NOT EXISTS nodes (
            key BLOB PRIMARY KEY,
            parent BLOB,          -- NULL for the root
            value BLOB,           -- NULL while pending
            is_dir INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS nodes_parent ON nodes (parent);
        CREATE TABLE IF NOT EXISTS state (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
            WITHOUT ROWID;
        INSERT OR IGNORE INTO state (name, value) VALUES ('generation', 0), ('next_rid', 1);
        CREATE TEMP TABLE IF NOT EXISTS seed (key BLOB PRIMARY KEY);
        """
    )


def _fill_seed(conn: sqlite3.Connection, keys: Iterable[bytes]) -> None:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS seed (key BLOB PRIMARY KEY)")
    conn.execute("DELETE FROM temp.seed")
    conn.executemany("INSERT OR IGNORE INTO temp.seed (key) VALUES (?)", [(k,) for k in keys])


def _subtree(conn: sqlite3.Connection, roots: Iterable[bytes]) -> dict[bytes, bool]:
    """Every existing node at or below `roots`: key -> is_dir."""
    roots = list(roots)
    if not roots:
        return {}
    _fill_seed(conn, roots)
    # UNION (not UNION ALL) also ends the walk should the parent links ever form a cycle.
    return {
        key: bool(is_dir)
        for key, is_dir in conn.execute(
            """
            WITH RECURSIVE sub (k) AS (
                SELECT key FROM temp.seed
                UNION
                SELECT n.key FROM nodes n JOIN sub ON n.parent = sub.k
            )
            SELECT n.key, n.is_dir FROM nodes n JOIN sub ON n.key = sub.k
            """
        )
    }


def _rows(
    conn: sqlite3.Connection, keys: Iterable[bytes]
) -> dict[bytes, tuple[bytes | None, bool]]:
    """key -> (parent, is_dir) of those of `keys` that exist."""
    _fill_seed(conn, keys)
    return {
        key: (parent, bool(is_dir))
        for key, parent, is_dir in conn.execute(
            "SELECT n.key, n.parent, n.is_dir FROM nodes n JOIN temp.seed s ON n.key = s.key"
        )
    }


def _mark_ancestors_pending(conn: sqlite3.Connection, seeds: Sequence[bytes]) -> None:
    """Set NULL the value of each seed and of every node above it."""
    if not seeds:
        return
    _fill_seed(conn, seeds)
    conn.execute(
        """
        WITH RECURSIVE up (k) AS (
            SELECT key FROM temp.seed
            UNION
            SELECT n.parent FROM nodes n JOIN up ON n.key = up.k WHERE n.parent IS NOT NULL
        )
        UPDATE nodes SET value = NULL WHERE key IN (SELECT k FROM up)
        """
    )


def _bump_generation(conn: sqlite3.Connection) -> int:
    (gen,) = conn.execute(
        "UPDATE state SET value = value + 1 WHERE name = 'generation' RETURNING value"
    ).fetchone()
    return int(gen)


# -- the data dir -----------------------------------------------------------------------


class Store:
    """All workspaces of one data dir, and their bearer tokens (kept as SHA-256 only).

    `faiss_threads` is the OpenMP thread count faiss uses in the store's calls (None
    leaves faiss's default): a single exact query gets slower, not faster, with more
    threads on a small machine (measured 34 ms with 2 threads vs 15 ms with 1 at
    100k x 384 on 2 cores, far worse when the cores are busy), and the server runs
    concurrent searches on threads of its own anyway.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        limits: Limits = LIMITS,
        compact_every: int = 32,
        faiss_threads: int | None = 1,
        index_policy: IndexPolicy | None = None,
        index_save_interval: float = DEFAULT_SAVE_INTERVAL,
        build_threads: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.limits = limits
        self.compact_every = compact_every
        self.index_policy = index_policy or IndexPolicy()
        self.index_save_interval = index_save_interval
        self.build_threads = build_threads
        (self.data_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        self.faiss_threads = faiss_threads
        self._lock = threading.RLock()  # guards the registry connection and _open
        self._registry = _connect(self.data_dir / "registry.sqlite", REGISTRY_ADVICE,
                                  "the workspace registry", _REGISTRY_MIGRATIONS)
        self._registry.executescript(
            f"""
            CREATE TABLE IF NOT EXISTS workspaces (
                id TEXT PRIMARY KEY,
                token_sha256 BLOB NOT NULL UNIQUE,
                dim INTEGER NOT NULL,
                model_id TEXT NOT NULL,
                key_check BLOB NOT NULL,
                created_at REAL NOT NULL,
                mode TEXT NOT NULL DEFAULT '{MODE_SERVER_SEARCH}'
            );
            """
        )
        self._open: dict[str, WorkspaceStore] = {}
        self._owners: dict[bytes, str] = {}  # sha256(token) -> workspace id, once seen
        self._closed = False

    def create_workspace(
        self,
        dim: int,
        model_id: str,
        key_check: bytes,
        workspace_id: str | None = None,
        *,
        mode: str = MODE_SERVER_SEARCH,
        max_workspaces: int | None = None,
    ) -> tuple[str, str]:
        """Create an empty workspace of `mode` (one of sync.records.MODES); returns
        (workspace_id, bearer token). The token is shown this once: the store keeps only
        its SHA-256. With `max_workspaces`, refuse (PermissionDenied) once the store
        holds that many."""
        workspace_id = new_workspace_id(self.limits, dim, model_id, key_check, workspace_id,
                                        mode)
        token = secrets.token_urlsafe(32)
        path = self._workspace_path(workspace_id)
        with self._lock:
            self._check_open()
            # The registry's write lock, held from the check to the insert, serialises
            # creators in other processes too.
            with _transaction(self._registry) as conn:
                taken = conn.execute("SELECT 1 FROM workspaces WHERE id = ?", (workspace_id,))
                if taken.fetchone():
                    raise WorkspaceExists(f"workspace {workspace_id} already exists")
                if max_workspaces is not None:
                    (count,) = conn.execute("SELECT count(*) FROM workspaces").fetchone()
                    if count >= max_workspaces:
                        raise PermissionDenied(
                            f"this server holds its limit of {max_workspaces} workspaces;"
                            " ask its operator for room"
                        )
                if path.exists():  # left by a create that died before registering it
                    shutil.rmtree(path)
                WorkspaceStore.initialize(path, dim, mode)
                conn.execute(
                    "INSERT INTO workspaces (id, token_sha256, dim, model_id, key_check,"
                    " created_at, mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (workspace_id, _token_hash(token), dim, model_id, key_check, time.time(),
                     mode),
                )
        log.info("created workspace %s (dim %d, %s)", workspace_id, dim, mode)
        return workspace_id, token

    def authenticate(self, workspace_id: str, token: str | None) -> None:
        """Raise unless `token` is the bearer token of `workspace_id`.

        AuthError (401) without a token or with one of no workspace; WorkspaceNotFound
        (404) for an unknown workspace, and only then, so that the existence of a
        workspace is not revealed to callers holding no valid token; PermissionDenied
        (403) for the token of another workspace.
        """
        if not token:
            raise AuthError("missing bearer token (send 'Authorization: Bearer <token>')")
        digest = _token_hash(token)
        with self._lock:
            self._check_open()
            owner = self._owner(digest)
            if owner is None:
                raise AuthError("invalid bearer token")
            record = self._record(workspace_id)  # raises WorkspaceNotFound
        if not hmac.compare_digest(owner.encode(), record.workspace_id.encode()):
            raise PermissionDenied("this token belongs to another workspace")

    def workspace(self, workspace_id: str) -> WorkspaceStore:
        """The open store of a workspace (opened on first use, then shared)."""
        with self._lock:
            self._check_open()
            ws = self._open.get(workspace_id)
            if ws is None:
                record = self._record(workspace_id)
                ws = WorkspaceStore(
                    self._workspace_path(workspace_id),
                    record,
                    limits=self.limits,
                    compact_every=self.compact_every,
                    faiss_threads=self.faiss_threads,
                    index_policy=self.index_policy,
                    index_save_interval=self.index_save_interval,
                    build_threads=self.build_threads,
                )
                self._open[workspace_id] = ws
            return ws

    def workspace_ids(self) -> list[str]:
        with self._lock:
            self._check_open()
            return [r for (r,) in self._registry.execute("SELECT id FROM workspaces ORDER BY id")]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ws in self._open.values():
                ws.close()
            self._open.clear()
            self._registry.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _workspace_path(self, workspace_id: str) -> Path:
        return self.data_dir / "workspaces" / workspace_id

    def _record(self, workspace_id: str) -> _Record:
        """Caller holds _lock."""
        if not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.match(workspace_id):
            raise WorkspaceNotFound(f"no workspace {str(workspace_id)[:80]!r}")
        row = self._registry.execute(
            "SELECT id, dim, model_id, key_check, created_at, mode FROM workspaces"
            " WHERE id = ?",
            (workspace_id,),
        ).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"no workspace {workspace_id!r}")
        if row[5] not in MODES:
            raise StoreCorrupt(f"workspace {workspace_id} has the unknown mode {row[5]!r} in"
                               f" the registry {self.data_dir / 'registry.sqlite'};"
                               f" {REGISTRY_ADVICE}")
        return _Record(row[0], int(row[1]), row[2], bytes(row[3]), float(row[4]), row[5])

    def _owner(self, digest: bytes) -> str | None:
        """Caller holds _lock."""
        owner = self._owners.get(digest)
        if owner is None:
            # Not cached: a workspace created since, possibly by another process.
            row = self._registry.execute(
                "SELECT id, token_sha256 FROM workspaces WHERE token_sha256 = ?", (digest,)
            ).fetchone()
            if row is None or not hmac.compare_digest(bytes(row[1]), digest):
                return None
            owner = self._owners[digest] = row[0]
        return owner

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.data_dir} is closed")
