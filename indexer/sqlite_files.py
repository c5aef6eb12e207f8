"""SQLite connections that know which file they are, so that corruption is reported as
"this file is damaged, do this" rather than as a bare SQLite error.

codeveil keeps several SQLite files whose damage calls for different remedies: the
client state (rebuilt from the working tree), the embedding cache (recomputed), a
store's Merkle tree (rebuilt from the working tree, or restored), a server's registry
(restored from a backup: it holds the tokens). `connect(path, advice)` returns a
connection whose statements raise `CorruptFileError` naming `path` and `advice` when
SQLite reports the file as damaged or not a database; other errors (a locked database,
a constraint) pass through as they are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from indexer.errors import CodeveilError
from indexer.private_files import private_file

# SQLite's primary result codes for a damaged file (extended codes share the low byte).
_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_CORRUPT_WORDS = ("malformed", "not a database", "corrupt")


class CorruptFileError(CodeveilError, sqlite3.DatabaseError):
    """A SQLite file codeveil keeps is damaged; the message names it and the remedy.

    Also a `sqlite3.DatabaseError`, so code that handles those keeps working."""

    def __init__(self, path: Path, advice: str, cause: BaseException) -> None:
        super().__init__(f"{path} is corrupt ({cause}); {advice}")
        self.path = path
        self.advice = advice


def is_corruption(exc: BaseException) -> bool:
    """Whether a SQLite error says the file itself is damaged."""
    if isinstance(exc, CorruptFileError):
        return True
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _CORRUPT_CODES:
        return True
    return any(word in str(exc).lower() for word in _CORRUPT_WORDS)


class FileConnection(sqlite3.Connection):
    """A connection that turns corruption errors into `CorruptFileError`."""

    path: Path
    advice: str

    def _wrap(self, exc: sqlite3.DatabaseError) -> BaseException:
        if is_corruption(exc) and not isinstance(exc, CorruptFileError):
            return CorruptFileError(self.path, self.advice, exc)
        return exc

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise self._wrap(exc) from exc

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise self._wrap(exc) from exc

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        try:
            return super().executescript(script)
        except sqlite3.DatabaseError as exc:
            raise self._wrap(exc) from exc

    def commit(self) -> None:
        try:
            super().commit()
        except sqlite3.DatabaseError as exc:
            raise self._wrap(exc) from exc


def connect(path: Path, advice: str, *, private: bool = False, **kwargs: Any) -> FileConnection:
    """`sqlite3.connect(path, **kwargs)` whose corruption errors name `path` and `advice`.

    `private`: the file (created if absent) is its owner's only, 0600 in a 0700 folder,
    for files that hold code or vectors."""
    if private:
        private_file(Path(path))
    conn = sqlite3.connect(path, factory=FileConnection, **kwargs)
    assert isinstance(conn, FileConnection)
    conn.path, conn.advice = Path(path), advice
    return conn


def integrity_problem(path: Path) -> str | None:
    """None if `path` passes SQLite's quick check, else what is wrong (one line)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()
    if rows == [("ok",)]:
        return None
    return "; ".join(str(r[0]) for r in rows[:3])
