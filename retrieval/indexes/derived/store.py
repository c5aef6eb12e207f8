"""Keeping a derived index in step with the chunk table: the one refresh every local
index (lexical, vectors, grep) runs, each supplying what it covers and how it builds.

    stamp -> file diff -> rebuild or update -> merge -> atomic save

`DerivedStore.current` reads the chunk table's change stamp (`indexer.local_chunks`,
one small row) and returns the index in memory, or the saved one, while the stamp
matches. Else it refreshes in one WAL snapshot of the state database (stamp, file list
and rows agree): the files the index covers are compared with the ones it was built
from (path -> content digest); the changed, new and dropped files (and the files the
index holds only in part) are re-read, or every file when that would be more than the
index's rebuild share; a rebuild makes a new base, an update masks the dropped rows and
puts the re-read ones in a delta, and a delta grown past the index's merge share is
merged into a new base. The result is saved atomically (`indexer.private_files`);
a save that fails (a full or read-only disk) costs the next process a rebuild, never
this search. Saved files that cannot be read are rebuilt with one warning.

What a store supplies, as methods (see `DerivedStore`): its stamp, the files it covers,
when a refresh rebuilds, how it reads rows, builds an index, updates one, and how the
index is laid out on disk. The index itself answers `needs_merge()` and `merged()`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import sqlite3
import threading
import time
import zipfile
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, Protocol, Self, TypeVar

from indexer.local_chunks import SQL_BATCH, change_stamp, snapshot_reader
from retrieval.indexes.derived.spill import trim_heap

#: What reading a damaged saved file raises (besides FileNotFoundError: no index yet).
UNREADABLE: Final = (OSError, ValueError, EOFError, KeyError, IndexError, TypeError,
                     UnicodeDecodeError, zipfile.BadZipFile)

# A base file nothing points to (left by a crash) is removed once this old, so that a
# base another process has just written, and is about to point to, is left alone.
ORPHAN_AGE_S: Final = 3600.0


class Segmented(Protocol):
    """An index of a base and a delta: when and how its delta folds into a new base."""

    def needs_merge(self) -> bool: ...

    def merged(self) -> Self: ...


I = TypeVar("I", bound=Segmented)  # noqa: E741 (the index type, as in the docs)
R = TypeVar("R")  # the rows a store reads for a build or an update


@dataclass
class Saved(Generic[I]):
    """An index and what it was built from: the state a refresh compares against."""

    index: I
    stamp: Hashable  # the chunk table's change stamp it matches
    files: dict[str, bytes]  # path -> content digest of the files it covers
    base_id: bytes  # names its base on disk; new whenever the base is rebuilt or merged
    key: Hashable = None  # what else it is of (the vectors' model and dim)
    # path -> chunks it covers without (the vectors the cache lacked): re-read next time.
    incomplete: dict[str, int] = field(default_factory=dict)


@dataclass
class FileDiff:
    """What a refresh re-reads: every covered file (`rebuild`), or the changed ones."""

    files: dict[str, bytes]  # path -> content digest of the files to cover now
    changed: list[str]
    dropped: list[str]
    rebuild: bool

    @property
    def to_read(self) -> list[str] | None:
        """The files whose rows a refresh reads; None: every covered file."""
        return None if self.rebuild else self.changed


class DerivedStore(Generic[I, R]):
    """One derived index of a repo under `directory`, kept current; thread-safe.

    Subclasses set `label` (as log lines name the index) and `log`, and implement the
    hooks below the line.
    """

    label: str = "index"
    log: logging.Logger = logging.getLogger(__name__)

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._saved: Saved[I] | None = None
        self._lock = threading.RLock()  # a store's `current` may hold it around `_current`
        #: What the last refresh did and how long it took (for benchmarks and logs).
        self.last_refresh: dict[str, float | int | str] = {}

    def _current(self, db: sqlite3.Connection, key: Hashable = None) -> I:
        with self._lock:
            stamp = self.read_stamp(db)
            saved = self._saved
            if saved is not None and saved.stamp == stamp and saved.key == key:
                return saved.index
            if saved is None or saved.key != key:
                saved = self._load(key)
                if saved is not None and saved.stamp == stamp:
                    self._saved = saved
                    return saved.index
            self._saved = self._refresh(db, saved, key)
            return self._saved.index

    # -- disk -----------------------------------------------------------------------

    def _load(self, key: Hashable) -> Saved[I] | None:
        try:
            return self._read_saved(key)
        except FileNotFoundError as exc:
            # No index yet, or another process replaced a base just now.
            self.log.debug("no usable %s in %s (%s)", self.label, self.directory, exc)
            return None
        except UNREADABLE as exc:
            # Truncated or garbled: it only caches what the state database (and the
            # embedding cache) hold, so it is rebuilt, not fatal.
            self.log.warning("the %s in %s is damaged (%s); rebuilding it",
                             self.label, self.directory, exc)
            return None

    def remove_old_bases(self, pattern: re.Pattern[str], keep: bytes,
                         replaced: bytes | None, temp_prefix: str | None = None) -> None:
        """Remove the base files (names `pattern` matches, its group 1 the base id) other
        than `keep`'s: `replaced`'s at once, any other (a crash's orphan) and leftover
        temp files once ORPHAN_AGE_S old."""
        now = time.time()
        for entry in self.directory.iterdir():
            m = pattern.match(entry.name)
            stale_tmp = temp_prefix is not None and entry.name.startswith(temp_prefix)
            if not (m or stale_tmp) or (m and m.group(1) == keep.hex()):
                continue
            with contextlib.suppress(OSError):  # already gone, or still mapped on Windows
                ours = m is not None and replaced is not None and m.group(1) == replaced.hex()
                if ours or now - entry.stat().st_mtime > ORPHAN_AGE_S:
                    entry.unlink()

    # -- refresh --------------------------------------------------------------------

    def _refresh(self, db: sqlite3.Connection, old: Saved[I] | None,
                 key: Hashable) -> Saved[I]:
        """Bring the index in line with the chunk table, read in one snapshot."""
        t0 = time.perf_counter()
        reader = snapshot_reader(db)
        try:
            reader.execute("BEGIN")  # one WAL snapshot: stamp, file list and rows agree
            stamp = self.read_stamp(reader)
            diff = self._diff(reader, old, key, stamp)
            rows, incomplete = self._read_rows(reader, diff, key)
            reader.execute("COMMIT")
        finally:
            reader.close()
        t1 = time.perf_counter()
        if diff.rebuild or old is None:
            index = self._build(rows, key, sum(incomplete.values()))
            mode = "rebuild"
        else:
            reread = {*diff.changed, *diff.dropped}
            incomplete = {**{p: k for p, k in old.incomplete.items() if p not in reread},
                          **incomplete}
            index = self._update(old.index, reread, rows, key, sum(incomplete.values()))
            mode = "update"
            if index.needs_merge():
                index = index.merged()
                mode = "merge"
        base_id = old.base_id if mode == "update" and old is not None else secrets.token_bytes(8)
        saved = self._saved_of(index, stamp, diff.files, base_id, key, incomplete)
        t2 = time.perf_counter()
        try:
            self._write(saved, old, base_changed=mode != "update")
        except OSError as exc:
            # A read-only or full disk costs the next process a rebuild, not this search.
            self.log.warning("could not save the %s in %s: %s", self.label, self.directory,
                             exc)
        self.last_refresh = {
            **self._report(saved, mode, rows),
            "seconds_read": round(t1 - t0, 4), "seconds_build": round(t2 - t1, 4),
            "seconds_save": round(time.perf_counter() - t2, 4),
        }
        self.log.debug("%s refresh: %s", self.label, self.last_refresh)
        trim_heap()  # the refresh's transient arrays, handed back
        return saved

    def _diff(self, reader: sqlite3.Connection, old: Saved[I] | None, key: Hashable,
              stamp: Hashable) -> FileDiff:
        files = self._covered(reader)
        if old is None or not self._continues(old, stamp):
            # No index, or a recreated database, whose rows may be cut differently
            # from the same files: start over.
            return FileDiff(files, [], [], True)
        again = self._reread(reader, old, key)
        changed = [p for p, d in files.items()
                   if old.files.get(p) != d or p in old.incomplete or p in again]
        dropped = [p for p in old.files if p not in files]
        return FileDiff(files, changed, dropped, self._rebuilds(reader, changed, files))

    def _saved_of(self, index: I, stamp: Hashable, files: dict[str, bytes], base_id: bytes,
                  key: Hashable, incomplete: dict[str, int]) -> Saved[I]:
        return Saved(index, stamp, files, base_id, key, incomplete)

    # -- what a store supplies ------------------------------------------------------

    def read_stamp(self, db: sqlite3.Connection) -> Hashable:
        """The chunk table's change stamp as it is now (equal: nothing changed)."""
        raise NotImplementedError

    def _covered(self, reader: sqlite3.Connection) -> dict[str, bytes]:
        """path -> content digest of every file the index covers."""
        return read_files(reader)

    def _continues(self, old: Saved[I], stamp: Hashable) -> bool:
        """Whether `old` can be updated to `stamp` (else rebuilt): same database."""
        return True

    def _reread(self, reader: sqlite3.Connection, old: Saved[I], key: Hashable) -> set[str]:
        """Unchanged files to read again all the same."""
        return set()

    def _rebuilds(self, reader: sqlite3.Connection, changed: list[str],
                  files: dict[str, bytes]) -> bool:
        """Whether re-reading `changed` costs enough that a rebuild is as cheap."""
        raise NotImplementedError

    def _read_rows(self, reader: sqlite3.Connection, diff: FileDiff,
                   key: Hashable) -> tuple[R, dict[str, int]]:
        """The rows of `diff.changed` (of every covered file if `diff.rebuild`), read
        inside the snapshot, and path -> chunks left out of them."""
        raise NotImplementedError

    def _build(self, rows: R, key: Hashable, missing: int) -> I:
        raise NotImplementedError

    def _update(self, index: I, drop: set[str], rows: R, key: Hashable, missing: int) -> I:
        """`index` without the chunks of `drop`, with `rows` (not merged yet)."""
        raise NotImplementedError

    def _read_saved(self, key: Hashable) -> Saved[I] | None:
        """The saved index (None if of another key or format); raises what reading a
        missing or damaged file raises."""
        raise NotImplementedError

    def _write(self, saved: Saved[I], old: Saved[I] | None, *, base_changed: bool) -> None:
        raise NotImplementedError

    def _report(self, saved: Saved[I], mode: str, rows: R) -> dict[str, Any]:
        return {"mode": mode}


# -- reading the chunk table -----------------------------------------------------------

Stamp = tuple[int, int, bytes]  # (change counter, chunk count, database epoch)


def read_stamp(db: sqlite3.Connection) -> Stamp:
    """(change counter, chunk count, database epoch) of the chunk table as it is now:
    the stamp of the indexes that cover every file (lexical, grep)."""
    n, epoch = change_stamp(db)
    count = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return n, int(count), epoch



def read_files(db: sqlite3.Connection, *, ready_only: bool = False) -> dict[str, bytes]:
    """path -> content digest of the chunk table's files (with `ready_only`, of those
    not pending: their vectors are not ready yet)."""
    where = " WHERE path NOT IN (SELECT path FROM pending_files)" if ready_only else ""
    return {p: bytes(d) for p, d in db.execute(f"SELECT path, digest FROM chunk_files{where}")}


def chunk_rows(db: sqlite3.Connection, columns: str, paths: Sequence[str] | None, *,
               order: str, ready_only: bool = False) -> Iterator[tuple[Any, ...]]:
    """`columns` of the chunks of `paths` (of every file if None; with `ready_only`, of
    every file not pending), in `order` within each batch of paths."""
    if paths is None:
        where = " WHERE path NOT IN (SELECT path FROM pending_files)" if ready_only else ""
        yield from db.execute(f"SELECT {columns} FROM chunks{where} ORDER BY {order}")
        return
    for start in range(0, len(paths), SQL_BATCH):
        part = list(paths[start : start + SQL_BATCH])
        marks = ",".join("?" * len(part))
        yield from db.execute(
            f"SELECT {columns} FROM chunks WHERE path IN ({marks}) ORDER BY {order}", part)
