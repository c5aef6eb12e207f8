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

import contextlib
import sqlite3
import time
from pathlib import Path

from indexer.errors import CodeveilError
from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import load_config, state_path

__all__ = ["IndexNotBuilt", "check_built", "has_files", "mark_completed",
           "never_completed_message", "other_workspace", "recorded_workspace",
           "was_completed"]

_KEY = "completed"
#: The workspace whose files the state holds: a state copied from another checkout (of
#: another workspace) would answer with that checkout's chunks.
_WORKSPACE = "workspace_id"


class IndexNotBuilt(CodeveilError):
    """The folder is set up for codeveil but its first index never completed."""


def mark_completed(root: Path) -> None:
    """Note in `root`'s client state that a sync of it just finished."""
    db = open_state_db(state_path(root))
    try:
        local = LocalChunks(db)
        local.set_meta(_KEY, str(int(time.time())).encode())
        # A config changed under the sync: its next run records it.
        with contextlib.suppress(CodeveilError):
            local.set_meta(_WORKSPACE, load_config(root).workspace_id.encode())
    finally:
        db.close()


def recorded_workspace(db: sqlite3.Connection) -> str | None:
    """The workspace whose files the client state `db` holds, as its last completed sync
    recorded it; None when it records none (made before states recorded it)."""
    try:
        row = db.execute("SELECT value FROM state_meta WHERE key = ?", (_WORKSPACE,)
                         ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if row is None else bytes(row[0]).decode("utf-8", "replace")


def other_workspace(root: Path, db: sqlite3.Connection) -> str | None:
    """What is wrong when the client state `db` records another workspace than the one
    `root`'s config names (a copy of another checkout's); None when it is this one's, or
    records none."""
    held, named = recorded_workspace(db), load_config(root).workspace_id
    if held is None or held == named:
        return None
    return (f"the client state {state_path(root)} holds the files of workspace {held}, not"
            f" of {named} that config.json names (another checkout's copy?); run `codeveil"
            " doctor --repair` to rebuild it from the working tree")


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
    other = other_workspace(root, db)
    if other is not None:
        raise CodeveilError(other)
