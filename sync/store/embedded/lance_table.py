"""A server-search workspace's LanceDB table `chunks` (rid, chunk_id, fid, vector, meta;
its columns: sync.store.core.rows.table_schema): importing lancedb only when rows are read
or written, turning a failed read into one `StoreCorrupt`, gathering scanned rows as the
search index takes them, and the new rows of an apply as one Arrow table.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.lazy import LazyModule
from sync.records import KEY_BYTES, MODE_SERVER_SEARCH
from sync.store.core.rows import table_schema
from sync.wire import StoreCorrupt, StoreError

# faiss and pyarrow take ~90 ms to import; a sync with nothing to send needs neither.
if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = LazyModule("pyarrow")

TABLE = "chunks"
# Old LanceDB versions are removed at compaction once this old. Another process reading
# the table always moves to the latest version first, so a short grace period suffices.
CLEANUP_AFTER = timedelta(minutes=2)
LANCE_IN_BATCH = 2000  # bound on values per `fid IN (...)` filter
SCAN_BATCH = 65_536  # rows per batch when reading the table for the index
COLUMNS = ["rid", "fid", "chunk_id", "meta", "vector"]


def import_lancedb() -> Any:
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
def lance_reads(table_dir: Path) -> Iterator[None]:
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


def open_table(path: Path) -> Any:
    """The LanceDB table of the workspace folder `path`."""
    with lance_reads(path / f"{TABLE}.lance"):
        return import_lancedb().connect(path).open_table(TABLE)


def scan_table(table: Any, table_dir: Path, columns: list[str], where: str | None = None
               ) -> Iterator[pa.RecordBatch]:
    """Batches of `table` at the version checked out (the handle does not move until
    the next checkout_latest, so successive scans agree)."""
    with lance_reads(table_dir):
        query = table.search().select(columns).limit(None)
        if where is not None:
            query = query.where(where)
        yield from query.to_batches(SCAN_BATCH)


class Scanned:
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


def arrow_rows(dim: int, rids: np.ndarray, chunk_ids: list[bytes], fids: np.ndarray,
               vectors: np.ndarray, metas: list[bytes]) -> pa.Table:
    """New rows of a server-search workspace, as the table takes them in one `add`."""
    return pa.Table.from_arrays(
        [
            pa.array(rids),
            pa.array(chunk_ids, pa.binary()),
            pa.array(fids),
            pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim),
            pa.array(metas, pa.binary()),
        ],
        schema=table_schema(dim, MODE_SERVER_SEARCH),
    )
