"""The client's own record of every chunk of the working tree, in `.codeveil/state.sqlite`.

It holds code, so it never leaves the machine. Search uses it to re-locate a hit whose
file was edited since indexing and to feed the local lexical index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from indexer import sqlite_files
from indexer.chunk import Chunk, chunk_header
from indexer.chunker_stamp import chunker_stamp
from indexer.formats import check_sqlite_format

if TYPE_CHECKING:
    from indexer.definitions import Definition

# The format of state.sqlite as a whole (this table, the stat cache's and the lexical
# index's triggers); raise it, with a migration, whenever any of them changes.
# Format 2 adds the definitions of each file (`definitions`, `definition_files`).
STATE_FORMAT = 2

STATE_ADVICE = (
    "it holds only what the working tree rebuilds: run `codeveil doctor --repair`"
    " (or delete it and run `codeveil index`)"
)

# What each file defines (indexer.definitions), written in the transaction of its
# chunks. `definition_files` says which content a file's list was read from: a file
# whose chunks were written without one (by a codeveil of format 1) has none there,
# and the first lookup reads it from the chunks (retrieval.agent.symbols).
_DEFINITIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS definitions (
    path TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    name TEXT NOT NULL,             -- the last name of the symbol path
    names TEXT NOT NULL,            -- the symbol path, names joined by newlines
    kind TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (path, ordinal)
);
CREATE INDEX IF NOT EXISTS definitions_by_name ON definitions (name);
CREATE TABLE IF NOT EXISTS definition_files (
    path TEXT PRIMARY KEY,
    digest BLOB NOT NULL
) WITHOUT ROWID;
"""

# Which chunker wrote the table (indexer.chunker_stamp), or MIXED_CHUNKERS.
_META_SCHEMA = ("CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value BLOB)"
                " WITHOUT ROWID")
MIXED_CHUNKERS = b"mixed"

_SCHEMA = _DEFINITIONS_SCHEMA + """
CREATE TABLE IF NOT EXISTS chunk_files (
    path TEXT PRIMARY KEY,
    digest BLOB NOT NULL            -- xxh3-128 of the file content the chunks came from
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    path TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    language TEXT NOT NULL,
    symbol TEXT NOT NULL,
    chunk_hash BLOB NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (path, ordinal)
);
CREATE INDEX IF NOT EXISTS chunks_by_hash ON chunks (chunk_hash);
-- Files whose chunks are here (and searchable by name and words) but whose vectors the
-- store does not hold yet: a first index writes chunks ahead of the model.
CREATE TABLE IF NOT EXISTS pending_files (path TEXT PRIMARY KEY) WITHOUT ROWID;
-- A change counter for the indexes built from this table (lexical, vectors): bumped by
-- every write, whoever writes. The triggers sit on the file lists, not on `chunks`:
-- every write touches a file's row in the transaction of its chunks (one bump per file,
-- not per chunk: per-chunk triggers cost +35% insert time), and marking a file stored
-- deletes its `pending_files` row. The epoch changes when the database is recreated.
CREATE TABLE IF NOT EXISTS chunk_generation (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    n INTEGER NOT NULL,
    epoch BLOB NOT NULL
);
INSERT OR IGNORE INTO chunk_generation VALUES (0, 0, randomblob(8));
CREATE TRIGGER IF NOT EXISTS chunk_gen_files_ins AFTER INSERT ON chunk_files
BEGIN UPDATE chunk_generation SET n = n + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS chunk_gen_files_upd AFTER UPDATE ON chunk_files
BEGIN UPDATE chunk_generation SET n = n + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS chunk_gen_files_del AFTER DELETE ON chunk_files
BEGIN UPDATE chunk_generation SET n = n + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS chunk_gen_pending_ins AFTER INSERT ON pending_files
BEGIN UPDATE chunk_generation SET n = n + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS chunk_gen_pending_del AFTER DELETE ON pending_files
BEGIN UPDATE chunk_generation SET n = n + 1 WHERE id = 0; END;
-- The lexical index's own counter, from before this one served every index.
DROP TRIGGER IF EXISTS lexical_gen_ins;
DROP TRIGGER IF EXISTS lexical_gen_upd;
DROP TRIGGER IF EXISTS lexical_gen_del;
DROP TABLE IF EXISTS lexical_generation;
"""


def open_state_db(path: Path) -> sqlite3.Connection:
    """The client state database (WAL, so a search can read while an index writes)."""
    db = sqlite_files.connect(path, STATE_ADVICE, private=True, timeout=30,
                              check_same_thread=False)
    try:
        check_sqlite_format(db, path, what="the client state", version=STATE_FORMAT,
                            remedy="delete it and run `codeveil index` to rebuild it",
                            migrations={1: _add_definitions})
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


def _add_definitions(db: sqlite3.Connection) -> None:
    """Format 1 -> 2: the definition tables, empty (each file's list is read from its
    chunks on first use)."""
    for statement in _DEFINITIONS_SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def change_stamp(db: sqlite3.Connection) -> tuple[int, bytes]:
    """(change counter, database epoch) of the chunk table and its pending list: equal
    stamps mean nothing was written in between. Creates the counter in a database that
    lacks it (new, recreated under an open connection, or older than the counter)."""
    query = "SELECT n, epoch FROM chunk_generation WHERE id = 0"
    try:
        n, epoch = db.execute(query).fetchone()
    except sqlite3.OperationalError:
        LocalChunks(db)
        n, epoch = db.execute(query).fetchone()
    return int(n), bytes(epoch)


def headers_embedded(db: sqlite3.Connection, model_id: str) -> bool:
    """Whether every chunk's header vector under `model_id` was checked to be in the
    embedding cache (`LocalChunks.mark_headers_embedded`); from then on each sync embeds
    the headers of the files it writes."""
    try:
        return db.execute("SELECT 1 FROM embedded_headers WHERE model_id = ?",
                          (model_id,)).fetchone() is not None
    except sqlite3.OperationalError:  # made before chunks had header vectors
        return False


class LocalChunks:
    """path -> the chunks of its current content."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._claimed = False
        # Looks first, so that a reader does not take the write lock once it all exists.
        have = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"
                          " AND name LIKE 'chunk_gen_%'").fetchone()[0]
        if have != _TRIGGERS or _has_old_counter(db) or not _has_definitions(db):
            with db:
                db.executescript(_SCHEMA)

    def _claim(self) -> None:
        """Record which chunker writes this table (indexer.chunker_stamp), inside the
        caller's transaction, once per connection: a table some other chunker wrote to
        (an older codeveil, or one from before stamps) is marked mixed for good, so that
        no other checkout reuses its chunks as its own."""
        if self._claimed:
            return
        self._claimed = True
        self._db.execute(_META_SCHEMA)
        row = self._db.execute("SELECT value FROM state_meta WHERE key = 'chunker'").fetchone()
        ours = chunker_stamp()
        if row is not None and bytes(row[0]) == ours:
            return
        empty = self._db.execute("SELECT 1 FROM chunk_files LIMIT 1").fetchone() is None
        stamp = ours if row is None and empty else MIXED_CHUNKERS
        self._db.execute("INSERT OR REPLACE INTO state_meta VALUES ('chunker', ?)", (stamp,))

    def set_meta(self, key: str, value: bytes) -> None:
        """Set one value of `state_meta` (what the state records about itself)."""
        with self._db:
            self._db.execute(_META_SCHEMA)
            self._db.execute("INSERT OR REPLACE INTO state_meta VALUES (?, ?)", (key, value))

    def file_digests(self) -> dict[str, bytes]:
        return dict(self._db.execute("SELECT path, digest FROM chunk_files"))

    def replace_files(self, items: Sequence[tuple[str, bytes, Sequence[Chunk]]], *,
                      pending: bool = False,
                      definitions: Mapping[str, Sequence[Definition]] | None = None) -> None:
        """Store the chunks of each (path, digest, chunks) in one transaction; `pending`
        marks them as still waiting for their vectors to reach the store.
        `definitions[path]` is what the file defines; a file missing there has its list
        read from its chunks when first asked for."""
        with self._db:
            self._claim()
            for path, digest, chunks in items:
                defined = definitions.get(path) if definitions is not None else None
                self._write_definitions(path, digest, defined)
                self._db.execute(
                    "INSERT OR IGNORE INTO pending_files VALUES (?)" if pending
                    else "DELETE FROM pending_files WHERE path = ?", (path,))
                self._db.execute("DELETE FROM chunks WHERE path = ?", (path,))
                self._db.executemany(
                    "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            path,
                            i,
                            c.start_line,
                            c.end_line,
                            c.language,
                            c.symbol,
                            c.chunk_hash,
                            c.text,
                        )
                        for i, c in enumerate(chunks)
                    ],
                )
                self._db.execute(
                    "INSERT OR REPLACE INTO chunk_files (path, digest) VALUES (?, ?)",
                    (path, digest),
                )

    def _write_definitions(self, path: str, digest: bytes,
                           defined: Sequence[Definition] | None) -> None:
        self._db.execute("DELETE FROM definitions WHERE path = ?", (path,))
        if defined is None:
            self._db.execute("DELETE FROM definition_files WHERE path = ?", (path,))
            return
        self._db.executemany(
            "INSERT INTO definitions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(path, i, d.names[-1], "\n".join(d.names), d.kind, d.start_line, d.end_line,
              d.signature) for i, d in enumerate(defined) if d.names])
        self._db.execute("INSERT OR REPLACE INTO definition_files VALUES (?, ?)",
                         (path, digest))

    def set_definitions(self, path: str, digest: bytes,
                        defined: Sequence[Definition]) -> bool:
        """Record what `path` defines, read from the chunks of content `digest`, unless
        its chunks changed meanwhile. Whether it was recorded."""
        with self._db:
            row = self._db.execute("SELECT digest FROM chunk_files WHERE path = ?",
                                   (path,)).fetchone()
            if row is None or bytes(row[0]) != digest:
                return False
            self._claim()
            self._write_definitions(path, digest, defined)
            return True

    def mark_stored(self, paths: Iterable[str]) -> None:
        """The store now holds the vectors of these files."""
        with self._db:
            self._db.executemany("DELETE FROM pending_files WHERE path = ?",
                                 [(p,) for p in paths])

    def pending_files(self) -> set[str]:
        return {p for (p,) in self._db.execute("SELECT path FROM pending_files")}

    def coverage(self) -> tuple[int, int]:
        """(chunks, chunks whose vectors the store holds)."""
        total = self.count()
        pending = self._db.execute(
            "SELECT count(*) FROM chunks WHERE path IN (SELECT path FROM pending_files)"
        ).fetchone()[0]
        return total, total - pending

    def remove_files(self, paths: Iterable[str]) -> None:
        with self._db:
            for path in paths:
                self._db.execute("DELETE FROM pending_files WHERE path = ?", (path,))
                self._db.execute("DELETE FROM chunks WHERE path = ?", (path,))
                self._db.execute("DELETE FROM chunk_files WHERE path = ?", (path,))
                self._db.execute("DELETE FROM definitions WHERE path = ?", (path,))
                self._db.execute("DELETE FROM definition_files WHERE path = ?", (path,))

    def by_hash(self, chunk_hash: bytes) -> list[Chunk]:
        return [
            _row(r)
            for r in self._db.execute(
                "SELECT path, start_line, end_line, language, symbol, text FROM chunks"
                " WHERE chunk_hash = ?",
                (chunk_hash,),
            )
        ]

    def for_file(self, path: str) -> list[Chunk]:
        return [
            _row(r)
            for r in self._db.execute(
                "SELECT path, start_line, end_line, language, symbol, text FROM chunks"
                " WHERE path = ? ORDER BY ordinal",
                (path,),
            )
        ]

    def definitions_for(self, path: str) -> list[Definition]:
        """What `path` defines, as its last write recorded it, in file order."""
        from indexer.definitions import Definition  # parsers and all: only when asked

        return [Definition(tuple(names.split("\n")), kind, start, end, signature)
                for names, kind, start, end, signature in self._db.execute(
                    "SELECT names, kind, start_line, end_line, signature FROM definitions"
                    " WHERE path = ? ORDER BY ordinal", (path,))]

    def iter_all(self) -> Iterator[tuple[int, Chunk]]:
        """(rowid, chunk) of every chunk, in a stable order."""
        for rowid, *rest in self._db.execute(
            "SELECT rowid, path, start_line, end_line, language, symbol, text FROM chunks"
            " ORDER BY rowid"
        ):
            yield rowid, _row(rest)

    def count(self) -> int:
        return self._db.execute("SELECT count(*) FROM chunks").fetchone()[0]

    def headers(self) -> set[str]:
        """The distinct `path > symbol` headers of the chunks (`Chunk.header`)."""
        return {chunk_header(p, s) for p, s in self._db.execute(
            "SELECT DISTINCT path, symbol FROM chunks")}

    def headers_embedded(self, model_id: str) -> bool:
        return headers_embedded(self._db, model_id)

    def mark_headers_embedded(self, model_id: str) -> None:
        """Record `headers_embedded(model_id)`, and bump the change counter so that the
        indexes built from this table re-read the chunks that lacked one."""
        with self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS embedded_headers"
                             " (model_id TEXT PRIMARY KEY) WITHOUT ROWID")
            self._db.execute("INSERT OR IGNORE INTO embedded_headers VALUES (?)", (model_id,))
            self._db.execute("UPDATE chunk_generation SET n = n + 1 WHERE id = 0")

    def places(self) -> dict[str, set[tuple[int, int, bytes]]]:
        """path -> (start line, end line, chunk hash) of each of its chunks: what a
        sealed row names of the chunk it holds (sync.crypto.pages)."""
        out: dict[str, set[tuple[int, int, bytes]]] = {}
        for path, start, end, chunk_hash in self._db.execute(
                "SELECT path, start_line, end_line, chunk_hash FROM chunks"):
            out.setdefault(path, set()).add((start, end, bytes(chunk_hash)))
        return out

    def files_with_chunks(self) -> set[str]:
        """The paths that have at least one chunk (an empty file has none)."""
        return {p for (p,) in self._db.execute("SELECT DISTINCT path FROM chunks")}

    def count_files(self) -> int:
        return self._db.execute("SELECT count(*) FROM chunk_files").fetchone()[0]


_TRIGGERS = 5


def _has_definitions(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'definition_files'"
                      ).fetchone() is not None


def _has_old_counter(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'lexical_generation'"
                      ).fetchone() is not None


def _row(r: Sequence) -> Chunk:
    path, start, end, language, symbol, text = r
    return Chunk(
        path=path, start_line=start, end_line=end, language=language, symbol=symbol, text=text
    )


#: SQLite's host parameters per statement, with a margin.
SQL_BATCH = 900


def count_chunks(db: sqlite3.Connection, paths: Sequence[str]) -> int:
    """How many chunks the chunk table holds for `paths` (the local indexes weigh an
    update against a rebuild by it)."""
    total = 0
    for start in range(0, len(paths), SQL_BATCH):
        part = list(paths[start : start + SQL_BATCH])
        marks = ",".join("?" * len(part))
        total += db.execute(f"SELECT count(*) FROM chunks WHERE path IN ({marks})",
                            part).fetchone()[0]
    return total


def snapshot_reader(db: sqlite3.Connection) -> sqlite3.Connection:
    """A connection of its own to the state database, so that a refresh reads one
    snapshot whatever transaction the caller's connection is in."""
    for _seq, name, file in db.execute("PRAGMA database_list"):
        if name == "main" and file:
            return sqlite3.connect(file, timeout=30, isolation_level=None)
    raise sqlite3.DatabaseError("the state database has no file to read a snapshot of")
