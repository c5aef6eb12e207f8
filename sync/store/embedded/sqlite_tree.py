"""The SQLite files of a data dir: registry.sqlite and each workspace's tree.sqlite, their
format and migrations, and the SQL of the Merkle tree (sync.store, "Layout").

Connections run in autocommit mode with explicit transactions (`transaction`), in WAL
mode with synchronous=FULL (sync.store, "Crash safety"). The tree's SQL for an apply's
first and last steps is here (`mark_pending`, `commit_values`); the workspace store
runs them in that order around its rows (sync.store.embedded.workspace).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer import sqlite_files
from indexer.formats import FormatError, check_sqlite_format
from sync.records import MODE_SERVER_SEARCH
from sync.store.core.checks import Update
from sync.store.core.rows import fid_bounds, fid_of
from sync.store.core.tree_plan import plan_tree
from sync.store.embedded.pool import REF_SCHEMA, ref_bounds, tree_to_4, unscoped
from sync.wire import StoreCorrupt

SQL_BATCH = 500  # bound on parameters per statement

TREE_ADVICE = (
    "for the embedded store run `codeveil doctor --repair` in the repo (it is rebuilt from"
    " the working tree); for a server, restore its data dir from a backup or delete this"
    " workspace's folder and let the clients index again"
)
REGISTRY_ADVICE = (
    "for the embedded store run `codeveil doctor --repair` in the repo (it is rebuilt from"
    " the working tree); for a server, restore it from a backup of the data dir: it lists"
    " the workspaces and their tokens"
)


# The layout of tree.sqlite and registry.sqlite; raise it, with a migration, when either
# changes (indexer.formats). A server refuses a data dir written by a newer codeveil.
# 2: the registry records each workspace's mode (an older codeveil would take a sealed
# workspace for a server-search one, so it must refuse the data dir).
# 3: a sealed workspace's rows live in its tree.sqlite, not in LanceDB (an older codeveil
# would find no chunk table). Its rows are moved when the workspace is first opened, not
# by the format step: that needs the workspace's mode, which only the registry knows, and
# the rows table itself marks the move as done.
# 4: one tree per ref (a node's stored key is ref id || node key), and a sealed
# workspace's rows grouped by blob (sync.store.embedded.pool); an older codeveil would read no tree.
STORE_FORMAT = 4


def _registry_to_2(conn: sqlite3.Connection) -> None:
    """Format 1 -> 2: workspaces gain their mode; those of format 1 are server-search."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(workspaces)")}
    if columns and "mode" not in columns:  # no table yet: a new registry is created whole
        conn.execute("ALTER TABLE workspaces ADD COLUMN mode TEXT NOT NULL"
                     f" DEFAULT '{MODE_SERVER_SEARCH}'")


def _unchanged(_conn: sqlite3.Connection) -> None:
    """A format step that leaves this file as it is (the format changed another file, or
    is completed elsewhere)."""


REGISTRY_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _registry_to_2, 2: _unchanged, 3: _unchanged,
}
# Format 2 changed the registry alone; format 3's rows are moved on open (above).
_TREE_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _unchanged, 2: _unchanged, 3: tree_to_4,
}


def connect(path: Path, advice: str = TREE_ADVICE,
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
    conn.execute("PRAGMA synchronous=FULL")  # see sync.store, "Crash safety"
    return conn


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def batched(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@contextlib.contextmanager
def sealed_reads(tree: Path) -> Iterator[None]:
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


# -- the Merkle tree --------------------------------------------------------------------


def init_tree_db(conn: sqlite3.Connection) -> None:
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
    for statement in REF_SCHEMA:
        conn.execute(statement)


@dataclass(frozen=True, slots=True)
class Plan:
    """What step 1 decided, for steps 2 and 3."""

    fids: frozenset[int]  # files whose chunk rows go
    remove: frozenset[bytes]  # nodes deleted at step 3
    first_rid: int  # rids reserved for the new rows: first_rid .. first_rid + n - 1
    # sealed: the blobs (fid, value) the touched leaves named before, which may be left
    # without a ref at step 3
    old_blobs: frozenset[tuple[int, bytes]] = frozenset()


def mark_pending(conn: sqlite3.Connection, ref: bytes, updates: list[Update],
                 deletes: list[bytes]) -> tuple[Plan, int]:
    """Step 1 of `WorkspaceStore.apply` (see there), inside the caller's transaction:
    returns the plan for steps 2 and 3, and the generation it bumped to. Every key is
    stored (scoped to `ref`, sync.store.embedded.pool); the plan is sync.store.core.tree_plan's."""
    tree = plan_tree(updates, deletes, _Reads(conn, ref), unscoped)
    old_blobs = _leaf_blobs(conn, [*tree.gone, *tree.replaced])
    conn.executemany(
        "UPDATE nodes SET value = NULL WHERE key = ?", [(k,) for k in tree.gone]
    )
    conn.executemany(
        "INSERT INTO nodes (key, parent, value, is_dir) VALUES (?, ?, NULL, ?)"
        " ON CONFLICT (key) DO UPDATE SET parent = excluded.parent, value = NULL,"
        " is_dir = excluded.is_dir",
        [(k, p, int(d)) for k, (p, d) in tree.shape.items()],
    )
    _mark_ancestors_pending(conn, tree.seeds)
    n_rows = sum(len(u.chunk_ids) for u in updates)
    (first_rid,) = conn.execute(
        "UPDATE state SET value = value + ? WHERE name = 'next_rid' RETURNING value - ?",
        (n_rows, n_rows),
    ).fetchone()
    generation = _bump_generation(conn)
    return (Plan(tree.fids, tree.remove, first_rid, frozenset(old_blobs)), generation)


class _Reads:
    """What the tree plan reads of `ref`'s tree (sync.store.core.tree_plan.TreeReads)."""

    def __init__(self, conn: sqlite3.Connection, ref: bytes) -> None:
        self.conn, self.ref = conn, ref

    def roots(self) -> list[bytes]:
        return [r for (r,) in self.conn.execute(
            "SELECT key FROM nodes WHERE parent IS NULL AND key >= ? AND key < ?",
            ref_bounds(self.ref))]

    def subtree(self, roots: Sequence[bytes]) -> dict[bytes, bool]:
        return _subtree(self.conn, roots)

    def existing(self, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes | None, bool]]:
        return _existing(self.conn, keys)

    def near(self, file_keys: Sequence[bytes]) -> list[bytes]:
        return [k for f in file_keys for (k,) in self.conn.execute(
            "SELECT key FROM nodes WHERE key >= ? AND key < ?",
            tuple(self.ref + b for b in fid_bounds(unscoped(f))))]


def _leaf_blobs(conn: sqlite3.Connection, keys: list[bytes]) -> set[tuple[int, bytes]]:
    """The blobs (fid, value) the committed leaves among `keys` name."""
    out = set()
    for part in batched(keys, SQL_BATCH):
        marks = ",".join("?" * len(part))
        for k, v in conn.execute(f"SELECT key, value FROM nodes WHERE key IN ({marks})"
                                 " AND is_dir = 0 AND value IS NOT NULL", part):
            out.add((fid_of(unscoped(bytes(k))), bytes(v)))
    return out


def commit_values(conn: sqlite3.Connection, plan: Plan, updates: list[Update]) -> int:
    """Step 3 of `WorkspaceStore.apply`, inside the caller's transaction: the leaf values
    set, the nodes of deleted subtrees deleted; returns the generation it bumped to."""
    conn.executemany(
        "UPDATE nodes SET value = ? WHERE key = ? AND is_dir = 0",
        [(u.value, u.file_key) for u in updates],
    )
    conn.executemany("DELETE FROM nodes WHERE key = ?", [(k,) for k in plan.remove])
    return _bump_generation(conn)


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


def _existing(
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
