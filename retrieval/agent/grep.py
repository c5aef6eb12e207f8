"""grep: a regular expression over the indexed files, as they are on disk now.

Semantics, the same as ripgrep's default (line-oriented) ones: Python's `re` is searched
in each line of each indexed file (split at "\\n", the newline left out; a final newline
ends the last line rather than starting an empty one), and every line with a match is
returned, in path order, then line order. The files searched are the
ones the index holds (`chunk_files`), read from disk at the time of the call.

Speed: the grep index (retrieval.indexes.trigram_index) names the files whose indexed chunks hold
every trigram the pattern requires (retrieval.indexes.regex_trigrams); only those are read. A
file whose content may differ from what was indexed (its stat differs from the stat
cache's, the cache's digest is not the chunk table's, or the entry is racily clean) is
read too, whatever its trigrams (`Freshness`: in a process that greps more than once,
the directories are watched, so only the files changed since the last call are
stat'ed again). A pattern that requires no trigram reads every file:
never slower than a full scan, and the results are the same set in every case
(`full_scan` is the reference the tests and the benchmark compare with).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import sqlite3
import stat as stat_module
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import xxhash

from indexer.statcache import DEFAULT_RACY_MARGIN_NS, CacheEntry, StatCache
from retrieval.agent.symbols import ToolInputError
from retrieval.indexes import tree_watch
from retrieval.indexes.regex_trigrams import TrigramQuery, required_trigrams
from retrieval.indexes.trigram_index import TrigramIndex

__all__ = ["Freshness", "GrepMatch", "GrepResult", "changed_files", "full_scan", "grep_files",
           "search_file", "whole_text_filter"]

log = logging.getLogger(__name__)

READ_ALL_SHARE: Final = 0.6
"""Above this share of candidate files, grep reads every file rather than stat them."""
MAX_LINE_CHARS: Final = 400
"""A matching line longer than this is shown cut (`GrepMatch.truncated`)."""


@dataclass(frozen=True, slots=True)
class GrepMatch:
    """One matching line: `column` is where its first match starts (1-based)."""

    path: str
    line: int
    column: int
    text: str
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GrepResult:
    """The matching lines; `files_read` of `files_indexed` files were read (the rest were
    ruled out by the index); `truncated`: more lines matched than `limit`."""

    pattern: str
    matches: list[GrepMatch] = field(default_factory=list)
    files_indexed: int = 0
    files_read: int = 0
    narrowed: bool = False  # the index required trigrams (else every file was read)
    truncated: bool = False
    seconds: float = 0.0
    seconds_freshness: float = 0.0  # of which: checking which files changed on disk

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "matches": [m.to_dict() for m in self.matches],
                "files_indexed": self.files_indexed, "files_read": self.files_read,
                "narrowed": self.narrowed, "truncated": self.truncated}


def compile_pattern(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    """The compiled pattern, or ToolInputError naming what is wrong with it."""
    if not pattern:
        raise ToolInputError("the pattern is empty")
    try:
        return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolInputError(f"not a valid regular expression: {pattern!r} ({exc})") from None


def grep_files(root: Path, db: sqlite3.Connection, index: TrigramIndex, pattern: str, *,
               path: str | None = None, ignore_case: bool = False,
               limit: int | None = None, freshness: Freshness | None = None) -> GrepResult:
    """Lines of the indexed files matching `pattern`; `path` keeps files matching a glob
    (as search's `--path`). `freshness` keeps what it read of the stat cache between
    calls."""
    started = time.perf_counter()
    rx = compile_pattern(pattern, ignore_case)
    query = required_trigrams(pattern, rx.flags)
    live = index.live_paths()
    files = [p for p in live if path is None or fnmatch.fnmatch(p, path)]
    result = GrepResult(pattern, files_indexed=len(files))
    if query.op != "all":
        ids = _evaluate(index, query)
        held = {index.paths[i] for i in ids.tolist()}
        held_here = [p for p in files if p in held]
        # When the index rules out few files, reading them all is cheaper than the stat
        # of every file that finding the changed ones takes (and reads a superset).
        if len(held_here) < READ_ALL_SHARE * len(files):
            t0 = time.perf_counter()
            fresh_changed = (freshness or Freshness()).changed(root, db, index.stamp, files)
            result.seconds_freshness = time.perf_counter() - t0
            files = [p for p in files if p in held or p in fresh_changed]
            result.narrowed = True
    files.sort()
    result.files_read = len(files)
    prefilter = whole_text_filter(rx)
    for rel in files:
        for match in search_file(root, rel, rx, prefilter):
            if limit is not None and len(result.matches) >= limit:
                result.truncated = True
                break
            result.matches.append(match)
        if result.truncated:
            break
    result.seconds = time.perf_counter() - started
    return result


def _evaluate(index: TrigramIndex, query: TrigramQuery) -> np.ndarray:
    """Sorted ids of the files that may match `query` (never "all": handled above)."""
    if query.op == "tri":
        return index.files_with(query.code)
    parts = [_evaluate(index, p) for p in query.parts if p.op != "all"]
    if query.op == "and":
        parts.sort(key=len)  # the rarest trigram first: intersections stay small
        out = parts[0]
        for part in parts[1:]:
            if not len(out):
                break
            out = np.intersect1d(out, part, assume_unique=True)
        return out
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint32)


class Freshness:
    """Which indexed files may hold other content on disk than the chunk table: those
    with no stat cache entry, another stat now, a digest other than the chunks', or a
    racily clean entry (statcache's rule). The stat cache's side is read once and kept
    while the chunk table and the stat cache are unchanged.

    The files' side is a stat of every file on every call (what makes grep exact between
    syncs), unless `watch` and the system has inotify (retrieval.indexes.tree_watch): then the
    directories of the files are watched from the first call on, and later calls stat
    again only the files that events named since (plus symlinks, files with other hard
    links and files whose directory could not be watched); a change to a directory
    itself or a lost event makes the next call stat everything again. `last_stats` is
    how many files the last call stat'ed."""

    def __init__(self, *, watch: bool = True) -> None:
        self._key: tuple[object, ...] | None = None
        self._known: dict[str, tuple[int, int, int]] = {}  # path -> (mtime, size, inode)
        # path -> (stat, digest) of racily clean entries: trusted once read and hashed.
        self._racy: dict[str, tuple[tuple[int, int, int], bytes]] = {}
        self._use_watch = watch and tree_watch.available()
        self._watch: tree_watch.TreeWatch | None = None
        self._watch_root: str | None = None
        self._seen: dict[str, tuple[int, int, int] | None] = {}  # stat now; None: gone
        self._always: set[str] = set()  # stat'ed on every call, whatever the events say
        self._lock = threading.Lock()
        self.last_stats = 0

    def changed(self, root: Path, db: sqlite3.Connection, stamp: object,
                paths: Iterable[str]) -> set[str]:
        with self._lock:
            return self._changed(root, db, stamp, paths)

    def _changed(self, root: Path, db: sqlite3.Connection, stamp: object,
                 paths: Iterable[str]) -> set[str]:
        base = os.fspath(root)
        key = (base, stamp, *db.execute(
            "SELECT count(*), max(recorded_ns) FROM stat_cache").fetchone())
        if key != self._key:
            self._known, self._racy = {}, {}
            for p, size, mtime, inode, recorded, digest in db.execute(
                    "SELECT s.path, s.size, s.mtime_ns, s.inode, s.recorded_ns, c.digest"
                    " FROM stat_cache s JOIN chunk_files c ON c.path = s.path"
                    " AND c.digest = s.digest"):
                stat = (mtime, size, inode % (1 << 64))
                if mtime < recorded - DEFAULT_RACY_MARGIN_NS:
                    self._known[p] = stat
                else:
                    self._racy[p] = (stat, bytes(digest))
            self._key = key
        watch = self._current_watch(base)
        seen, always = self._seen, self._always
        stats = 0
        out = set()
        known = self._known
        verified: list[CacheEntry] = []
        for rel in paths:
            if rel not in seen or rel in always:
                seen[rel] = self._stat(base, rel, watch)
                stats += 1
            now = seen[rel]
            if now is None:
                continue  # gone: nothing to read, nothing to match
            if known.get(rel) != now and not self._verify(base, rel, now, verified):
                out.add(rel)
        self.last_stats = stats
        if verified:
            _record(db, verified)
        return out

    def _verify(self, base: str, rel: str, now: tuple[int, int, int],
                verified: list[CacheEntry]) -> bool:
        """Whether a racily clean file (its stat the stat cache's, but written too close
        to when it was read to trust it: `indexer.statcache`) holds what was indexed,
        read and hashed now; then it is known in this process, and recorded anew, so
        that the next process trusts it. A first index records every file of a tree
        written just before as racy: without this, grep read every file until the next
        index."""
        entry = self._racy.get(rel)
        if entry is None or entry[0] != now:
            return False
        read_ns = time.time_ns()  # before the read, as the stat cache records it
        try:
            with open(os.path.join(base, rel), "rb") as f:
                same = xxhash.xxh3_128_digest(f.read()) == entry[1]
        except OSError:
            return False
        if same:
            del self._racy[rel]
            self._known[rel] = now
            mtime, size, inode = now
            verified.append(CacheEntry(rel, size, mtime, inode, entry[1], read_ns))
        return same

    def _current_watch(self, base: str) -> tree_watch.TreeWatch | None:
        """The watch of `base` with what it vouches for applied to `_seen` (the paths
        events named are forgotten, so they are stat'ed again); without a watch, or
        when it cannot be trusted, everything is forgotten."""
        if self._use_watch and self._watch is not None and self._watch_root == base:
            touched = self._watch.drain()
            if touched is not None:
                for rel in touched:
                    self._seen.pop(rel, None)
                return self._watch
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._seen, self._always = {}, set()
        if self._use_watch:
            try:
                self._watch, self._watch_root = tree_watch.TreeWatch(base), base
            except OSError:  # out of inotify instances: stat everything, as without
                self._watch = None
        return self._watch

    def _stat(self, base: str, rel: str,
              watch: tree_watch.TreeWatch | None) -> tuple[int, int, int] | None:
        full = os.path.join(base, rel)
        try:
            if watch is None:
                st = os.stat(full)
            else:
                # Watched before the stat: a change after it is an event for the next call.
                if not watch.watch(rel.rpartition("/")[0]):
                    self._always.add(rel)
                st = os.lstat(full)
                if stat_module.S_ISLNK(st.st_mode) or st.st_nlink > 1:
                    self._always.add(rel)  # its content can change where no watch sees
                    st = os.stat(full)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def close(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None
            self._seen, self._always = {}, set()


def _record(db: sqlite3.Connection, entries: list[CacheEntry]) -> None:
    """Record `entries` in the stat cache of the state `db` reads; a state that cannot
    be written (read-only, locked by a long write) only costs the next grep the reads."""
    try:
        path = db.execute("PRAGMA database_list").fetchone()[2]
        if path:
            with StatCache(path) as cache:
                cache.record_many(entries)
    except (sqlite3.Error, OSError) as exc:
        log.debug("could not record %d verified files in the stat cache: %s",
                  len(entries), exc)


def changed_files(root: Path, db: sqlite3.Connection, paths: Iterable[str]) -> set[str]:
    """`Freshness().changed` once: the indexed `paths` whose content may have changed."""
    return Freshness(watch=False).changed(root, db, None, paths)


def search_file(root: Path, rel: str, rx: re.Pattern[str],
                prefilter: re.Pattern[str] | None = None) -> list[GrepMatch]:
    """The matching lines of one file as it is on disk (none if it cannot be read).

    With `prefilter` (`whole_text_filter(rx)`), the whole text is searched once first
    and lines are tried from the line its first match starts on: a line that `rx`
    matches holds a match of `prefilter`, so no line before that one can match (and a
    file without one has none). Without it, every line is tried."""
    try:
        text = (root / rel).read_bytes().decode("utf-8", "replace")
    except OSError:
        return []
    first = 1
    if prefilter is not None:
        hit = prefilter.search(text)
        if hit is None:
            return []
        start = text.rfind("\n", 0, hit.start()) + 1
        first = text.count("\n", 0, start) + 1
        text = text[start:]
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline ends the last line; no empty line follows it (as rg)
    return [_match(rel, number, line, found)
            for number, line in enumerate(lines, start=first)
            if (found := rx.search(line)) is not None]


def _match(rel: str, number: int, line: str, found: re.Match[str]) -> GrepMatch:
    cut = len(line) > MAX_LINE_CHARS
    return GrepMatch(rel, number, found.start() + 1, line[:MAX_LINE_CHARS] if cut else line,
                     cut)


_LOOKS_BEYOND: Final = re.compile(r"\\[AZ]|\(\?<?[=!]|\(\?[a-zA-Z]*-")


def whole_text_filter(rx: re.Pattern[str]) -> re.Pattern[str] | None:
    """`rx` under MULTILINE, if "no match in the whole text" then proves "no match in
    any line" (`^` and `$` then match at every line's ends, as they do in a line alone);
    None for a pattern that anchors to the string's ends (`\\A`, `\\Z`), looks around
    (it could see a neighbouring line) or turns flags off in a group."""
    if _LOOKS_BEYOND.search(rx.pattern):
        return None
    return re.compile(rx.pattern, rx.flags | re.MULTILINE)


def full_scan(root: Path, paths: Sequence[str], pattern: str, *, path: str | None = None,
              ignore_case: bool = False) -> list[GrepMatch]:
    """Every matching line of every file in `paths`, read and searched one by one: the
    reference grep's results equal."""
    rx = compile_pattern(pattern, ignore_case)
    out = []
    for rel in sorted(paths):
        if path is None or fnmatch.fnmatch(rel, path):
            out.extend(search_file(root, rel, rx))
    return out
