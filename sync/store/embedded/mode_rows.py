"""The hooks an embedded workspace (sync.store.embedded.workspace) calls on its mode's
rows (sync.store.core.mode_rows): those both backends share, and the steps of the
embedded write order, whose steps commit one at a time. A sealed workspace's rows are in
its tree.sqlite, in a pool of blobs (sync.store.embedded.sealed_rows); a server-search
workspace's in LanceDB, under a search index (sync.store.embedded.search_rows)."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sync.store.core.checks import Update
from sync.store.core.mode_rows import ModeRows
from sync.store.embedded.sqlite_tree import Plan
from sync.store.embedded.workspace_files import WorkspaceFiles

Blob = tuple[int, bytes]  # (fid, leaf value)


class RowsKind(Protocol):
    """A mode's rows as a kind: what creates them in a new workspace, and what opens
    them in an open one (`SealedRows`, `SearchRows`)."""

    def __call__(self, files: WorkspaceFiles) -> EmbeddedRows: ...

    def create(self, path: Path, dim: int) -> None:
        """Add the mode's files to those of a new workspace (WorkspaceFiles.initialize)."""
        ...


class EmbeddedRows(ModeRows[sqlite3.Connection], Protocol):
    """One embedded workspace's rows, as its mode keeps them."""

    def counts(self) -> tuple[int, dict[str, Any]]:
        """The rows, and the mode's part of `info().extra`; never builds an index."""
        ...

    # -- the steps of `WorkspaceStore.apply`, in their order ---------------------------

    def prepare_write(self) -> None:
        """Under the write locks, before step 1."""
        ...

    def follow(self, generation: int) -> None:
        """The apply under way bumped the generation to `generation` (steps 1 and 3)."""
        ...

    def write(self, plan: Plan, updates: list[Update]) -> int:
        """Step 2: the rows of the plan's files replaced by those of `updates`, committed;
        returns the rows deleted."""
        ...

    def statements(self) -> AbstractContextManager[None]:
        """Around step 3's transaction of tree.sqlite, which the mode's hooks join."""
        ...

    def purge(self, deleted: int, added: int) -> None:
        """Step 4: `deleted` rows went (`added` came): their bytes leave the data dir."""
        ...

    # -- refs and the pool (sync.store.embedded.pool_ops) ------------------------------

    def ref_rows(self, conn: sqlite3.Connection, lo: bytes, hi: bytes) -> int:
        """The rows of the blobs the leaves between stored keys `lo` and `hi` name."""
        ...

    def released(self, conn: sqlite3.Connection, blobs: list[Blob]) -> int:
        """A ref whose leaves named `blobs` was dropped: those no ref names now are
        released (sync.store.embedded.pool.release); returns the rows deleted."""
        ...

    def collect(self, conn: sqlite3.Connection, grace_s: float) -> tuple[int, int]:
        """The GC's pass over the pool: (blobs deleted, rows deleted)."""
        ...

    # -- checks (sync.store.embedded.workspace_checks) ---------------------------------

    def verify(self, *, deep: bool) -> None:
        """As `WorkspaceStore.verify`."""
        ...

    def rows_by_file(self) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """fid -> (rids, chunk ids) of every row, read in full."""
        ...

    def table(self) -> tuple[str, str]:
        """Where the rows are, and what to do when they are damaged, for `check`."""
        ...

    def pooled_fids(self) -> set[int]:
        """The files of the blobs the pool holds: rows no ref names yet, not damage."""
        ...

    def problems(self, rids: np.ndarray) -> list[str]:
        """What else `check` finds of the mode's state, the rows being `rids`."""
        ...
