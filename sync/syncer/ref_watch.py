"""What this checkout last saw of the workspace's other refs, so that a sync reads only
the pages written since it last looked, before it embeds anything.

A chunk is embedded once per team: a teammate's sync leaves the rows of their edit in a
page of their own ref (sync.crypto.pages); when the same file version reaches this checkout
(a `git pull`, a merge, a branch switch, a rebase), its sync finds the rows there and
pulls them instead of embedding and sending them again. To find them without reading
every ref's tree each time, three tables of the state database remember:

- `ref_marks`: each other ref's last write and size as `client.refs()` told them (one
  request): a ref whose mark has not changed has no page this checkout has not seen;
- `ref_nodes`: the values of each other ref's directories as last read, so the walk of
  a changed ref descends only into the buckets that changed (a request per level, as
  the diff of this checkout's own tree);
- `seen_rows`: the file versions (file key, leaf value) each page read names, and in
  which ref: a page holding no row of this checkout's files is forgotten by the page
  index (sync.syncer.paged_sync), and is read again, by key, only once a file here reaches a
  version it names.

Pages are read and checked exactly as at a join (`PagedSync._read`): a page that does
not open under the key is skipped with a warning, and never read again unless its
bucket changes. The store learns what it learned at a join: which pages a checkout
reads, never why.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.pages import PageRow

__all__ = ["RefWatch"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ref_marks (ref BLOB PRIMARY KEY, mark TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ref_nodes (ref BLOB NOT NULL, node BLOB NOT NULL,"
    " value BLOB NOT NULL, PRIMARY KEY (ref, node))",
    "CREATE TABLE IF NOT EXISTS seen_rows (page BLOB NOT NULL, ref BLOB NOT NULL,"
    " file_key BLOB, value BLOB)",
    "CREATE INDEX IF NOT EXISTS seen_rows_version ON seen_rows(file_key, value)",
    "CREATE INDEX IF NOT EXISTS seen_rows_page ON seen_rows(page)",
)

#: Reads pages in the client's ref: page key -> its rows, those that opened.
Reader = Callable[[list[bytes]], dict[bytes, list[PageRow]]]


class RefWatch:
    """The other refs as this checkout last saw them (the module's doc)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        with db:
            for statement in _SCHEMA:
                db.execute(statement)

    def look(self, client: StoreClient, key: WorkspaceKey, known: set[bytes],
             wanted: dict[bytes, bytes], read: Reader) -> bool:
        """Read the pages of other refs this checkout has not seen, then the pages seen
        before that name a version of `wanted` (file key -> leaf value: the files it
        lacks rows of) and that the page index no longer holds. True if any was read."""
        mine = client.ref
        got = False
        try:
            refs = [r for r in sorted(client.refs(), key=lambda r: -r.synced_at)
                    if r.ref != mine]
            live = {r.ref for r in refs}
            self._forget_refs(live)
            for info in refs:
                mark = f"{info.synced_at!r} {info.files} {info.rows}"
                if self._mark(info.ref) == mark:
                    continue
                client.ref = info.ref
                pages, nodes = self._walk(client, key, info.ref)
                fresh = [p for p in pages if p not in known and not self._seen(p)]
                opened = read(fresh) if fresh else {}
                self._record(info.ref, fresh, opened)
                known.update(opened)
                got = got or bool(opened)
                with self.db:
                    self.db.executemany("INSERT OR REPLACE INTO ref_nodes VALUES (?, ?, ?)",
                                        [(info.ref, n, v) for n, v in nodes.items()])
                    self.db.execute("INSERT OR REPLACE INTO ref_marks VALUES (?, ?)",
                                    (info.ref, mark))
            for ref, pages in self._holding(wanted, known, live).items():
                client.ref = ref
                opened = read(pages)
                gone = [p for p in pages if p not in opened]
                with self.db:
                    self.db.executemany("DELETE FROM seen_rows WHERE page = ?",
                                        [(p,) for p in gone])
                known.update(opened)
                got = got or bool(opened)
        finally:
            client.ref = mine
        return got

    def _walk(self, client: StoreClient, key: WorkspaceKey, ref: bytes
              ) -> tuple[list[bytes], dict[bytes, bytes]]:
        """The pages under the directories of `ref`'s tree that changed since last read,
        and the values of the directories read."""
        root = client.root()
        if root is None:
            return [], {}
        before = dict(self.db.execute("SELECT node, value FROM ref_nodes WHERE ref = ?",
                                      (ref,)))
        # A directory with no value yet (a sync of that ref under way) is read, never
        # remembered.
        nodes = {root.key: root.value} if root.value is not None else {}
        if root.value is not None and before.get(root.key) == root.value:
            return [], nodes
        pages: list[bytes] = []
        frontier = [root.key]
        while frontier:
            answer = client.children(frontier)
            frontier = []
            for kids in answer.values():
                for n in kids:
                    if n.is_dir:
                        if n.value is not None:
                            nodes[n.key] = n.value
                        if n.value is None or before.get(n.key) != n.value:
                            frontier.append(n.key)
                    elif n.value == ciphers.page_value(key, n.key):
                        pages.append(n.key)
        return pages, nodes

    def _record(self, ref: bytes, pages: list[bytes],
                opened: dict[bytes, list[PageRow]]) -> None:
        """Remember the versions each page read names (a page of padding alone, or one
        that did not open, names none and is remembered as seen)."""
        rows: list[tuple[bytes, bytes, bytes | None, bytes | None]] = []
        for page in pages:
            versions = {(r.file_key, r.value) for r in opened.get(page, ())}
            named: list[tuple[bytes, bytes, bytes | None, bytes | None]] = [
                (page, ref, f, v) for f, v in versions]
            rows += named or [(page, ref, None, None)]
        with self.db:
            self.db.executemany("INSERT INTO seen_rows VALUES (?, ?, ?, ?)", rows)

    def _holding(self, wanted: dict[bytes, bytes], known: set[bytes],
                 live: set[bytes]) -> dict[bytes, list[bytes]]:
        """ref -> the pages seen in it that name a wanted version and that the page
        index does not hold."""
        out: dict[bytes, set[bytes]] = {}
        for file_key, value in wanted.items():
            for page, ref in self.db.execute(
                    "SELECT page, ref FROM seen_rows WHERE file_key = ? AND value = ?",
                    (file_key, value)):
                page, ref = bytes(page), bytes(ref)
                if page not in known and ref in live:
                    out.setdefault(ref, set()).add(page)
        return {r: sorted(p) for r, p in out.items()}

    def _mark(self, ref: bytes) -> str | None:
        row = self.db.execute("SELECT mark FROM ref_marks WHERE ref = ?", (ref,)).fetchone()
        return None if row is None else str(row[0])

    def _seen(self, page: bytes) -> bool:
        return self.db.execute("SELECT 1 FROM seen_rows WHERE page = ? LIMIT 1",
                               (page,)).fetchone() is not None

    def _forget_refs(self, live: set[bytes]) -> None:
        """Drop what was seen of refs the store no longer has."""
        gone = [bytes(r) for (r,) in self.db.execute("SELECT ref FROM ref_marks")
                if bytes(r) not in live]
        with self.db:
            for table in ("ref_marks", "ref_nodes", "seen_rows"):
                self.db.executemany(f"DELETE FROM {table} WHERE ref = ?", [(r,) for r in gone])
