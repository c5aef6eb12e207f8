"""Exact scores for the server's candidates, from the client's own plain vectors.

The server ranks encrypted vectors, whose perturbation (sync.crypto.ciphers, beta) blurs close
calls. The client asked for several times more candidates than it shows, and it still
holds the plain vector of every chunk it embedded, in the embedding cache: re-ranking
the candidates by exact cosine restores the plain top-k (measured in
tests/test_encrypted_recall.py), so the perturbation can be large. A candidate whose
vector is not cached here (a teammate's chunk this machine never embedded) keeps the
server's estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import LocalChunks


class PlainReranker:
    """Cosines of candidates to a query, where this machine has their plain vector."""

    def __init__(self, local: LocalChunks, cache: EmbeddingCache, model_id: str, dim: int):
        self.local = local
        self.cache = cache
        self.model_id = model_id
        self.dim = dim

    def scores(
        self, candidates: Sequence[tuple[str, str, bytes]], query: np.ndarray
    ) -> list[float | None]:
        """Exact cosine per (path, symbol, chunk hash), or None where no vector is cached."""
        keys: list[bytes | None] = []
        for path, symbol, chunk_hash in candidates:
            text = self._text(path, symbol, chunk_hash)
            keys.append(None if text is None else cache_key(self.model_id, text))
        found = self.cache.get_many([k for k in keys if k is not None], self.dim)
        out: list[float | None] = []
        for key in keys:
            vec = found.get(key) if key is not None else None
            out.append(None if vec is None else float(vec @ query))
        return out

    def _text(self, path: str, symbol: str, chunk_hash: bytes) -> str | None:
        """The exact text that was embedded for this chunk, rebuilt from the local table."""
        for chunk in self.local.by_hash(chunk_hash):
            if chunk.path == path:
                return Chunk(path=path, start_line=chunk.start_line, end_line=chunk.end_line,
                             language=chunk.language, symbol=symbol, text=chunk.text).embed_text
        return None
