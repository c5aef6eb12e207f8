"""What one search reads, opened together: the lexical index and the vector side as the
chunk table has them now, and the ranker over them.

`SearchReader` belongs to an `Index` and keeps what outlives a search: the stores
(`.codeveil/lexical/`, `.codeveil/vectors/`), the server-search re-ranker, the ranker
(its repo names are built once per lexical index) and the query-vector cache. Its
`searcher(...)` brings the stores in step and returns a `Searcher`: one consistent view
that ranks a query, the way a search engine's reader hands out searchers over the
segments current when each was opened.

Imports of the ranking stack are deferred to the first search: `codeveil index` never
ranks.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import RepoConfig, codeveil_dir, find_root, state_path

if TYPE_CHECKING:
    from indexer.location import ChunkLocation
    from retrieval.indexes.filters import HitFilter
    from retrieval.indexes.lexical import LexicalIndex, LexicalStore
    from retrieval.indexes.local_vectors import LocalVectorIndex, LocalVectorStore
    from retrieval.indexes.static_vectors import StaticVectorStore
    from retrieval.search.fusion import HybridRanker, Ranking
    from retrieval.search.options import Keep, SearchOptions, VectorSearch
    from retrieval.search.server_vectors import ServerVectors
    from sync.client import StoreClient
    from sync.crypto.keys import WorkspaceKey
    from sync.workspace.workspace import Workspace

# Ask the server for more neighbours than shown: filters and stale hits drop some.
OVERFETCH = 4
MAX_DEPTH = 1000
QUERY_CACHE_SIZE = 256


def ranking_depth(depth: int, k: int) -> int:
    """How deep each ranking is read for `k` results: the options' depth, deeper when `k`
    asks for more (filters, stale hits and grouping drop some of what is read). Up to
    k = depth / OVERFETCH the results do not depend on k."""
    return min(max(depth, k * OVERFETCH), MAX_DEPTH)


class QueryVectors:
    """Vectors of query texts (each fits the window), through a small LRU cache; the
    indexes of one model may share one `cache` (`retrieval.faces.multi`)."""

    def __init__(self, embed: Callable[[Sequence[str]], np.ndarray]) -> None:
        self._embed = embed
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            vecs = self._embed(missing)
            for text, vec in zip(missing, vecs, strict=True):
                self.cache[text] = vec
        out = []
        for text in texts:
            self.cache.move_to_end(text)
            out.append(self.cache[text])
        while len(self.cache) > QUERY_CACHE_SIZE:
            self.cache.popitem(last=False)
        return np.stack(out)


@dataclass
class Searcher:
    """One search's view: the lexical index, the vector side and the ranker over them,
    with how much of the chunk table the vectors cover."""

    lexical: LexicalIndex
    vectors: VectorSearch
    ranker: HybridRanker
    chunks: int  # chunks of the table: searchable by name and words
    chunks_with_vectors: int  # of those, searchable by meaning
    local: LocalVectorIndex | None  # the vector side when it is this machine's index

    def options(self, options: SearchOptions, k: int) -> SearchOptions:
        """`options` for `k` results over what this view covers."""
        options = replace(options, depth=ranking_depth(options.depth, k))
        total, with_vectors = self.chunks, self.chunks_with_vectors
        if with_vectors < total:
            # While an index builds, the vector ranking ranks only the chunks embedded
            # so far: its first place is first among a few. Its vote shrinks with
            # the share it covers, so a hundred early vectors do not outvote BM25
            # and the evidence over the whole repo.
            share = with_vectors / total
            options = replace(options, w_vector=options.w_vector * share, meaning_share=share)
        if self.local is not None and total:
            # The header vectors' vote, likewise: a workspace indexed before chunks
            # carried them has none until `codeveil index` embeds them.
            share = min(self.local.header_count / total, 1.0)
            options = replace(options, w_header_vector=options.w_header_vector * share,
                              w_header_vector_prose=options.w_header_vector_prose * share)
        return options

    def rank(self, query: str, options: SearchOptions, k: int,
             keep: HitFilter | None) -> Ranking:
        """The fused ranking of `query` for `k` results, `keep` applied to every source."""
        return self.ranker.rank(query, self.options(options, k),
                                mask=None if keep is None else self.lexical.mask(keep),
                                keep=keep)


class LazyStatic:
    """The static side of one search (`VectorSearch`): the static index of the chunk
    table `db`, brought in step on first use. Where the static model cannot be read, it
    ranks nothing and the search answers by the other votes."""

    headers = False  # the static vote ranks by body vectors only

    def __init__(self, reader: SearchReader, root: Path, db: sqlite3.Connection) -> None:
        self._reader = reader
        self._root = root
        self._db = db
        self._index: LocalVectorIndex | None = None
        self._read = False

    def _get(self) -> LocalVectorIndex | None:
        if not self._read:
            self._read = True
            self._index = self._reader.static_index(self._root, self._db)
        return self._index

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        index = self._get()  # reads the model: the store is set from here on
        store = self._reader.static_store
        if index is None or store is None:
            return np.zeros((len(texts), 1), dtype=np.float32)
        return store.embedder.embed_batch(texts)

    def nearest(self, vector: np.ndarray, n: int, *, keep: Keep | None = None,
                header: bool = False) -> list[tuple[ChunkLocation, float]]:
        index = self._get()
        return [] if index is None else index.nearest(vector, n, keep=keep)

    def nearest_each(self, vectors: np.ndarray, n: int, *, keep: HitFilter | None = None,
                     header: bool = False) -> list[list[tuple[ChunkLocation, float]]]:
        index = self._get()
        return ([[] for _ in vectors] if index is None
                else index.nearest_each(vectors, n, keep=keep))


class SearchReader:
    """The stores and the ranker of one `Index`'s searches (see the module's doc)."""

    def __init__(self, workspace: Workspace) -> None:
        self._ws = workspace
        self.queries = QueryVectors(lambda texts: workspace.embedder.embedder.embed(texts))
        self.lexical_store: LexicalStore | None = None
        self.vector_store: LocalVectorStore | None = None
        self.static_store: StaticVectorStore | None = None
        #: This machine's vector index as the last search saw it (sealed workspaces).
        self.vectors: LocalVectorIndex | None = None
        self._server: ServerVectors | None = None
        self._ranker: HybridRanker | None = None
        self._rerank_db: sqlite3.Connection | None = None

    def searcher(self, root: Path, db: sqlite3.Connection, config: RepoConfig,
                 key: WorkspaceKey, client: StoreClient | None) -> Searcher:
        """A view of the indexes as the chunk table `db` has them now. `client`: the
        store a server-search workspace ranks on (None for a sealed one, which asks
        none)."""
        lexical = self.lexical(root).current(db)
        side: VectorSearch
        if config.sealed:
            self.vectors = side = self.vector_index(root, db, config)
        else:
            assert client is not None, "a server-search workspace ranks on its store"
            side = self._server_vectors(config, key, client)
        total, with_vectors = LocalChunks(db).coverage()
        if config.sealed and self.vectors is not None:
            # Chunks whose vector this machine lacks (an emptied cache) are not
            # searched by meaning either, pending or not.
            with_vectors = min(with_vectors, self.vectors.count)
        ranker = self._ranker_over(lexical, side)
        # Every chunk is ranked by meaning through its static vector while MiniLM's are
        # still being built (`SearchOptions.w_static`, yielding to them as they land):
        # the static index is brought in step when a ranking first asks it, so one
        # whose static vote has no weight (every vector in) never reads it.
        static = LazyStatic(self, root, db)
        ranker.use_static(static, static.embed)
        return Searcher(lexical, side, ranker, total, with_vectors,
                        self.vectors if config.sealed else None)

    def static_index(self, root: Path, db: sqlite3.Connection) -> LocalVectorIndex | None:
        """The static vectors of every chunk, brought in step; None (logged) where the
        static model cannot be read, so that a search still answers by words."""
        from retrieval.indexes.static_vectors import StaticVectorStore

        folder = codeveil_dir(root) / "static"
        if self.static_store is None or self.static_store.directory != folder:
            self.static_store = StaticVectorStore(folder)
        return self.static_store.index_or_none(db)

    def lexical(self, root: Path) -> LexicalStore:
        from retrieval.indexes.lexical import LexicalStore

        folder = codeveil_dir(root) / "lexical"
        if self.lexical_store is None or self.lexical_store.directory != folder:
            self.lexical_store = LexicalStore(folder)
        return self.lexical_store

    def vector_index(self, root: Path, db: sqlite3.Connection,
                     config: RepoConfig) -> LocalVectorIndex:
        """This machine's own vector index, brought in step with the chunk table."""
        from retrieval.indexes.local_vectors import LocalVectorStore

        folder = codeveil_dir(root) / "vectors"
        if self.vector_store is None or self.vector_store.directory != folder:
            self.vector_store = LocalVectorStore(folder)
        embedder = self._ws.embedder
        return self.vector_store.current(db, embedder.cache, config.model_id, config.dim)

    def _server_vectors(self, config: RepoConfig, key: WorkspaceKey,
                        client: StoreClient) -> ServerVectors:
        """The server's ranking, re-scored with this machine's plain vectors."""
        if self._server is None:
            from retrieval.search.rerank import PlainReranker
            from retrieval.search.server_vectors import ServerVectors
            from sync.transport.server_search import ServerSearch

            if self._rerank_db is None:
                self._rerank_db = open_state_db(state_path(find_root(self._ws.root)))
            embedder = self._ws.embedder
            reranker = PlainReranker(LocalChunks(self._rerank_db), embedder.cache,
                                     embedder.model_id, config.dim)
            self._server = ServerVectors(
                ServerSearch(client, key, config.workspace_id, config.dim), reranker)
        return self._server

    def _ranker_over(self, lexical: LexicalIndex, vectors: VectorSearch) -> HybridRanker:
        """The ranker, kept across searches (its repo names are built once per lexical
        index), over `lexical` and `vectors`."""
        if self._ranker is None:
            from indexer.tokens import default_counter
            from retrieval.search.fusion import HybridRanker

            counter = default_counter()
            self._ranker = HybridRanker.over(lexical, self.queries, vectors, counter.count,
                                             self._ws.embedder.embedder.max_tokens,
                                             count_many=counter.count_batch)
        else:
            self._ranker.use(lexical)
            self._ranker.use_vectors(vectors)
        return self._ranker

    def close(self) -> None:
        self._ranker = None  # it holds the client and the connection closed here
        self._server = None
        self.vectors = None
        if self._rerank_db is not None:
            self._rerank_db.close()
            self._rerank_db = None
