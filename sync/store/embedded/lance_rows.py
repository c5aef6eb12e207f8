"""A server-search workspace's rows in its LanceDB table (sync.store.embedded.lance_table), a part
of its search index (sync.store.embedded.search_index, which is kept equal to them): the table
opened on first use, scanned, written by an apply's step 2, compacted or purged after it
(sync.store.core.rows), and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sync.store.core.rows import group_rows, purge_superseded
from sync.store.embedded.lance_table import (
    CLEANUP_AFTER,
    LANCE_ADVICE,
    LANCE_IN_BATCH,
    TABLE,
    lance_reads,
    open_table,
    scan_table,
)
from sync.store.embedded.sqlite_tree import batched, transaction
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import StoreCorrupt

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


class LanceRows:
    """One server-search workspace's table. The handle is opened on first use and used
    under the files' write lock only; `count` reads on a handle of its own."""

    def __init__(self, files: WorkspaceFiles) -> None:
        self.files = files
        self.dir = files.path / f"{TABLE}.lance"
        self._handle: Any = None
        self._applies_since_compact = 0

    @property
    def is_open(self) -> bool:
        """Whether this process opened the table (wrote or read it)."""
        return self._handle is not None

    @property
    def handle(self) -> Any:
        """The LanceDB table (callers hold the write lock)."""
        if self._handle is None:
            self._handle = open_table(self.files.path)
        return self._handle

    def checkout_latest(self) -> None:
        with lance_reads(self.dir):
            self.handle.checkout_latest()

    def scan(self, columns: list[str], where: str | None = None
             ) -> Iterator[pa.RecordBatch]:
        return scan_table(self.handle, self.dir, columns, where)

    def file_rows(self, fid_keys: dict[int, list[bytes]]
                  ) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
        """file key -> [(rid, chunk id, meta)] of the files of `fid_keys`, at the latest
        version (caller holds the write locks)."""
        if not fid_keys:
            return {}
        self.checkout_latest()
        batches = (
            b
            for part in batched(sorted(fid_keys), LANCE_IN_BATCH)
            for b in self.scan(["rid", "fid", "chunk_id", "meta"],
                               where=f"fid IN ({','.join(map(str, part))})")
        )
        return group_rows(batches, fid_keys)

    def replace(self, old_fids: list[int], new: pa.Table | None) -> None:
        """Step 2's write: the rows of `old_fids` deleted, then `new` added in one `add`."""
        for part in batched(old_fids, LANCE_IN_BATCH):
            self.handle.delete(f"fid IN ({','.join(map(str, part))})")
        if new is not None:
            self.handle.add(new)

    def maybe_compact(self) -> None:
        """After an apply that deleted no rows. Each apply adds a LanceDB fragment and
        version; merging them now and then keeps reads (index builds) fast and the folder
        small. Rows keep their rids, so the faiss index is unaffected."""
        self._applies_since_compact += 1
        if self._applies_since_compact < self.files.options.compact_every:
            return
        self._applies_since_compact = 0
        started = time.perf_counter()
        try:
            self.handle.optimize(cleanup_older_than=CLEANUP_AFTER)
        except Exception:  # compaction is an optimisation: never fail an apply for it
            log.warning("workspace %s: compaction failed", self.files.workspace_id,
                        exc_info=True)
            return
        log.debug("workspace %s: compacted in %.2fs", self.files.workspace_id,
                  time.perf_counter() - started)

    def purge(self, added: int) -> None:
        """After an apply that deleted rows: their bytes leave the data dir now
        (sync.store.core.rows). It compacts the table too, so the count towards the next
        compaction starts again. A failure is logged: the rows are gone from the table
        already, and the next apply that deletes rows purges them too."""
        self._applies_since_compact = 0
        try:
            took = purge_superseded(self.handle, added)
        except Exception:
            log.warning("workspace %s: removing superseded rows failed",
                        self.files.workspace_id, exc_info=True)
            return
        self.files.events["purged"] += 1
        log.debug("workspace %s: superseded rows removed in %.3fs", self.files.workspace_id,
                  took)

    def record_count(self) -> None:
        """Note the table's rows at this generation in tree.sqlite, for `info` to read
        where the snapshot is not current (applies save it now and then) without LanceDB."""
        rows = int(self.handle.count_rows())
        with transaction(self.files.wconn) as conn:
            (gen,) = conn.execute("SELECT value FROM state WHERE name = 'generation'").fetchone()
            conn.executemany("INSERT OR REPLACE INTO state (name, value) VALUES (?, ?)",
                             [("counted_generation", gen), ("counted_rows", rows)])

    def counted(self) -> int | None:
        """The rows noted by the last apply, if nothing was written since."""
        with self.files.rlock:
            noted = dict(self.files.rconn.execute(
                "SELECT name, value FROM state WHERE name IN"
                " ('generation', 'counted_generation', 'counted_rows')"))
        if noted.get("counted_generation") != noted.get("generation"):
            return None
        return noted.get("counted_rows")

    def count(self) -> int:
        """The table's rows, from a fresh handle (it sees the latest version whoever
        wrote it). Read without the flock, so a writer may remove the version being read
        (sync.store.core.rows); then it is read again under the flock, where a failure is
        damage."""
        def count() -> int:
            with lance_reads(self.dir):
                return int(open_table(self.files.path).count_rows())

        try:
            return count()
        except StoreCorrupt:
            with self.files.flock():
                return count()

    def check_files(self, rows: int | None) -> None:
        """StoreCorrupt if the table's files plainly are not there: no version manifest,
        or no data file (or an empty one) for `rows` rows (None: not known)."""
        manifests = list((self.dir / "_versions").glob("*.manifest"))
        if not manifests or not any(m.stat().st_size for m in manifests):
            raise StoreCorrupt(f"the chunk table {self.dir} has no version manifest;"
                               f" {LANCE_ADVICE}")
        data = list((self.dir / "data").glob("*.lance"))
        if (rows and not data) or any(d.stat().st_size == 0 for d in data):
            raise StoreCorrupt(f"the chunk table {self.dir} lost its data files;"
                               f" {LANCE_ADVICE}")
