"""A server-search embedded workspace's rows (sync.store.core.mode_rows): in LanceDB
(sync.store.embedded.lance_rows), under the search index kept equal to them
(sync.store.embedded.search_index). An apply's rows are written in one LanceDB `add`
and the index follows; the table's superseded versions are purged after it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from sync.records import MODE_SERVER_SEARCH, SearchHit
from sync.store.core.checks import Update, search_request
from sync.store.core.mode_rows import FoundRows, NoPool, search_extra
from sync.store.core.rows import fid_of, rows_by_fid, table_schema
from sync.store.embedded.lance_table import LANCE_ADVICE, TABLE, import_lancedb, lance_reads
from sync.store.embedded.pool import scoped, unscoped
from sync.store.embedded.search_index import SNAPSHOT, SearchIndex
from sync.store.embedded.sqlite_tree import Plan
from sync.store.embedded.vector_index import SnapshotError, read_snapshot, read_snapshot_info
from sync.store.embedded.workspace_files import WorkspaceFiles


class SearchRows(NoPool[sqlite3.Connection]):
    """The rows and the search index (`index`, its table `index.table`) of a
    server-search workspace, on its files."""

    def __init__(self, files: WorkspaceFiles) -> None:
        self.files = files
        self.index = SearchIndex(files)

    @staticmethod
    def create(path: Path, dim: int) -> None:
        """The LanceDB table of a new workspace."""
        import_lancedb().connect(path).create_table(
            TABLE, schema=table_schema(dim, MODE_SERVER_SEARCH))

    def counts(self) -> tuple[int, dict[str, Any]]:
        chunks, index = self.index.count()
        return chunks, search_extra(index)

    def file_rows(self, wanted: list[bytes], ref: bytes) -> FoundRows:
        """Read under the write locks: LanceDB and tree.sqlite commit apart."""
        files = self.files
        with files.write_lock, files.flock():
            committed = [unscoped(k) for k, (value, is_dir) in files.leaf_values(
                [scoped(ref, k) for k in wanted]).items() if value is not None and not is_dir]
            fid_keys: dict[int, list[bytes]] = {}
            for k in committed:
                fid_keys.setdefault(fid_of(k), []).append(k)
            return self.index.table.file_rows(fid_keys)

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """By Euclidean distance (not squared), on the index."""
        query, k = search_request(vector, k, self.files.dim, self.files.limits)
        return self.index.search(query[None, :], k)

    # -- the steps of an apply ---------------------------------------------------------

    def prepare_write(self) -> None:
        self.index.prepare_write()  # the index equal to LanceDB's rows, as it stands

    def follow(self, generation: int) -> None:
        self.index.follow(generation)  # our own change: the index follows it

    def write(self, plan: Plan, updates: list[Update]) -> int:
        """LanceDB, the new rows in one `add`; then the index is brought into step."""
        return self.index.replace_rows(plan, updates)

    def statements(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # no rows in tree.sqlite

    def purge(self, deleted: int, added: int) -> None:
        """The table compacted and its older versions removed (sync.store.core.rows),
        then the index retrained, snapshotted, or its snapshot dropped."""
        table = self.index.table
        if deleted:
            table.purge(added=added)
        else:
            table.maybe_compact()
        table.record_count()
        self.index.after_apply(deleted)

    # -- refs and the pool ---------------------------------------------------------------

    def ref_rows(self, conn: sqlite3.Connection, lo: bytes, hi: bytes) -> int:
        return 0  # rows belong to files, not to blobs of a ref

    # -- checks --------------------------------------------------------------------------

    def verify(self, *, deep: bool) -> None:
        """With the table open (this process wrote or read it) and `deep`, its rows
        counted and compared with the index's; otherwise only its files are looked at,
        so an index with nothing to send does not pay LanceDB's import (nor a server's
        root request the write lock)."""
        self.index.verify(deep=deep)

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        lance = self.index.table
        with self.files.write_lock, lance_reads(lance.dir):
            lance.handle.checkout_latest()
            return rows_by_fid(
                row for b in lance.scan(["rid", "fid", "chunk_id"])
                for row in zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                               b.column("chunk_id").to_pylist(), strict=True))

    def table(self) -> tuple[str, str]:
        return f"the chunk table {self.index.table.dir}", LANCE_ADVICE

    def pooled_fids(self) -> set[int]:
        return set()

    def problems(self, rids: np.ndarray) -> list[str]:
        """The search snapshot, when of the current generation, holding exactly the
        table's rows `rids`."""
        files = self.files
        problems: list[str] = []
        snapshot = files.path / SNAPSHOT
        try:
            info = read_snapshot_info(snapshot)
        except FileNotFoundError:
            info = None
        except (SnapshotError, OSError) as exc:
            problems.append(f"the search snapshot {snapshot} is unreadable ({exc}); it is"
                            " rebuilt from the chunk table (delete it to stop this message)")
            info = None
        if info is not None and info.get("generation") == files.generation():
            try:
                _index, rows, _ = read_snapshot(snapshot, files.options.index_policy)
                same = np.array_equal(np.sort(rows.rids()), np.sort(rids))
            except (SnapshotError, OSError, ValueError) as exc:
                same, rows = False, None
                problems.append(f"the search snapshot {snapshot} is unreadable ({exc})")
            if rows is not None and not same:
                problems.append(f"the search snapshot {snapshot} does not hold the chunk"
                                " table's rows; delete it (it is rebuilt from the table)")
        return problems

    def close(self) -> None:
        """Snapshot the index if it changed since the last snapshot (caller holds the
        write lock)."""
        self.index.close()
