"""Remember each file's digest under its stat, so a re-walk reads only changed files.

An entry is trusted only if size, mtime_ns and inode all still match and the entry is
not *racily clean*. A file's mtime has the granularity of the filesystem's clock (a
kernel tick on Linux, 1 s on HFS+, 2 s on FAT), so a write that lands in the same tick
as the read that produced the digest leaves the stat unchanged. Git's answer, used
here too: if the mtime is not safely older than the moment the file was read, the
digest may describe older content, and the file is read again. "Safely older" means
by more than `racy_margin_ns` (2 s by default, the coarsest common granularity, which
also absorbs small clock differences with network filesystems). So a file edited less
than 2 s before a scan is read again by the next scan as well, and then trusted; a file
whose mtime lies in the future is read on every scan until that time has passed.

The cache also remembers files whose contents were rejected (binary, not UTF-8,
minified, generated) so that they are not read again either while unchanged.

Storage: table `stat_cache` in a SQLite file the caller names (other tables may share
the file; only this one is touched), WAL mode. Losing the cache costs one full re-read,
never a wrong answer, so commits are not fsynced individually.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from indexer import sqlite_files
from indexer.local_chunks import STATE_ADVICE
from indexer.walk import FileStat, Skipped, SkipReason, SourceFile, WalkResult, read_source

DEFAULT_RACY_MARGIN_NS = 2_000_000_000
TABLE = "stat_cache"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    digest BLOB NOT NULL,
    recorded_ns INTEGER NOT NULL,
    skip TEXT
) WITHOUT ROWID
"""
_COLUMNS = "path, size, mtime_ns, inode, digest, recorded_ns, skip"
# A verdict stored by another version that this one does not know is not trusted.
_SKIP_REASONS = frozenset(reason.value for reason in SkipReason)

# SQLite integers are signed 64-bit; inode numbers are unsigned and can use the top bit.
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


# A table row as stored: path, size, mtime_ns, inode (signed), digest, recorded_ns, skip.
_Row = tuple[str, int, int, int, bytes, int, str | None]


def _to_i64(value: int) -> int:
    return value - _U64 if value > _I64_MAX else value


def _from_i64(value: int) -> int:
    return value + _U64 if value < 0 else value


# Not frozen: snapshot() builds one per file, and frozen dataclasses cost several times
# as much to build.
@dataclass(slots=True)
class CacheEntry:
    """What was known about a file when it was last read.

    `recorded_ns` is the wall clock just before that read. `skip` is set (and `digest`
    empty) if the contents were rejected, e.g. "binary".
    """

    path: str
    size: int
    mtime_ns: int
    inode: int
    digest: bytes
    recorded_ns: int
    skip: str | None = None

    @classmethod
    def for_source(cls, source: SourceFile) -> CacheEntry:
        st = source.stat
        return cls(source.path, st.size, st.mtime_ns, st.inode, source.digest, source.read_ns)

    @classmethod
    def for_rejected(cls, skipped: Skipped) -> CacheEntry | None:
        """An entry for a file whose contents were rejected, if it can be cached."""
        st = skipped.stat
        if st is None:  # unreadable or vanished: nothing worth remembering
            return None
        reason = str(skipped.reason)
        return cls(skipped.path, st.size, st.mtime_ns, st.inode, b"", skipped.read_ns, reason)

    def as_skipped(self) -> Skipped | None:
        """The cached verdict as a `Skipped`, or None if the entry is an indexable file."""
        if self.skip is None:
            return None
        return Skipped(self.path, SkipReason(self.skip))

    def _row(self) -> _Row:
        inode = _to_i64(self.inode)
        return (
            self.path,
            self.size,
            self.mtime_ns,
            inode,
            self.digest,
            self.recorded_ns,
            self.skip,
        )


class StatCache:
    """path -> (size, mtime_ns, inode, digest, recorded_ns) in one SQLite table.

    Not thread-safe: use one instance per thread (SQLite's own locking makes several
    instances on the same file safe).
    """

    def __init__(
        self, db_path: str | os.PathLike[str], *, racy_margin_ns: int = DEFAULT_RACY_MARGIN_NS
    ) -> None:
        self.racy_margin_ns = racy_margin_ns
        # Autocommit; writes open their own explicit transactions.
        self._db = sqlite_files.connect(Path(db_path), STATE_ADVICE, private=True,
                                        isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 5000")  # the file is shared with other tables
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StatCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def is_fresh(self, entry: CacheEntry, stat: FileStat) -> bool:
        """Whether `entry` still describes a file that now has `stat`."""
        return _row_is_fresh(entry._row(), stat, self.racy_margin_ns)

    def get(self, path: str) -> CacheEntry | None:
        """The stored entry for `path`, fresh or not."""
        row = self._db.execute(f"SELECT {_COLUMNS} FROM {TABLE} WHERE path = ?", (path,)).fetchone()
        return None if row is None else _entry(row)

    def lookup(self, path: str, stat: FileStat) -> CacheEntry | None:
        """The entry for `path` if it can be trusted for a file that now has `stat`.

        The entry's `digest` is then the file's digest (or `skip` says why it is not
        indexed) without reading it. None means: read the file.
        """
        entry = self.get(path)
        return entry if entry is not None and self.is_fresh(entry, stat) else None

    def snapshot(self) -> dict[str, CacheEntry]:
        """Every entry, by path, in one query: the fast way to check a whole walk."""
        return {path: _entry(row) for path, row in self._rows().items()}

    def _rows(self) -> dict[str, _Row]:
        # Raw rows: building a CacheEntry per file would double the cost of a warm scan.
        return {row[0]: row for row in self._db.execute(f"SELECT {_COLUMNS} FROM {TABLE}")}

    def items(self) -> Iterator[tuple[str, CacheEntry]]:
        """(path, entry) for every entry, sorted by path."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY path").fetchall()
        return ((row[0], _entry(row)) for row in rows)

    def all_paths(self) -> set[str]:
        return {row[0] for row in self._db.execute(f"SELECT path FROM {TABLE}")}

    def record_many(self, entries: Iterable[CacheEntry]) -> None:
        """Insert or replace entries, all in one transaction."""
        self._write(
            f"INSERT OR REPLACE INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (entry._row() for entry in entries),
        )

    def forget_many(self, paths: Iterable[str]) -> None:
        """Delete the entries of these paths (unknown paths are fine), in one transaction."""
        self._write(f"DELETE FROM {TABLE} WHERE path = ?", ((path,) for path in paths))

    def clear(self) -> None:
        self._write(f"DELETE FROM {TABLE}", [()])

    def _write(self, sql: str, rows: Iterable[tuple[object, ...]]) -> None:
        rows = list(rows)
        if not rows:
            return  # a warm scan changes nothing and should not take the write lock
        # IMMEDIATE takes the write lock up front, so a concurrent writer makes us wait
        # (busy_timeout) rather than fail halfway through.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(sql, rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _row_is_fresh(row: _Row, stat: FileStat, racy_margin_ns: int) -> bool:
    _, size, mtime_ns, inode, _, recorded_ns, skip = row
    return (
        size == stat.size
        and mtime_ns == stat.mtime_ns
        and inode == _to_i64(stat.inode)
        and mtime_ns < recorded_ns - racy_margin_ns
        and (skip is None or skip in _SKIP_REASONS)
    )


def _entry(row: _Row) -> CacheEntry:
    path, size, mtime_ns, inode, digest, recorded_ns, skip = row
    return CacheEntry(path, size, mtime_ns, _from_i64(inode), digest, recorded_ns, skip)


Reader = Callable[[Path, str], SourceFile | Skipped]


@dataclass(slots=True)
class ScanResult:
    """The state of every candidate file after a scan.

    `digests` covers every indexable file (in walk order, i.e. sorted by path), whether
    its digest came from the cache or from reading it. `read` lists the paths whose
    contents were read this time (new, changed or racily clean files). `skipped` holds
    the walk's skips plus files rejected by their contents. `removed` lists paths that
    were indexable at the previous scan and are not any more (deleted, now ignored or
    skipped).
    """

    digests: dict[str, bytes] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def scan(
    root: str | os.PathLike[str],
    walk: WalkResult,
    cache: StatCache,
    *,
    read: Reader | None = None,
    on_source: Callable[[SourceFile], None] | None = None,
) -> ScanResult:
    """Bring `cache` up to date with `walk`, reading only files whose stat changed.

    `read` reads one file (default: `read_source` with the walk's `max_file_bytes`).
    `on_source` sees each file that was read and found indexable, so that a caller can
    chunk it from the same read instead of reading it again.
    """
    root_path = Path(root)
    if read is None:
        read = functools.partial(read_source, max_file_bytes=walk.max_file_bytes)
    known = cache._rows()
    margin = cache.racy_margin_ns
    result = ScanResult(skipped=list(walk.skipped))
    to_record: list[CacheEntry] = []
    to_forget = list(known.keys() - {item.path for item in walk.files})
    for item in walk.files:
        row = known.get(item.path)
        if row is not None and _row_is_fresh(row, item.stat, margin):
            skip = row[6]
            if skip is None:
                result.digests[item.path] = row[4]
            else:
                result.skipped.append(Skipped(item.path, SkipReason(skip)))
            continue
        result.read.append(item.path)
        outcome = read(root_path, item.path)
        if isinstance(outcome, SourceFile):
            result.digests[item.path] = outcome.digest
            to_record.append(CacheEntry.for_source(outcome))
            if on_source is not None:
                on_source(outcome)
            continue
        result.skipped.append(outcome)
        rejected = CacheEntry.for_rejected(outcome)
        if rejected is not None:
            to_record.append(rejected)
        elif row is not None:  # unreadable now: whatever we knew is void
            to_forget.append(item.path)
    result.skipped.sort(key=lambda s: s.path)
    result.removed = sorted(
        path for path, row in known.items() if row[6] is None and path not in result.digests
    )
    cache.record_many(to_record)
    cache.forget_many(to_forget)
    return result
