"""Whether this folder's index was ever completed: `completed` in the client state's
`state_meta` (`.codeveil/state.sqlite`), the time the last sync of it finished.

A folder can hold `.codeveil/config.json` without an index: `codeveil init` alone, or a
first `codeveil index` that stopped before its end (interrupted, its server down). Its
chunk table is then missing or empty, and a command there must say that the index was
never built and what builds it, not that a file is corrupt or that nothing matched.
The mark lives in the client state itself, so a state that was deleted reads as never
built too (and `codeveil index` is the remedy for both), even with no server to say
that it holds the chunks this machine lost.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from indexer.errors import CodeveilError
from indexer.local_chunks import LocalChunks, open_state_db
from sync.config import state_path

__all__ = ["IndexNotBuilt", "check_built", "has_files", "mark_completed",
           "never_completed_message", "was_completed"]

_KEY = "completed"


class IndexNotBuilt(CodeveilError):
    """The folder is set up for codeveil but its first index never completed."""


def mark_completed(root: Path) -> None:
    """Note in `root`'s client state that a sync of it just finished."""
    db = open_state_db(state_path(root))
    try:
        LocalChunks(db).set_meta(_KEY, str(int(time.time())).encode())
    finally:
        db.close()


def was_completed(db: sqlite3.Connection) -> bool:
    """Whether a sync of the index whose client state is `db` ever finished."""
    try:
        return db.execute("SELECT 1 FROM state_meta WHERE key = ?", (_KEY,)).fetchone() \
            is not None
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return False
        raise


def never_completed_message(root: Path) -> str:
    return (f"the index of {root} was never completed on this machine (its first"
            f" `codeveil index` did not finish, or {state_path(root)} was removed); run"
            f" `codeveil index {root}` to build it")


def has_files(db: sqlite3.Connection) -> bool:
    """Whether the chunk table of the client state `db` holds a file (False when it has
    no such table: a lookup never creates the tables)."""
    try:
        return db.execute("SELECT 1 FROM chunk_files LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return False
        raise


def check_built(root: Path, db: sqlite3.Connection) -> None:
    """Raise `IndexNotBuilt` when `root`'s chunk table is empty and no sync of it ever
    finished (an empty index that finished is no error: nothing matches there)."""
    if not was_completed(db) and not has_files(db):
        raise IndexNotBuilt(never_completed_message(root))
