"""Whether this folder's index was ever completed: `.codeveil/indexed`, written when a
sync of it first finishes (and touched by each one after).

A folder can hold `.codeveil/config.json` without an index: `codeveil init` alone, or a
first `codeveil index` that stopped before its end (interrupted, its server down). Its
chunk table is then missing or empty, and a command there must say that the index was
never built and what builds it, not that a file is corrupt or that nothing matched.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from indexer.errors import CodeveilError
from sync.config import codeveil_dir

__all__ = ["IndexNotBuilt", "check_built", "local_files", "mark_completed",
           "never_completed_message", "was_completed"]


class IndexNotBuilt(CodeveilError):
    """The folder is set up for codeveil but its first index never completed."""


def _marker(root: Path) -> Path:
    return codeveil_dir(root) / "indexed"


def mark_completed(root: Path) -> None:
    """Note that a sync of `root`'s index just finished."""
    _marker(root).touch()


def was_completed(root: Path) -> bool:
    return _marker(root).is_file()


def never_completed_message(root: Path) -> str:
    return (f"the index of {root} was never completed (its first `codeveil index` did not"
            f" finish); run `codeveil index {root}` to build it")


def local_files(db: sqlite3.Connection) -> int:
    """Files in the chunk table of the client state `db`, 0 when it has no such table
    (read only: a lookup never creates the tables)."""
    try:
        return int(db.execute("SELECT count(*) FROM chunk_files").fetchone()[0])
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return 0
        raise


def check_built(root: Path, db: sqlite3.Connection) -> None:
    """Raise `IndexNotBuilt` when `root`'s chunk table is empty and no sync of it ever
    finished (an empty index that finished is no error: nothing matches there)."""
    if not local_files(db) and not was_completed(root):
        raise IndexNotBuilt(never_completed_message(root))
