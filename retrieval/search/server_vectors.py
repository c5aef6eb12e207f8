"""The vector side of a server-search workspace: the server ranks its encrypted vectors
(`sync.transport.server_search`), this machine re-ranks what came back by exact cosines from its
own plain vectors where it has them (`retrieval.search.rerank`). A `retrieval.search.fusion.
VectorSearch`, like the sealed workspace's local index, with no header vectors (the
server holds none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from indexer.location import ChunkLocation

if TYPE_CHECKING:
    from retrieval.indexes.filters import HitFilter
    from retrieval.search.options import Keep
    from retrieval.search.rerank import PlainReranker
    from sync.transport.server_search import ServerSearch

# Ask for up to this many times `n` before a filter that keeps few gets fewer than `n`.
WIDEST: int = 16


class ServerVectors:
    """Nearest chunks by the server's ranking, re-scored with this machine's vectors."""

    #: The server keeps no header vectors: no second vector ranking.
    headers = False

    def __init__(self, server: ServerSearch, reranker: PlainReranker) -> None:
        self.server = server
        self.reranker = reranker

    def nearest(self, vector: np.ndarray, n: int, *, keep: Keep | None = None,
                header: bool = False) -> list[tuple[ChunkLocation, float]]:
        """The `n` nearest chunks (with `keep`, of those it keeps), best first by exact
        cosine where this machine has the vector, else by the server's estimate."""
        if header:
            return []
        # The opened metadata is a chunk location like the lexical index's docs.
        out: list[tuple[ChunkLocation, float]] = list(self.server.nearest(vector, n))
        # The server cannot filter by path (it holds none): ask it for more until
        # `n` are kept, or it has no more.
        wanted = n
        while keep is not None:
            kept = [(d, s) for d, s in out if keep(d)]
            if len(kept) >= n or len(out) < wanted or wanted >= WIDEST * n:
                out = kept[:n]
                break
            wanted *= 4
            out = list(self.server.nearest(vector, wanted))
        # Exact cosines from this machine's own plain vectors, where it has them.
        exact = self.reranker.scores([(d.path, d.symbol, d.chunk_hash) for d, _ in out], vector)
        out = [(d, approx if e is None else e)
               for (d, approx), e in zip(out, exact, strict=True)]
        out.sort(key=lambda pair: -pair[1])
        return out

    def nearest_each(self, vectors: np.ndarray, n: int, *, keep: HitFilter | None = None,
                     header: bool = False) -> list[list[tuple[ChunkLocation, float]]]:
        """`nearest` of each row of `vectors`: one round trip each (the server ranks
        one query vector a request)."""
        return [self.nearest(v, n, keep=keep, header=header) for v in vectors]
