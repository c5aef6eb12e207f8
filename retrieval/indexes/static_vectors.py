"""The first tier of meaning: every chunk's static vector, under `.codeveil/static/`.

MiniLM's vectors take the builder minutes; a static model's (`indexer.static_embedder`)
take about a fifth of a millisecond a chunk, so this index covers every chunk of the
chunk table, pending ones included, from the moment `codeveil index` returns. It is the
vector index's layout and refresh (`retrieval.indexes.local_vectors`: base and delta,
stamped by the chunk table, rebuilt when a file fails its checksum) over vectors
computed as the rows are read instead of looked up in the embedding cache: the body
plane holds the vector of each chunk's embedded text; the header plane is left empty
(the static vote ranks by bodies only, so header vectors would be made for nothing).
No approximate index: exact search over 256 dimensions stays within
a few milliseconds at 100k chunks. Like MiniLM's vectors these approximate the code, so
they stay on this machine (0700) and never go to a server.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np

from indexer.chunk import Chunk
from indexer.errors import EmbedderError
from indexer.local_chunks import count_chunks
from indexer.location import ChunkLocation
from indexer.static_embedder import StaticEmbedder
from retrieval.indexes.derived.store import FileDiff, Saved, chunk_rows, read_files
from retrieval.indexes.local_vectors.docs import VectorDocs
from retrieval.indexes.local_vectors.index import LocalVectorIndex
from retrieval.indexes.local_vectors.spill import copy_rows, spill_planes
from retrieval.indexes.local_vectors.store import LocalVectorStore

log = logging.getLogger(__name__)

#: Chunks embedded at once: their word pieces' counts fit a small sparse matrix.
_BATCH = 2048

_Rows = tuple[np.ndarray, VectorDocs]


class StaticVectorStore(LocalVectorStore):
    """The static vectors of one repo's chunks, kept current like the vector index."""

    label = "static vector index"

    def __init__(self, directory: Path, embedder: StaticEmbedder | None = None) -> None:
        super().__init__(directory)
        self._embedder = embedder

    @property
    def embedder(self) -> StaticEmbedder:
        if self._embedder is None:
            self._embedder = StaticEmbedder()
        return self._embedder

    def index(self, db: sqlite3.Connection) -> LocalVectorIndex:
        """The index of every chunk `db` holds, brought in step."""
        with self._lock:
            return self._current(db, (self.embedder.model_id, self.embedder.dim))

    def index_or_none(self, db: sqlite3.Connection) -> LocalVectorIndex | None:
        """`index(db)`, or None (logged) where the static model cannot be read: a search
        then answers by its other votes, and the next one tries again."""
        try:
            return self.index(db)
        except EmbedderError as exc:
            log.warning("no static tier: %s", exc)
            return None

    def problem(self, model_id: str | None = None, dim: int | None = None) -> str | None:
        return super().problem(model_id or self.embedder.model_id, dim or self.embedder.dim)

    def _attach_approx(self, index: LocalVectorIndex) -> None:
        return  # exact search: see the module's doc

    def _covered(self, reader: sqlite3.Connection) -> dict[str, bytes]:
        return read_files(reader)  # pending files too: their static vectors cost nothing

    def _reread(self, reader: sqlite3.Connection, old: Saved[LocalVectorIndex],
                key: Hashable) -> set[str]:
        return set()  # no header vectors to wait for: none are made

    def _read_rows(self, reader: sqlite3.Connection, diff: FileDiff,
                   key: Hashable) -> tuple[_Rows, dict[str, int]]:
        to_read = diff.to_read
        capacity = (reader.execute("SELECT count(*) FROM chunks").fetchone()[0]
                    if to_read is None else count_chunks(reader, to_read))
        dim = self.embedder.dim
        out = spill_planes(self.directory, capacity, dim)
        parts: list[VectorDocs] = []
        filled = 0
        rows = chunk_rows(reader, "path, start_line, end_line, language, symbol, text,"
                          " chunk_hash", to_read, order="path, ordinal")
        while batch := list(itertools.islice(rows, _BATCH)):
            chunks = [Chunk(p, s, e, lang, sym, text) for p, s, e, lang, sym, text, _ in batch]
            copy_rows(out, 0, filled, self.embedder.embed_batch([c.embed_text for c in chunks]))
            # The planes come uninitialised: the empty header plane is written as zeros,
            # as the vector index writes a chunk without a header vector.
            copy_rows(out, 1, filled, np.zeros((len(chunks), dim), dtype=np.float32))
            filled += len(chunks)
            parts.append(VectorDocs.of(
                [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language,
                               bytes(row[-1])) for c, row in zip(chunks, batch, strict=True)],
                [False] * len(chunks)))
        docs = (VectorDocs.concat([(p, np.arange(len(p))) for p in parts]) if parts
                else VectorDocs.empty())
        return (out[:, :filled], docs), {}

    def _report(self, saved: Saved[LocalVectorIndex], mode: str, rows: _Rows) -> dict[str, Any]:
        return {"mode": mode, "chunks": saved.index.count, "read": len(rows[1])}

