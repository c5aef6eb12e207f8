"""The lexical index of one repo on disk, under `.codeveil/lexical/`, kept in step with
the chunk table.

`base.npz` holds the base segment (with the format version and BM25's k1 and b);
`delta.npz` the delta segment, the mask of deleted base docs, the file list
(path -> content digest) the index holds and the stamp it was built at. A refresh reads
the chunk table in one snapshot and tokenizes only the chunks of the files that changed,
or all of them when that would be more than REBUILD_SHARE of the table.

Knowing when to refresh: triggers on the chunk table's file list bump a counter in the
state database on every insert, replace or delete, whoever writes (`codeveil index`, the
daemon). A search compares that counter (with the chunk count and a random epoch that
changes if the database is recreated) with the one the saved index was built at; when
they agree, checking costs one small query.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from indexer.chunk import Chunk
from indexer.local_chunks import SQL_BATCH, change_stamp, count_chunks, snapshot_reader
from retrieval.lexical.index import K1, B, LexicalIndex
from retrieval.lexical.segments import (
    _Counts,
    _doc,
    _pack,
    _save_npz,
    _Segment,
    _unpack,
    digest_rows,
)
from retrieval.lexical.tokens import Tokenizer, _counts_of, lexical_text

# Log lines name the package ("retrieval.lexical"), whichever of its modules writes them.
log = logging.getLogger("retrieval.lexical")

FORMAT_VERSION: Final = 3
BASE_FILE: Final = "base.npz"
DELTA_FILE: Final = "delta.npz"
# A refresh that would re-tokenize more than this share of chunks rebuilds from scratch.
REBUILD_SHARE: Final = 0.5

# SQLite's limit on host parameters per statement; stay well below it.

Stamp = tuple[int, int, bytes]  # (change counter, chunk count, database epoch)


def read_stamp(db: sqlite3.Connection) -> Stamp:
    """(change counter, chunk count, database epoch) of the chunk table as it is now."""
    n, epoch = change_stamp(db)
    count = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return n, int(count), epoch


@dataclass
class _Saved:
    index: LexicalIndex
    stamp: Stamp
    files: dict[str, bytes]  # path -> content digest the index holds the chunks of
    base_id: bytes  # ties a saved delta to the base it was made against


class LexicalStore:
    """The lexical index of one repo, under `.codeveil/lexical/`, kept current.

    `current(db)` returns an index matching the chunk table: the one in memory if still
    current, else the saved one if current, else an updated one (tokenizing only the
    chunks of files that changed), which is then saved. Thread-safe.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._saved: _Saved | None = None
        self._lock = threading.Lock()
        self._tokenizer = Tokenizer()
        self.last_refresh: dict[str, float | int | str] = {}

    def current(self, db: sqlite3.Connection) -> LexicalIndex:
        with self._lock:
            stamp = read_stamp(db)
            if self._saved is not None and self._saved.stamp == stamp:
                return self._saved.index
            if self._saved is None:
                self._saved = self._load()
                if self._saved is not None and self._saved.stamp == stamp:
                    return self._saved.index
            self._saved = self._refresh(db, self._saved)
            return self._saved.index

    def damaged(self) -> bool:
        """Whether saved index files exist but cannot be read (`codeveil doctor`)."""
        files = [self.directory / BASE_FILE, self.directory / DELTA_FILE]
        return any(f.exists() for f in files) and self._load() is None

    # -- disk -----------------------------------------------------------------------

    def _load(self) -> _Saved | None:
        try:
            with np.load(self.directory / BASE_FILE, allow_pickle=False) as zb:
                zb_d = {k: zb[k] for k in zb.files}
            with np.load(self.directory / DELTA_FILE, allow_pickle=False) as zd:
                zd_d = {k: zd[k] for k in zd.files}
        except FileNotFoundError as exc:
            log.debug("no lexical index in %s (%s)", self.directory, exc)
            return None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            # Truncated or garbled (a full disk, a crash before fsync existed): it only
            # caches what the chunk table holds, so it is rebuilt, not fatal.
            log.warning("the lexical index in %s is damaged (%s); rebuilding it",
                        self.directory, exc)
            return None
        try:
            if (int(zb_d["version"][0]) != FORMAT_VERSION
                    or zb_d["base_id"].tobytes() != zd_d["base_id"].tobytes()):
                return None
            k1, b = (float(x) for x in zb_d["params"])
            base = _Segment.load(zb_d)
            delta = _Segment.load(zd_d) if int(zd_d["has_delta"][0]) else None
            index = LexicalIndex(base, delta, zd_d["deleted"].astype(bool), k1=k1, b=b,
                                 tokenizer=self._tokenizer)
            files = dict(zip(_unpack(zd_d["file_paths"]),
                             (row.tobytes() for row in zd_d["file_digests"]), strict=True))
            stamp = (int(zd_d["stamp"][0]), int(zd_d["stamp"][1]), zd_d["epoch"].tobytes())
        except (KeyError, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            log.warning("the lexical index in %s is unreadable (%s); rebuilding it",
                        self.directory, exc)
            return None
        return _Saved(index, stamp, files, zb_d["base_id"].tobytes())

    def _save(self, saved: _Saved, base_changed: bool) -> None:
        index = saved.index
        id_arr = np.frombuffer(saved.base_id, dtype=np.uint8)
        if base_changed:
            index.base.save(self.directory / BASE_FILE, {
                "version": np.array([FORMAT_VERSION]), "base_id": id_arr,
                "params": np.array([index.k1, index.b]),
            })
        paths = list(saved.files)
        delta_extra = {
            "base_id": id_arr,
            "has_delta": np.array([index.delta is not None]),
            "deleted": index.deleted,
            "stamp": np.array(saved.stamp[:2], dtype=np.int64),
            "epoch": np.frombuffer(saved.stamp[2], dtype=np.uint8),
            "file_paths": _pack(paths),
            "file_digests": digest_rows([saved.files[p] for p in paths]),
        }
        if index.delta is not None:
            index.delta.save(self.directory / DELTA_FILE, delta_extra)
        else:
            _save_npz(self.directory / DELTA_FILE, delta_extra)

    # -- refresh --------------------------------------------------------------------

    def _refresh(self, db: sqlite3.Connection, old: _Saved | None) -> _Saved:
        """Bring the index in line with the chunk table, read in one snapshot."""
        t0 = time.perf_counter()
        reader = snapshot_reader(db)
        try:
            reader.execute("BEGIN")  # one WAL snapshot: stamp, file list and rows agree
            stamp = read_stamp(reader)
            files = {p: bytes(d) for p, d in reader.execute(
                "SELECT path, digest FROM chunk_files")}
            if old is not None:
                changed = [p for p, d in files.items() if old.files.get(p) != d]
                dropped = [p for p in old.files if p not in files]
                n_changed = count_chunks(reader, changed)
            if old is None or n_changed > REBUILD_SHARE * max(stamp[1], 1):
                rows = _read_chunks(reader, None)
                mode = "rebuild"
            else:
                rows = _read_chunks(reader, changed)
                mode = "update"
            reader.execute("COMMIT")
        finally:
            reader.close()
        t1 = time.perf_counter()
        counts = _Counts()
        texts = [lexical_text(c) for c in rows]
        for c, counted in zip(rows, _counts_of(self._tokenizer, texts), strict=True):
            counts.add(_doc(c), counted)
        if mode == "rebuild" or old is None:
            index = LexicalIndex(_Segment.from_counts(counts, None, K1, B),
                                 tokenizer=self._tokenizer)
            base_changed = True
        else:
            index = old.index.updated([*changed, *dropped], counts)
            base_changed = index.base is not old.index.base
        base_id = secrets.token_bytes(8) if base_changed or old is None else old.base_id
        saved = _Saved(index, stamp, files, base_id)
        t2 = time.perf_counter()
        try:
            self._save(saved, base_changed)
        except OSError as exc:
            # A read-only or full disk costs the next process a rebuild, not this search.
            log.warning("could not save the lexical index in %s: %s", self.directory, exc)
        self.last_refresh = {
            "mode": mode, "chunks": stamp[1], "tokenized": len(rows),
            "merged": int(base_changed and mode == "update"),
            "seconds_read": round(t1 - t0, 4), "seconds_build": round(t2 - t1, 4),
            "seconds_save": round(time.perf_counter() - t2, 4),
        }
        log.debug("lexical refresh: %s", self.last_refresh)
        return saved


def _read_chunks(db: sqlite3.Connection, paths: Sequence[str] | None) -> list[Chunk]:
    """Chunks of `paths` (all chunks if None), in table order."""
    cols = "path, start_line, end_line, language, symbol, text"
    query: list[tuple[str, Sequence[str]]]
    if paths is None:
        query = [(f"SELECT {cols} FROM chunks ORDER BY rowid", [])]
    else:
        query = []
        for start in range(0, len(paths), SQL_BATCH):
            part = list(paths[start : start + SQL_BATCH])
            marks = ",".join("?" * len(part))
            query.append((f"SELECT {cols} FROM chunks WHERE path IN ({marks}) ORDER BY rowid",
                          part))
    out: list[Chunk] = []
    for sql, args in query:
        out.extend(Chunk(p, s, e, lang, sym, text)
                   for p, s, e, lang, sym, text in db.execute(sql, args))
    return out
