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
import sqlite3
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Final

import numpy as np

from indexer.chunk import Chunk
from indexer.local_chunks import count_chunks
from retrieval.indexes.derived.columns import digest_rows, pack, unpack
from retrieval.indexes.derived.npz import read_npz
from retrieval.indexes.derived.store import (
    DerivedStore,
    FileDiff,
    Saved,
    Stamp,
    chunk_rows,
    read_stamp,
)
from retrieval.indexes.lexical.combine import SegmentWriter
from retrieval.indexes.lexical.index import K1, B, LexicalIndex
from retrieval.indexes.lexical.segments import _doc, _save_npz, _Segment
from retrieval.indexes.lexical.tokens import Tokenizer, lexical_text

# Log lines name the package ("retrieval.indexes.lexical"), whichever of its modules writes them.
log = logging.getLogger("retrieval.indexes.lexical")

# 4: members checked by their xxh3 (retrieval.indexes.derived.npz), the base read mapped.
# 5: terms are stems (indexer.lexical_tokens.stem).
FORMAT_VERSION: Final = 5
BASE_FILE: Final = "base.npz"
DELTA_FILE: Final = "delta.npz"
# A refresh that would re-tokenize more than this share of chunks rebuilds from scratch.
REBUILD_SHARE: Final = 0.5

__all__ = ["BASE_FILE", "DELTA_FILE", "FORMAT_VERSION", "REBUILD_SHARE", "LexicalStore",
           "Stamp", "read_stamp"]


class LexicalStore(DerivedStore[LexicalIndex, list[_Segment]]):
    """The lexical index of one repo, under `.codeveil/lexical/`, kept current.

    `current(db)` returns an index matching the chunk table: the one in memory if still
    current, else the saved one if current, else an updated one (tokenizing only the
    chunks of files that changed), which is then saved (`retrieval.indexes.derived.store`).
    Thread-safe.
    """

    label = "lexical index"
    log = log

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self._tokenizer = Tokenizer()

    def current(self, db: sqlite3.Connection) -> LexicalIndex:
        return self._current(db)

    def damaged(self) -> bool:
        """Whether saved index files exist but cannot be read (`codeveil doctor`)."""
        files = [self.directory / BASE_FILE, self.directory / DELTA_FILE]
        return any(f.exists() for f in files) and self._load(None) is None

    # -- what the refresh reads and builds ------------------------------------------

    def read_stamp(self, db: sqlite3.Connection) -> Stamp:
        return read_stamp(db)

    def _rebuilds(self, reader: sqlite3.Connection, changed: list[str],
                  files: dict[str, bytes]) -> bool:
        total = reader.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return count_chunks(reader, changed) > REBUILD_SHARE * max(total, 1)

    def _read_rows(self, reader: sqlite3.Connection, diff: FileDiff,
                   key: Hashable) -> tuple[list[_Segment], dict[str, int]]:
        # Tokenized as they are read, a batch at a time: a rebuild of 1M chunks never
        # holds their texts, or all of their postings, in memory (lexical.combine).
        writer = SegmentWriter(self._tokenizer, K1, B, self.directory)
        for p, s, e, lang, sym, text in chunk_rows(
                reader, "path, start_line, end_line, language, symbol, text", diff.to_read,
                order="rowid"):
            chunk = Chunk(p, s, e, lang, sym, text)
            writer.add(_doc(chunk), lexical_text(chunk))
        return writer.segments(), {}

    def _build(self, rows: list[_Segment], key: Hashable, missing: int) -> LexicalIndex:
        return LexicalIndex.built(rows, tokenizer=self._tokenizer, spill_dir=self.directory)

    def _update(self, index: LexicalIndex, drop: set[str], rows: list[_Segment],
                key: Hashable, missing: int) -> LexicalIndex:
        return index.with_changes(drop, rows)

    def _report(self, saved: Saved[LexicalIndex], mode: str,
                rows: list[_Segment]) -> dict[str, Any]:
        # A merge is reported as the update it finishes.
        return {"mode": "update" if mode == "merge" else mode,
                "chunks": saved.stamp[1],  # type: ignore[index]
                "tokenized": sum(len(s) for s in rows), "merged": int(mode == "merge")}

    # -- disk -----------------------------------------------------------------------

    def _read_saved(self, key: Hashable) -> Saved[LexicalIndex] | None:
        # The base's postings mapped from the file, not read (retrieval.indexes.derived.npz).
        zb_d = read_npz(self.directory / BASE_FILE)
        zd_d = read_npz(self.directory / DELTA_FILE)
        if (int(zb_d["version"][0]) != FORMAT_VERSION
                or zb_d["base_id"].tobytes() != zd_d["base_id"].tobytes()):
            return None
        k1, b = (float(x) for x in zb_d["params"])
        base = _Segment.load(zb_d)
        delta = _Segment.load(zd_d) if int(zd_d["has_delta"][0]) else None
        index = LexicalIndex(base, delta, np.array(zd_d["deleted"], dtype=bool), k1=k1, b=b,
                             tokenizer=self._tokenizer, spill_dir=self.directory)
        files = dict(zip(unpack(zd_d["file_paths"]),
                         (row.tobytes() for row in zd_d["file_digests"]), strict=True))
        stamp = (int(zd_d["stamp"][0]), int(zd_d["stamp"][1]), zd_d["epoch"].tobytes())
        return Saved(index, stamp, files, zb_d["base_id"].tobytes())

    def _write(self, saved: Saved[LexicalIndex], old: Saved[LexicalIndex] | None, *,
               base_changed: bool) -> None:
        index = saved.index
        stamp: Stamp = saved.stamp  # type: ignore[assignment]
        id_arr = np.frombuffer(saved.base_id, dtype=np.uint8)
        if base_changed:
            index.base.save(self.directory / BASE_FILE, {
                "version": np.array([FORMAT_VERSION]), "base_id": id_arr,
                "params": np.array([index.k1, index.b]),
            })
            # A base built in a spill file now reads from the saved one instead, so the
            # index is on disk once, not twice, for as long as this process holds it.
            if any(isinstance(a, np.memmap) for a in index.base.a.values()):
                saved_base = read_npz(self.directory / BASE_FILE)
                index.base = _Segment({k: saved_base[k] for k in index.base.a},
                                      index.base.cols)
        paths = list(saved.files)
        delta_extra = {
            "base_id": id_arr,
            "has_delta": np.array([index.delta is not None]),
            "deleted": index.deleted,
            "stamp": np.array(stamp[:2], dtype=np.int64),
            "epoch": np.frombuffer(stamp[2], dtype=np.uint8),
            "file_paths": pack(paths),
            "file_digests": digest_rows([saved.files[p] for p in paths]),
        }
        if index.delta is not None:
            index.delta.save(self.directory / DELTA_FILE, delta_extra)
        else:
            _save_npz(self.directory / DELTA_FILE, delta_extra)
