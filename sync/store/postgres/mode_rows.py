"""The hooks a workspace in PostgreSQL (sync.store.postgres.workspace) calls on its mode's
rows (sync.store.core.mode_rows): those both backends share, and those of the
PostgreSQL write order, whose steps run in the apply's one transaction. A sealed
workspace's rows are blobs of its pool (sync.store.postgres.sealed_rows); a
server-search workspace's hold their vectors, searched by pgvector
(sync.store.postgres.search_rows)."""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from sync.store.core.checks import Update
from sync.store.core.mode_rows import ModeRows
from sync.store.core.tree_plan import TreePlan


class PgRows(ModeRows[psycopg.Connection], Protocol):
    """One workspace's rows in the database, as its mode keeps them."""

    def describe(self) -> dict[str, Any]:
        """The mode's part of `info().extra`."""
        ...

    def write(self, conn: psycopg.Connection, plan: TreePlan,
              old_blobs: set[tuple[int, bytes]], updates: list[Update]) -> None:
        """An apply's rows, after its step 1 (`plan`; `old_blobs`, the blobs the
        touched leaves named before it)."""
        ...

    def after_commit(self, updates: list[Update]) -> None:
        """The apply of `updates` committed."""
        ...

    def released(self, conn: psycopg.Connection, blobs: list[tuple[int, bytes]]) -> int:
        """A ref whose leaves named `blobs` was dropped; returns the rows deleted."""
        ...

    def collect(self, conn: psycopg.Connection, grace_s: float) -> tuple[int, int]:
        """The GC's pass over the pool: (blobs deleted, rows deleted)."""
        ...

    def problems(self, conn: psycopg.Connection, rows: int, with_vector: int) -> list[str]:
        """What `check` finds of the mode's state, the workspace holding `rows` rows,
        `with_vector` of them with a vector."""
        ...
