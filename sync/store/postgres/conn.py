"""Connections to the PostgreSQL store's database, and rows in PostgreSQL's binary COPY
format: the plumbing under sync.store.postgres.

Connections are kept per process in a lock-protected list (autocommit; callers open
explicit transactions); one the database has ended while it sat idle (a restart) is
dropped when taken, not used. A database that cannot be reached, or that drops a
connection, is a `StoreUnavailable` (503) naming it with its password masked.
"""

from __future__ import annotations

import contextlib
import select
import struct
import threading
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import psycopg
from psycopg import conninfo

from sync.store.core.checks import Update
from sync.store.core.rows import fid_of
from sync.store.db_url import mask_url
from sync.wire import StoreError, StoreUnavailable

CONNECT_TIMEOUT = 10  # seconds; a replica answers 503 rather than hang on a dead database
DEFAULT_POOL_SIZE = 8  # idle connections kept per process


class Pool:
    """Connections to one database, reused across calls; any number may be open at
    once, at most `size` are kept idle."""

    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.where = mask_url(url)
        self.size = size
        try:
            self._password = conninfo.conninfo_to_dict(url).get("password") or None
        except psycopg.ProgrammingError as exc:
            raise StoreUnavailable(f"{self.where} is not a valid database URL ({exc})") from None
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if self._password:
            message = message.replace(str(self._password), "***")
        return StoreUnavailable(f"the database {self.where} is unavailable ({message});"
                                " check that it runs and this replica may connect to it")

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError(f"the store at {self.where} is closed")
            conn = self._idle.pop() if self._idle else None
        while conn is not None and not _alive(conn):
            conn.close()
            with self._lock:
                conn = self._idle.pop() if self._idle else None
        if conn is None:
            try:
                conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
            except psycopg.OperationalError as exc:
                raise self._unavailable(exc) from None
        try:
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            conn.close()
            # A dropped connection usually means a restarted or failed-over database,
            # which dropped the idle ones too: let the next requests connect afresh
            # rather than each find a dead connection and answer 503.
            self._drop_idle()
            raise self._unavailable(exc) from None
        except BaseException:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.close()
            self._put(conn)
            raise
        self._put(conn)

    def _put(self, conn: psycopg.Connection) -> None:
        if conn.closed:
            return
        with self._lock:
            if not self._closed and len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _alive(conn: psycopg.Connection) -> bool:
    """Whether an idle connection can still be used, without a round trip: a database
    that ended it (restarted, crashed, or terminated the backend) closed its socket or
    sent a last error, so the socket reads; a healthy idle connection has nothing to
    read (no query is outstanding, and nothing here listens for notifications)."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


# -- rows in PostgreSQL's binary COPY format ------------------------------------------------

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)


def _field(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def sealed_copy_rows(workspace: str, updates: list[Update]) -> bytes:
    """The new rows of a sealed workspace's `updates` for `COPY rows (workspace, fid,
    chunk_id, meta, vector, value) FROM STDIN (FORMAT BINARY)`: no vector, and the
    blob's value (the leaf's)."""
    return _copy_rows(workspace, ((u, lambda _j: _NULL, _field(u.value)) for u in updates))


def search_copy_rows(workspace: str, updates: list[Update], dim: int) -> bytes:
    """As `sealed_copy_rows` for a server-search workspace: exact float32 vectors
    (pgvector's binary form is a dim, a reserved int16 and big-endian float32s), and no
    float-to-text round trip; no value."""
    vector_head = struct.pack(">ihh", 4 + 4 * dim, dim, 0)  # field length, dim, reserved

    def vectors(u: Update) -> Callable[[int], bytes]:
        rows = np.asarray(u.vectors, dtype=">f4")
        return lambda j: vector_head + rows[j].tobytes()

    return _copy_rows(workspace, ((u, vectors(u), _NULL) for u in updates))


def _copy_rows(workspace: str, updates: Iterable[tuple[Update, Callable[[int], bytes], bytes]]
               ) -> bytes:
    """The binary COPY of the rows of each (update, its j-th row's vector field, its
    value field)."""
    parts = [_COPY_HEADER]
    ws = _field(workspace.encode())
    count = struct.pack(">h", 6)
    for u, vector, value in updates:
        fid = _field(struct.pack(">q", fid_of(u.file_key)))
        for j, (cid, meta) in enumerate(zip(u.chunk_ids, u.metas, strict=True)):
            parts += [count, ws, fid, _field(cid), _field(meta), vector(j), value]
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


def vector_text(vector: np.ndarray) -> str:
    # repr of each float32 (as a float64) is exact, and parses back to the same float32.
    return "[" + ",".join(map(repr, vector.tolist())) + "]"


