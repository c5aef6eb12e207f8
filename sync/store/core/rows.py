"""Chunk rows as stored, apart from the search index: each workspace mode's row layout,
reading a file's rows back (`file_rows`), and removing the bytes of superseded rows from
the data dir.

Sealed workspaces keep rows of (rid, fid, chunk_id, meta) and nothing else, in the table
`rows` of the workspace's tree.sqlite, beside the Merkle tree (`SEALED_SCHEMA`: rid the
primary key, an index on fid): no vector column, no faiss index, no search snapshot, and
no LanceDB. The store only ever deletes a file's rows, adds a file's rows, and reads a
file's rows back, which a B-tree keyed by rowid with an index on the file does directly.
Server-search workspaces keep their rows, with the vector, in a LanceDB table
(`table_schema`), which the search index is built from.

Superseded rows, sealed. The connection that writes rows runs with `PRAGMA secure_delete
= ON`: SQLite overwrites a deleted row's bytes with zeros in its page (and zeroes pages
it frees), so the page image written at the delete holds no trace of the row. Older
images of those pages can still sit in the write-ahead log until it is checkpointed; so
after an apply that deleted rows, `checkpoint_superseded` runs `PRAGMA
wal_checkpoint(TRUNCATE)`: the latest images are copied into tree.sqlite and the log is
cut to zero bytes. If a reader holds an old snapshot the checkpoint cannot finish; the
writer then tries again after its next apply, and the last connection to close removes
the log in any case. (A process killed between an apply and its checkpoint leaves the
log as it was until one of those.) The cost: the pages written since the last
checkpoint, copied once, and one fsync of tree.sqlite. Measured on 2 busy cores (load
6), one file of 10 chunks of 1.8 KB replaced, median of 15: the whole apply 32 ms at
10,000 rows (21 MB) and 38 ms at 50,000 (104 MB), of which the checkpoint 15 and 11 ms;
mostly fsyncs (the three commits' and the checkpoint's), so it hardly grows with the
workspace. The same apply with the rows in LanceDB and its purge (below) took 106 and
278 ms in that run.

Superseded rows, server-search. LanceDB deletes a row by marking it in a deletion file;
its bytes stay in the data file, and every older table version keeps its files too. A
replaced or deleted file's rows would so remain readable in the data dir indefinitely.
After an apply that deleted rows, `purge_superseded` compacts the table (which rewrites
the fragments holding deleted rows without them) and removes every version but the
latest, so the old bytes leave the disk. LanceDB's compaction rewrites a fragment for
its deletions alone only past 10% deleted rows, but merges adjacent fragments smaller
than its target (a million rows); an apply that only deleted rows therefore first moves
one surviving row to a fragment of its own, so the fragment with the deletions has a
neighbour to be merged with. (In a table past a million rows a large fragment with few
deletions is left as it is until they pass 10%.) Below a million rows the table is one
fragment, so a purge rewrites all of it, once per apply that deleted rows (a first index
deletes none and pays nothing): at dim 384, one file of 10 chunks replaced, 39 ms at
10,000 rows and 146 ms at 50,000. A server-search workspace's search snapshot holds its
rows' metadata too; it is rewritten on its own schedule (sync.store.embedded.search_index), at
the latest when the store closes.

The LanceDB removal runs under the writer's flock. A reader in another process that
reads the table without it (a search catching its index up while a writer is busy) may
find a version gone; it reads again under the flock (sync.store.embedded.search_index).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.lazy import LazyModule
from sync.records import KEY_BYTES, MODE_SEALED, FileRows
from sync.wire import BadRequest, Limits

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = LazyModule("pyarrow")

#: A sealed workspace's rows, in its tree.sqlite, one statement each (they run inside a
#: transaction, where `executescript` would not). rid is the rowid: rows are stored in
#: the order they were sent, and a file's rows are found through the index on fid.
#: Since store format 4 a row names its blob, (fid, value): one version of one file, which
#: every ref holding that version points at (sync.store.embedded.pool); `blobs` lists the blobs
#: held, and since when one is without a ref.
SEALED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rows (rid INTEGER PRIMARY KEY, fid INTEGER NOT NULL,"
    " chunk_id BLOB NOT NULL, meta BLOB NOT NULL, value BLOB)",
    "CREATE INDEX IF NOT EXISTS rows_blob ON rows (fid, value)",
    "CREATE TABLE IF NOT EXISTS blobs (fid INTEGER NOT NULL, value BLOB NOT NULL,"
    " orphaned REAL, PRIMARY KEY (fid, value)) WITHOUT ROWID",
)
_SQL_BATCH = 500  # bound on parameters per statement

#: A sealed row as stored: (rid, fid, chunk id, meta).
SealedRow = tuple[int, int, bytes, bytes]


def fid_of(file_key: bytes) -> int:
    """The column that groups a file's chunk rows: its key's first 8 bytes."""
    return int.from_bytes(file_key[:8], "big", signed=True)


def fid_bounds(key: bytes) -> tuple[bytes, bytes]:
    """[low, high): the node keys that share `key`'s fid (its first 8 bytes)."""
    prefix = int.from_bytes(key[:8], "big")
    high = ((prefix + 1).to_bytes(8, "big") + bytes(8) if prefix < 2**64 - 1
            else b"\xff" * 17)  # above every 16-byte key
    return key[:8] + bytes(8), high


def refuse_fid_collisions(file_keys: Iterable[bytes], batch_keys: Iterable[bytes],
                          stored: Iterable[bytes], gone: set[bytes]) -> None:
    """Raise BadRequest if a file of an apply would share its rows' group with another
    node: a file's rows are found, replaced and deleted by its key's first 8 bytes, so
    two keys with the same 8 (by chance: about n^2 / 2^65 for n files) would mix their
    rows. `stored` are the tree's keys in the `fid_bounds` of the files, `batch_keys`
    every node key of the apply, and `gone` the nodes it deletes."""
    near: dict[bytes, set[bytes]] = {}
    for k in (*batch_keys, *stored):
        if k not in gone:
            near.setdefault(k[:8], set()).add(k)
    for f in file_keys:
        others = near.get(f[:8], set()) - {f}
        if others:
            raise BadRequest(
                f"file key {f.hex()} shares its first 8 bytes with node"
                f" {min(others).hex()}: the store groups a file's rows by them; rename"
                " one of the two files")


def has_sealed_rows(conn: sqlite3.Connection) -> bool:
    """Whether the tree.sqlite of `conn` holds the sealed rows table."""
    return conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rows'"
    ).fetchone() is not None


def replace_blob_rows(conn: sqlite3.Connection, blobs: dict[tuple[int, bytes], list[SealedRow]]
                      ) -> int:
    """Replace the rows of each blob (fid, value) of `blobs` with its new rows, and list
    it as held; the caller holds a transaction. Returns how many rows were deleted."""
    deleted = 0
    for (fid, value), rows in blobs.items():
        cursor = conn.execute("DELETE FROM rows WHERE fid = ? AND value = ?", (fid, value))
        deleted += max(cursor.rowcount, 0)
        conn.executemany("INSERT INTO rows (rid, fid, chunk_id, meta, value)"
                         " VALUES (?, ?, ?, ?, ?)", [(*r, value) for r in rows])
        conn.execute("INSERT INTO blobs (fid, value, orphaned) VALUES (?, ?, NULL)"
                     " ON CONFLICT (fid, value) DO UPDATE SET orphaned = NULL", (fid, value))
    return deleted


def blob_rows_of(conn: sqlite3.Connection, blobs: dict[bytes, tuple[int, bytes]], *,
                 rows: bool = True) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """file key -> [(rid, chunk id, meta)] of the rows of its blob (fid, value), for
    the blobs the pool holds (a key of a blob it lacks is left out); the caller holds
    a read transaction, so every blob is read from the same snapshot."""
    found: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
    for key, (fid, value) in blobs.items():
        if conn.execute("SELECT 1 FROM blobs WHERE fid = ? AND value = ?",
                        (fid, value)).fetchone() is None:
            continue
        found[key] = [] if not rows else [
            (rid, bytes(cid), bytes(meta)) for rid, cid, meta in conn.execute(
                "SELECT rid, chunk_id, meta FROM rows WHERE fid = ? AND value = ?",
                (fid, value))]
    return found


def sealed_rows_scan(conn: sqlite3.Connection) -> Iterator[tuple[int, int, bytes]]:
    """(rid, fid, chunk id) of every sealed row, in rid order."""
    for rid, fid, cid in conn.execute("SELECT rid, fid, chunk_id FROM rows ORDER BY rid"):
        yield rid, fid, bytes(cid)


def checkpoint_superseded(conn: sqlite3.Connection, *, wait_ms: int = 2000,
                          timeout_ms: int = 30_000) -> bool:
    """Copy the write-ahead log into the database file and cut it to zero bytes, so that
    page images holding deleted rows leave the data dir (see the module docstring).
    Waits up to `wait_ms` for readers of older snapshots, then `conn`'s busy timeout is
    `timeout_ms` again. False if a reader kept it from finishing (try again later).
    Caller holds no transaction on `conn`."""
    conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
    try:
        (busy, _frames, _copied) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
    return not busy


def table_schema(dim: int, mode: str) -> pa.Schema:
    """The chunk table's columns: a sealed workspace's have no vector."""
    fields = [
        pa.field("rid", pa.int64(), nullable=False),
        pa.field("chunk_id", pa.binary(), nullable=False),
        pa.field("fid", pa.int64(), nullable=False),
    ]
    if mode != MODE_SEALED:
        fields.append(pa.field("vector", pa.list_(pa.float32(), dim), nullable=False))
    fields.append(pa.field("meta", pa.binary(), nullable=False))
    return pa.schema(fields)


def file_keys(keys: object, limits: Limits) -> list[bytes]:
    """The validated keys of a file_rows call, duplicates dropped, in the order given."""
    if not isinstance(keys, Sequence) or isinstance(keys, bytes | str):
        raise BadRequest("files must be a list of file keys")
    if len(keys) > limits.max_row_files:
        raise BadRequest(
            f"too many files: {len(keys)} > {limits.max_row_files} per file_rows call"
        )
    out: dict[bytes, None] = {}
    for i, key in enumerate(keys):
        if not isinstance(key, bytes | bytearray | memoryview):
            raise BadRequest(f"files[{i}] must be bytes, got {type(key).__name__}")
        if len(key) != KEY_BYTES:
            raise BadRequest(f"files[{i}] must be {KEY_BYTES} bytes, got {len(key)}")
        out[bytes(key)] = None
    return list(out)


def group_rows(
    batches: Iterable[pa.RecordBatch], fid_keys: dict[int, list[bytes]]
) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """file key -> [(rid, chunk id, meta)] of the scanned rows, by their fid."""
    found: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
    for b in batches:
        for rid, fid, cid, meta in zip(
            b.column("rid").to_pylist(), b.column("fid").to_pylist(),
            b.column("chunk_id").to_pylist(), b.column("meta").to_pylist(), strict=True,
        ):
            for key in fid_keys.get(fid, ()):
                found.setdefault(key, []).append((rid, cid, meta))
    return found


def rows_by_fid(rows: Iterable[tuple[int, int, bytes]]
                ) -> dict[int, tuple[np.ndarray, list[bytes]]]:
    """fid -> (rids, chunk ids) of `rows`, each (rid, fid, chunk id), in their order:
    every backend's `rows_by_file`."""
    out: dict[int, tuple[list[int], list[bytes]]] = {}
    for rid, fid, cid in rows:
        entry = out.setdefault(fid, ([], []))
        entry[0].append(rid)
        entry[1].append(cid)
    return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}


def bounded_answer(
    keys: list[bytes], found: dict[bytes, list[tuple[int, bytes, bytes]]], max_bytes: int
) -> FileRows:
    """The rows of `keys` in order, in rid order (the order the client sent them), until
    `max_bytes` of chunk ids and metadata are reached; the keys after that are left out
    (the caller asks for them again). The first file always comes whole."""
    out: FileRows = {}
    size = 0
    for key in keys:
        rows = sorted(found.get(key, ()), key=lambda r: r[0])
        cost = sum(len(cid) + len(meta) for _, cid, meta in rows)
        if out and size + cost > max_bytes:
            break
        size += cost
        out[key] = [(cid, meta) for _, cid, meta in rows]
    return out


def purge_superseded(table: Any, added_rows: int) -> float:
    """Remove deleted rows' bytes and every older version from the data dir (see the
    module docstring); returns the seconds it took. Caller holds the writer's flock."""
    started = time.perf_counter()
    if not added_rows:
        survivor = table.search().select(["rid"]).limit(1).to_arrow()
        if survivor.num_rows:  # none left: LanceDB dropped the emptied fragments whole
            rid = int(survivor.column("rid")[0].as_py())
            table.update(where=f"rid = {rid}", values_sql={"rid": "rid"})
    with warnings.catch_warnings():
        # LanceDB warns that readers of older versions will fail: ours read under the
        # flock held here, or read again under it (sync.store.embedded.search_index).
        warnings.simplefilter("ignore", UserWarning)
        table.optimize(cleanup_older_than=timedelta(0))
    with contextlib.suppress(AttributeError):
        table.checkout_latest()
    return time.perf_counter() - started
