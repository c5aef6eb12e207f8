"""The chunk locations of the vector index's rows, with whether each row holds a header
vector: `retrieval.indexes.derived.columns.ChunkColumns` plus one flag column."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from indexer.location import ChunkLocation
from retrieval.indexes.derived.columns import ChunkColumns


@dataclass
class VectorDocs(ChunkColumns):
    """Where each row's chunk sits, and whether the row holds its header vector."""

    has_header: np.ndarray  # bool [n]

    @classmethod
    def of(cls, docs: Sequence[ChunkLocation],
           has_header: Sequence[bool] | None = None) -> VectorDocs:
        cols = ChunkColumns.of(docs)
        return cls.with_flags(cols, np.ones(len(docs), dtype=bool) if has_header is None
                              else np.array(has_header, dtype=bool).reshape(-1))

    @classmethod
    def with_flags(cls, cols: ChunkColumns, has_header: np.ndarray) -> VectorDocs:
        return cls(cols.path_id, cols.lines, cols.lang_id, cols.sym_ptr, cols.sym_blob,
                   cols.hashes, cols.paths, cols.languages, has_header)

    @classmethod
    def empty(cls) -> VectorDocs:
        return cls.of([])

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {**super().arrays(prefix), f"{prefix}has_header": self.has_header}

    @classmethod
    def load(cls, z: dict[str, np.ndarray], prefix: str = "") -> VectorDocs:
        docs = cls.with_flags(ChunkColumns.load(z, prefix),
                              z[f"{prefix}has_header"].astype(bool))
        if docs.has_header.shape != (len(docs),):
            raise ValueError("chunk metadata of inconsistent sizes")
        return docs

    def take(self, rows: np.ndarray) -> VectorDocs:
        return VectorDocs.concat([(self, rows)])

    @classmethod
    def concat(cls, parts: Sequence[tuple[ChunkColumns, np.ndarray]]) -> VectorDocs:
        flags = [p.has_header[rows] for p, rows in parts if isinstance(p, VectorDocs)]
        if len(flags) != len(parts):
            raise TypeError("only the rows of VectorDocs join VectorDocs")
        return cls.with_flags(ChunkColumns.concat(parts),
                              np.concatenate(flags).astype(bool) if flags
                              else np.zeros(0, dtype=bool))
