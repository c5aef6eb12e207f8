"""Pages: how a sealed workspace's rows reach its store without naming their file.

A sealed row (sync.crypto.sealed_rows) stored under its file's leaf tells the store which rows
belong together and how many a file has, even padded: enough to label a public file by
its size. In pages, a file's leaf carries no rows at all; the rows travel in pages,
leaves of their own under random keys, each holding PAGE_ROWS rows (padding rows fill
the rest) whose envelopes name, inside, the file version they were cut from (its leaf
value). The store learns how many files and pages there are, and which pages a sync
writes; never a row's file, a file's row count, or which page holds which file.

    page key    16 random bytes, fresh for every page; its buckets are picked from it
    page value  ciphers.page_value(key, page key): the client tells its pages apart from
                files it does not know, and a page is never rewritten (a new one is made)
    page rows   PAGE_ROWS sealed rows (`RowSealer.seal_in_page`), in a random order

A row is *live* while the tree's leaf of its file holds the value the row names; a page
is kept while any of its rows is live. A sync packs the rows it sends, shuffled across
its files, into fresh pages; the free slots of its last page take the live rows of the
emptiest pages that fit there whole, which are then deleted (compaction rides on the
writes a sync makes anyway: no page is rewritten for its own sake, and nothing tells
the store which of a page's rows moved), and the slots still free take single rows
copied from pages drawn at random (the copy's old place stops counting, and its page
goes once its other rows do). So the pages a one-file edit writes hold rows of many
files, not the file and a padding run: over 200 such syncs of the requests tree, an
observer grouping rows by the sync that wrote them pairs rows of one file 60% of the
time against 87% without copies, in the same 54 pages (bench/privacy.py --structure).
A page is written with the leaves of the files it holds rows of, in one `apply`: pages
first, then leaves, then the directories.

Each machine keeps the index of the pages it knows (`PageIndex`, in its state database:
each row's file, version and place): a sync reads the pages another machine wrote
(`Diff.foreign_pages`) before it sends anything, a teammate's join pulls every page
that way, and the vectors of a file it lacks are read from the index, not asked for by
file. A row's vector is kept only until it reaches the embedding cache (a page this
machine wrote keeps none): the cache holds it then, and a row moved to a new page is
sealed again from there.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sync.crypto import ciphers
from sync.crypto.ciphers import ChunkMeta
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import LocalTree, bucket_path, page_name
from sync.crypto.sealed_rows import OpenRow, RowSealer
from sync.errors import MetadataFormatError
from sync.records import KEY_BYTES, ChunkRecord, FileUpdate

#: Rows per page. A one-file edit of up to 64 chunks (nearly every file) writes at most
#: two; the store's row count per page is constant, so a page's size says nothing.
PAGE_ROWS = 32
#: A sync that leaves the live pages' slots more than this many times their live rows
#: (files were deleted: their rows wait in their pages) compacts the emptiest pages,
#: COMPACT_PAGES new pages at most: storage stays within about 1.5x of the rows.
WASTE = 1.5
COMPACT_PAGES = 16
_random = random.SystemRandom()

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS page_rows ("
    " page BLOB NOT NULL, file_key BLOB NOT NULL, value BLOB NOT NULL,"
    " path TEXT NOT NULL, start_line INTEGER NOT NULL, end_line INTEGER NOT NULL,"
    " symbol TEXT NOT NULL, language TEXT NOT NULL, chunk_hash BLOB NOT NULL,"
    " vector BLOB)",
    "CREATE INDEX IF NOT EXISTS page_rows_page ON page_rows(page)",
    "CREATE INDEX IF NOT EXISTS page_rows_file ON page_rows(file_key, value)",
    # A page whose rows are all padding is still a page this machine knows.
    "CREATE TABLE IF NOT EXISTS pages (page BLOB PRIMARY KEY)",
)


@dataclass(frozen=True, slots=True)
class PageRow:
    """One chunk row of a page: the file version it belongs to, and what it holds."""

    file_key: bytes
    value: bytes
    meta: ChunkMeta
    #: None once the embedding cache holds it (`PageIndex.add`, `forget_vectors`).
    vector: np.ndarray | None

    @property
    def identity(self) -> tuple[bytes, bytes, int, int, bytes]:
        """Equal for two copies of one chunk of one file version (a row moved)."""
        return (self.file_key, self.value, self.meta.start_line, self.meta.end_line,
                self.meta.chunk_hash)


class PageIndex:
    """The pages this machine knows, and each one's rows (a table of the state db)."""

    def __init__(self, db: sqlite3.Connection, *, read_only: bool = False) -> None:
        """`read_only` (status, doctor): the tables are not made where they are missing
        (the index reads as empty)."""
        self.db = db
        if read_only:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'page_rows'").fetchone():
                return
            db = sqlite3.connect(":memory:")  # the tables, empty, for this reader alone
            self.db = db
        with db:
            for statement in _SCHEMA:
                db.execute(statement)

    def known(self) -> set[bytes]:
        return {bytes(p) for (p,) in self.db.execute("SELECT page FROM pages")}

    def live(self, owners: dict[bytes, bytes]) -> tuple[dict[bytes, int], dict[bytes, set[bytes]]]:
        """In one pass: every known page -> how many of its rows are live for `owners`
        (file key -> the leaf value the tree holds for it; a copy of a row in two pages
        counts in each), and each file key of `owners` -> the pages holding its rows."""
        counts = dict.fromkeys(self.known(), 0)
        holders: dict[bytes, set[bytes]] = {}
        for page, file_key, value in self.db.execute(
                "SELECT page, file_key, value FROM page_rows"):
            if owners.get(file_key) == value:
                counts[page] = counts.get(page, 0) + 1
                holders.setdefault(file_key, set()).add(page)
        return counts, holders

    def live_rows(self, owners: dict[bytes, bytes]) -> int:
        """How many chunks of `owners` a known page holds a row of (each chunk once)."""
        return len({(bytes(f), start, end, bytes(h)) for f, v, start, end, h in self.db.execute(
            "SELECT file_key, value, start_line, end_line, chunk_hash FROM page_rows")
            if owners.get(bytes(f)) == bytes(v)})

    def live_places(self, owners: dict[bytes, bytes]) -> dict[bytes, set[tuple[int, int, bytes]]]:
        """Each file key of `owners` -> (start line, end line, chunk hash) of every chunk
        of its version that a known page holds a row of."""
        out: dict[bytes, set[tuple[int, int, bytes]]] = {}
        for f, v, start, end, h in self.db.execute(
                "SELECT file_key, value, start_line, end_line, chunk_hash FROM page_rows"):
            if owners.get(bytes(f)) == bytes(v):
                out.setdefault(bytes(f), set()).add((start, end, bytes(h)))
        return out

    def rows_of(self, file_key: bytes, value: bytes) -> list[PageRow]:
        """The rows of one file version, one per chunk, whichever pages hold them."""
        found: dict[tuple, PageRow] = {}
        for row in self._rows("WHERE file_key = ? AND value = ?", (file_key, value)):
            found.setdefault(row.identity, row)
        return list(found.values())

    def page_rows(self, page: bytes) -> list[PageRow]:
        return self._rows("WHERE page = ?", (page,))

    def _rows(self, where: str, args: tuple) -> list[PageRow]:
        return [PageRow(bytes(f), bytes(v),
                        ChunkMeta(path=path, start_line=start, end_line=end, symbol=symbol,
                                  language=language, chunk_hash=bytes(h)),
                        None if vec is None
                        else np.frombuffer(vec, dtype="<f2").astype(np.float32))
                for f, v, path, start, end, symbol, language, h, vec in self.db.execute(
                    "SELECT file_key, value, path, start_line, end_line, symbol, language,"
                    f" chunk_hash, vector FROM page_rows {where}", args)]

    def add(self, pages: dict[bytes, list[PageRow]], *, vectors: bool = True) -> None:
        """Record pages and their chunk rows (padding rows are not recorded); without
        `vectors` (pages this machine wrote: its cache holds them), none is kept."""
        with self.db:
            for page, rows in pages.items():
                self.db.execute("DELETE FROM page_rows WHERE page = ?", (page,))
                self.db.execute("INSERT OR IGNORE INTO pages VALUES (?)", (page,))
                self.db.executemany(
                    "INSERT INTO page_rows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(page, r.file_key, r.value, r.meta.path, r.meta.start_line,
                      r.meta.end_line, r.meta.symbol, r.meta.language, r.meta.chunk_hash,
                      np.asarray(r.vector, dtype="<f2").tobytes()
                      if vectors and r.vector is not None else None) for r in rows])

    def forget_vectors(self, versions: Iterable[tuple[bytes, bytes]]) -> None:
        """The embedding cache holds the vectors of these (file key, value) versions:
        the index keeps their rows' places, not their vectors."""
        with self.db:
            self.db.executemany("UPDATE page_rows SET vector = NULL WHERE file_key = ?"
                                " AND value = ? AND vector IS NOT NULL", list(versions))

    def drop(self, pages: Iterable[bytes]) -> None:
        with self.db:
            for page in pages:
                self.db.execute("DELETE FROM page_rows WHERE page = ?", (page,))
                self.db.execute("DELETE FROM pages WHERE page = ?", (page,))

    def forget_copies(self, copies: Iterable[tuple[bytes, PageRow]]) -> None:
        """(page, row): the row was copied to another page, and this copy of it no longer
        counts here (its page stays, holding it, until its other rows go too)."""
        with self.db:
            self.db.executemany(
                "DELETE FROM page_rows WHERE page = ? AND file_key = ? AND value = ?"
                " AND start_line = ? AND end_line = ? AND chunk_hash = ?",
                [(page, *r.identity) for page, r in copies])


def opened_rows(sealer: RowSealer, key: WorkspaceKey, page: bytes,
                rows: list[tuple[bytes, bytes]]) -> list[PageRow]:
    """A page's rows as the store returned them, opened (padding left out). Raises
    MetadataAuthError / MetadataFormatError for a row that does not open or was not
    sealed in a page."""
    out: list[PageRow] = []
    for row_id, blob in rows:
        opened: OpenRow | None = sealer.open(row_id, page, blob)
        if opened is None:
            continue
        if opened.value is None:
            raise MetadataFormatError(f"row {row_id.hex()} of page {page.hex()} names no file")
        out.append(PageRow(ciphers.node_key(key, opened.meta.path), opened.value,
                           opened.meta, opened.vector))
    return out


@dataclass
class PagedWrite:
    """One apply's pages: the updates that write them, the pages it empties (deleted
    with it), and what the index records once the store took it."""

    updates: list[FileUpdate]
    deletes: list[bytes]
    written: dict[bytes, list[PageRow]]
    #: (page, row): rows copied into the written pages from pages that stay.
    copied: list[tuple[bytes, PageRow]] = field(default_factory=list)


class PageWriter:
    """Packs a sync's rows into pages, and its free slots with the emptiest pages' rows."""

    def __init__(self, key: WorkspaceKey, sealer: RowSealer, index: PageIndex,
                 owners: dict[bytes, bytes], *, fresh: bool = False, keep: bool = False,
                 vectors: Callable[[list[PageRow]], list[np.ndarray | None]] | None = None
                 ) -> None:
        """`fresh`: every page the index knows is left behind (a re-upload sends every
        row again), so none is live and none is filled from. `keep`: every page the
        index knows stays in the tree, live or not, and none is moved or compacted (a
        sync that met another writer of its ref: `PagedSync.diff`). `vectors`: the
        vectors of rows whose vector the index no longer keeps (from the embedding
        cache; None where it lacks one): a page is moved whole or not at all."""
        self.keep = keep
        self.vectors = vectors
        self.key = key
        self.sealer = sealer
        self.index = index
        #: file key -> the leaf value this sync leaves in the tree: what is live.
        self.owners = owners
        self._live, self._holders = ({}, {}) if fresh else index.live(owners)

    def live_pages(self) -> set[bytes]:
        """The pages the tree holds: those with a live row (with `keep`, every one)."""
        return set(self._live) if self.keep else {p for p, n in self._live.items() if n}

    def covered(self) -> set[bytes]:
        """The file keys whose rows a live page holds (as the index was read)."""
        return set(self._holders)

    def write(self, rows: list[PageRow]) -> PagedWrite:
        """The pages that hold `rows`: shuffled across their files, PAGE_ROWS a page; the
        free slots of the last page take the live rows of whole emptiest pages, which go,
        and the slots still free rows copied from pages drawn at random (`_copies`). No
        rows: no pages."""
        if not rows:
            return PagedWrite([], [], {})
        rows = _random.sample(rows, len(rows))
        moved, emptied = ([], []) if self.keep else self._emptiest(-len(rows) % PAGE_ROWS)
        rows += moved
        copied = [] if self.keep else self._copies(-len(rows) % PAGE_ROWS, set(emptied))
        for page, _ in copied:
            self._live[page] -= 1
        rows += [r for _, r in copied]
        updates, written = self._pages(rows, emptied)
        return PagedWrite(updates, emptied, written, copied)

    def compact(self, most: int = COMPACT_PAGES) -> PagedWrite:
        """While the live pages' slots are more than WASTE times their live rows (files
        deleted, whose rows no write has moved yet), the emptiest pages' live rows go
        into fresh pages, `most` at most, and those pages go; nothing while they are
        not."""
        updates: list[FileUpdate] = []
        written: dict[bytes, list[PageRow]] = {}
        emptied: list[bytes] = []
        while len(written) < most and not self.keep:
            live = [n for n in self._live.values() if n]
            if PAGE_ROWS * len(live) <= WASTE * sum(live) + PAGE_ROWS:
                break
            rows, taken = self._emptiest(PAGE_ROWS)
            if len(taken) < 2:
                break  # one page moved into one page gains nothing
            more, pages = self._pages(rows, taken)
            updates += more
            written |= pages
            emptied += taken
        return PagedWrite(updates, emptied, written)

    def _emptiest(self, room: int) -> tuple[list[PageRow], list[bytes]]:
        """The live rows of the emptiest pages that fit whole in `room` slots, and those
        pages (a page one of whose vectors this machine lacks stays)."""
        rows: list[PageRow] = []
        taken: list[bytes] = []
        for page, live in sorted(self._live.items(), key=lambda kv: kv[1]):
            if not live:
                continue  # a page of no live row: the diff deletes it
            if len(rows) + live > room:
                break
            moved = self._with_vectors(self._live_rows(page))
            if moved is not None:
                rows += moved
                taken.append(page)
        return rows, taken

    def _pages(self, rows: list[PageRow], emptied: list[bytes]
               ) -> tuple[list[FileUpdate], dict[bytes, list[PageRow]]]:
        """`rows` in fresh pages, PAGE_ROWS a page, in place of the `emptied` pages."""
        written = {os.urandom(KEY_BYTES): rows[start : start + PAGE_ROWS]
                   for start in range(0, len(rows), PAGE_ROWS)}
        for page in emptied:
            self._live.pop(page, None)
        for page, held in written.items():
            self._live[page] = len(held)
        return [self._page_update(page, held) for page, held in written.items()], written

    def _live_rows(self, page: bytes) -> list[PageRow]:
        return [r for r in self.index.page_rows(page) if self.owners.get(r.file_key) == r.value]

    def _copies(self, free: int, emptied: set[bytes]) -> list[tuple[bytes, PageRow]]:
        """Up to `free` live rows, one from each of as many pages drawn at random: the
        slots padding would fill carry rows of other files instead, so the pages a sync
        writes hold more than the files it changed (a copy's old place no longer counts;
        its page goes once its other rows do)."""
        donors = [p for p, n in self._live.items() if n > 1 and p not in emptied]
        out: list[tuple[bytes, PageRow]] = []
        for page in _random.sample(donors, min(free, len(donors))):
            live = self._live_rows(page)
            if not live:
                continue
            row = self._with_vectors([_random.choice(live)])
            if row is not None:
                out.append((page, row[0]))
        return out

    def _with_vectors(self, rows: list[PageRow]) -> list[PageRow] | None:
        """`rows`, each with its vector; None if one is found nowhere."""
        lacking = [r for r in rows if r.vector is None]
        if not lacking:
            return rows
        found = self.vectors(lacking) if self.vectors is not None else [None] * len(lacking)
        filled = iter(found)
        out = [r if r.vector is not None
               else PageRow(r.file_key, r.value, r.meta, next(filled)) for r in rows]
        return out if all(r.vector is not None for r in out) else None

    def _page_update(self, page: bytes, rows: list[PageRow]) -> FileUpdate:
        sealer = self.sealer
        records = []
        for r in rows:
            assert r.vector is not None, "a row is sealed with its vector"
            rid = os.urandom(KEY_BYTES)
            records.append(ChunkRecord(rid, None, sealer.seal_in_page(rid, page, r.value,
                                                                      r.meta, r.vector)))
        for _ in range(PAGE_ROWS - len(records)):
            rid = os.urandom(KEY_BYTES)
            records.append(ChunkRecord(rid, None, sealer.seal_page_padding(rid, page)))
        _random.shuffle(records)
        return page_update(self.key, page, tuple(records))


def page_update(key: WorkspaceKey, page: bytes, records: tuple[ChunkRecord, ...] = (),
                *, link: bool = False) -> FileUpdate:
    """The update that writes page `page` (or, with `link`, points this ref's tree at
    it in the pool)."""
    return FileUpdate(file_key=page,
                      ancestors=tuple(ciphers.node_key(key, a)
                                      for a in bucket_path(key, page_name(page))),
                      value=ciphers.page_value(key, page), chunks=records, link=link)


class BucketLoad:
    """How many leaves each bucket of the tree holds as pages come and go in a sync, so
    that a bucket a page leaves empty is deleted with it (a bucket left standing with
    no child would make the next sync's root differ)."""

    def __init__(self, tree: LocalTree, key: WorkspaceKey) -> None:
        self.key = key
        self.children = {d: len(c) for d, c in tree.children.items()}

    def add(self, page: bytes) -> None:
        chain = bucket_path(self.key, page_name(page))
        for bucket in reversed(chain):
            self.children[bucket] = self.children.get(bucket, 0) + 1
            if self.children[bucket] > 1:
                break  # it stood already: its parent's count is unchanged

    def remove(self, page: bytes) -> bytes | None:
        """Take `page` out; the node key of the highest bucket left empty by it, if any
        (deleting it deletes the empty ones below)."""
        chain = bucket_path(self.key, page_name(page))
        emptied = None
        for bucket in reversed(chain[1:]):
            self.children[bucket] = left = max(self.children.get(bucket, 1) - 1, 0)
            if left:
                break
            emptied = bucket
        else:
            self.children[chain[0]] = max(self.children.get(chain[0], 1) - 1, 0)
        return ciphers.node_key(self.key, emptied) if emptied is not None else None
