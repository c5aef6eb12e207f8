"""Format versions of the files codeveil keeps, and the rule for reading them.

Every database codeveil writes records the format it was written in (SQLite's
`user_version`). A reader meets one of three cases:

- the version it writes: read it;
- 0, a new file or one written before versions were recorded, whose layout is format 1:
  stamp it with the current version, which is 1 while no format has changed;
- anything else: an older format is migrated by the owner's `migrate` step if it has
  one, else refused; a newer one is always refused, with a one-line message naming the
  file and what to do (the rule restic follows: never misread a format you do not know).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path

from indexer.errors import CodeveilError

__all__ = ["FormatError", "check_sqlite_format", "sqlite_format_problem"]


class FormatError(CodeveilError):
    """A file was written in a format this version of codeveil does not read."""


def check_sqlite_format(
    db: sqlite3.Connection,
    path: Path,
    *,
    what: str,
    version: int,
    remedy: str,
    migrations: Mapping[int, Callable[[sqlite3.Connection], None]] | None = None,
) -> None:
    """Refuse, migrate or stamp the database `db` at `path` (see the module docstring).

    `what` names the file for a user ("the client state"), `remedy` says how to rebuild
    it, and `migrations[n]` turns format n into format n + 1 inside one transaction.
    """
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found == version:
        return
    if found > version:
        raise FormatError(
            f"{path} holds {what} in format {found}, newer than this codeveil reads "
            f"({version}): upgrade codeveil, or {remedy}"
        )
    steps = migrations or {}
    start = max(found, 1)
    if any(n not in steps for n in range(start, version)):
        raise FormatError(
            f"{path} holds {what} in format {found}, which this codeveil no longer reads: "
            f"{remedy}"
        )
    with db:
        for n in range(start, version):
            steps[n](db)
        db.execute(f"PRAGMA user_version = {int(version)}")


def sqlite_format_problem(path: Path, *, what: str, version: int) -> str | None:
    """What is wrong with the format of the database at `path` for a reader of `version`
    (read only, for checks such as `codeveil doctor`), or None if it can be read."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return None  # unreadable: an integrity check reports that
    try:
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError:
        return None
    finally:
        db.close()
    if found > version:
        return (f"holds {what} in format {found}, newer than this codeveil reads ({version}):"
                " upgrade codeveil, or --repair rebuilds it here (the file is kept aside)")
    return None
