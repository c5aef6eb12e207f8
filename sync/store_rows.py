"""Chunk rows as stored, apart from the search index: the table layout of each workspace
mode, reading a file's rows back (`file_rows`), and removing the bytes of superseded rows
from the data dir.

Sealed workspaces keep rows of (rid, chunk_id, fid, meta) and nothing else: no vector
column, no faiss index, no search snapshot. Server-search workspaces add the vector.

Superseded rows. LanceDB deletes a row by marking it in a deletion file; its bytes stay
in the data file, and every older table version keeps its files too. A replaced or
deleted file's rows would so remain readable in the data dir indefinitely. After an
apply that deleted rows, `purge_superseded` compacts the table (which rewrites the
fragments holding deleted rows without them) and removes every version but the latest,
so the old bytes leave the disk. LanceDB's compaction rewrites a fragment for its
deletions alone only past 10% deleted rows, but merges adjacent fragments smaller than
its target (a million rows); an apply that only deleted rows therefore first moves one
surviving row to a fragment of its own, so the fragment with the deletions has a
neighbour to be merged with. (In a table past a million rows a large fragment with few
deletions is left as it is until they pass 10%.)

The cost: below a million rows the table is one fragment, so a purge rewrites all of it,
once per apply that deleted rows (a first index deletes none and pays nothing). Measured
on 2 busy cores, one file of 10 chunks replaced: sealed rows of 1.8 KB, 62 ms at 10,000
rows (19 MB) and 208 ms at 50,000 (94 MB); server-search at dim 384, 39 ms and 146 ms.
A server-search workspace's search snapshot holds its rows' metadata too; it is
rewritten on its own schedule (sync.store), at the latest when the store closes.

The removal runs under the writer's flock. A reader in another process that reads the
table without it (a search catching its index up while a writer is busy) may find a
version gone; it reads again under the flock (sync.store).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from indexer.lazy import LazyModule
from sync.records import KEY_BYTES, MODE_SEALED, FileRows
from sync.wire import BadRequest, Limits

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = LazyModule("pyarrow")

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
        # flock held here, or read again under it (sync.store).
        warnings.simplefilter("ignore", UserWarning)
        table.optimize(cleanup_older_than=timedelta(0))
    with contextlib.suppress(AttributeError):
        table.checkout_latest()
    return time.perf_counter() - started
