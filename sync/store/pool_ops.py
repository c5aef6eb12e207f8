"""The ref and pool operations of an embedded workspace (sync.store.pool): a pull by
blob, the refs listed and dropped, and the garbage collection. Mixed into
`sync.store.workspace.WorkspaceStore`, whose connections and locks they use."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sync.records import BlobRows, RefInfo
from sync.store.checks import _key, ref_id
from sync.store.options import StoreOptions
from sync.store.pool import collect, drop_ref_nodes, list_refs, release, stale_refs
from sync.store.rows import blob_rows_of, fid_of
from sync.store.sqlite_tree import sealed_reads, transaction
from sync.wire import BadRequest, Limits, RefNotFound

DAY = 86_400.0


def blob_items(items: object, limits: Limits) -> list[tuple[bytes, bytes]]:
    """The checked (file key, value) pairs of a `blob_rows` request, one per file key."""
    if not isinstance(items, Sequence) or isinstance(items, bytes | str):
        raise BadRequest("blobs must be a list of (file key, value) pairs")
    if len(items) > limits.max_row_files:
        raise BadRequest(f"too many blobs: {len(items)} > {limits.max_row_files} per call")
    out: dict[bytes, bytes] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Sequence) or isinstance(item, bytes | str) or len(item) != 2:
            raise BadRequest(f"blobs[{i}] must be a (file key, value) pair")
        out[_key(item[0], f"blobs[{i}][0]")] = _key(item[1], f"blobs[{i}][1]")
    return list(out.items())


class PoolOps:
    """What `WorkspaceStore` gives these methods."""

    sealed: bool
    limits: Limits
    options: StoreOptions
    workspace_id: str
    _rconn: sqlite3.Connection
    _wconn: sqlite3.Connection
    _rlock: threading.Lock
    _write_lock: threading.Lock
    _tree_path: Path
    _flock: Any  # WorkspaceFiles._flock
    _check_open: Any
    _checkpoint: Any

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        """The rows of each blob (file key, value) the pool holds, whichever ref sent
        it; the keys of those it lacks in `missing`. Bounded like `file_rows`."""
        self._check_open()
        wanted = blob_items(items, self.limits)
        if not self.sealed:
            raise BadRequest("a server-search workspace has no blob pool", status=409)
        with self._rlock, sealed_reads(self._tree_path):
            self._rconn.execute("BEGIN")
            try:
                found = blob_rows_of(self._rconn, {k: (fid_of(k), v) for k, v in wanted},
                                     rows=rows)
            finally:
                self._rconn.execute("COMMIT")
        out: dict[bytes, list[tuple[bytes, bytes]]] = {}
        missing: list[bytes] = []
        size = 0
        for key, _ in wanted:
            if key not in found:
                missing.append(key)
                continue
            got = sorted(found[key], key=lambda r: r[0])
            cost = sum(len(c) + len(m) for _, c, m in got)
            if out and size + cost > self.limits.max_row_bytes:
                break
            size += cost
            out[key] = [(c, m) for _, c, m in got]
        return BlobRows(out, missing)

    def refs(self) -> list[RefInfo]:
        """Every ref with a tree: id, last write, files and rows (`codeveil refs`)."""
        self._check_open()
        with self._rlock, sealed_reads(self._tree_path):
            self._rconn.execute("BEGIN")
            try:
                return list_refs(self._rconn, self.sealed)
            finally:
                self._rconn.execute("COMMIT")

    def drop_ref(self, ref: bytes) -> None:
        """Delete `ref`'s tree; blobs it alone named are orphaned (deleted at once if no
        ref is left). RefNotFound (404) for a ref without a tree."""
        self._check_open()
        ref = ref_id(ref, self.sealed)
        with self._write_lock, self._flock():
            with sealed_reads(self._tree_path), transaction(self._wconn) as conn:
                if not conn.execute("SELECT 1 FROM refs WHERE ref = ?", (ref,)).fetchone():
                    raise RefNotFound(f"workspace {self.workspace_id} has no ref {ref.hex()}")
                released = self._drop(conn, ref)
            if released:
                self._checkpoint()

    def _drop(self, conn: sqlite3.Connection, ref: bytes) -> int:
        blobs = drop_ref_nodes(conn, ref)
        if not self.sealed:
            return 0
        (left,) = conn.execute("SELECT COUNT(*) FROM refs").fetchone()
        return release(conn, set(blobs), now=left <= 1)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        """Drop refs not synced for `max_ref_age_days` (the store's option if None), then
        delete the blobs no ref has named for `grace_s` seconds (likewise). Returns what
        went: refs, blobs, rows."""
        self._check_open()
        age = self.options.ref_max_age_days if max_ref_age_days is None else max_ref_age_days
        grace = self.options.blob_grace_s if grace_s is None else grace_s
        if (age is not None and not age >= 0) or not grace >= 0:
            raise BadRequest("max_ref_age_days and grace_s must be numbers >= 0")
        with self._write_lock, self._flock():
            with sealed_reads(self._tree_path), transaction(self._wconn) as conn:
                dropped = stale_refs(conn, age * DAY) if age is not None else []
                released = sum(self._drop(conn, r) for r in dropped)
                blobs, rows = collect(conn, grace) if self.sealed else (0, 0)
            if released or rows:
                self._checkpoint()
        return {"refs": len(dropped), "blobs": blobs, "rows": rows + released}
