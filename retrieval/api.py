"""The public Python API: `Index(path).index()` and `Index(path).search(query)`.

    from retrieval import Index
    idx = Index("path/to/repo")
    idx.index()                       # first run creates .codeveil/ and the workspace
    for hit in idx.search("where do we retry failed uploads", k=5):
        print(hit.path, hit.start_line, hit.end_line, hit.symbol, hit.score)
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from indexer.embed_cache import CachedEmbedder, EmbeddingCache
from indexer.embedder import Embedder
from indexer.embedder_registry import default_embedder, embedder_for_model_id, embedder_name
from indexer.errors import CodeveilError
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval.hits import Hit
from sync import crypto
from sync.client import StoreClient
from sync.errors import KeyMismatchError
from sync.keys import ENV_KEY, WorkspaceKey, create_key, load_key
from sync.records import MODE_SEALED, MODE_SERVER_SEARCH
from sync.syncer import Progress, Syncer, SyncReport
from sync.workspace import (
    ConfigError,
    RepoConfig,
    codeveil_dir,
    find_root,
    init_lock,
    load_config,
    load_token,
    new_workspace_id,
    save_config,
    save_token,
    state_path,
    store_path,
)

if TYPE_CHECKING:
    # The ranking stack is imported on the first search: `codeveil index` never ranks.
    from indexer.ray_embedder import RayEmbedder
    from retrieval.fusion import HybridRanker, SearchOptions
    from retrieval.grouping import Group, Level
    from retrieval.lexical import LexDoc, LexicalIndex, LexicalStore
    from retrieval.local_vectors import LocalVectorIndex, LocalVectorStore
    from retrieval.rerank import PlainReranker

log = logging.getLogger(__name__)

#: The setting that sends indexing's embedding to a Ray cluster (see `Index.index`).
ENV_EMBED_ON = "CODEVEIL_EMBED_ON"

# Ask the server for more neighbours than shown: filters and stale hits drop some.
OVERFETCH = 4
QUERY_CACHE_SIZE = 256


class SearchError(CodeveilError):
    """A search was asked with options that cannot work (bad k, unknown group...)."""


# The key on this machine is not the one the workspace was built with: the same error
# as sync's own check raises, under the name the API has always exported.
WrongKeyError = KeyMismatchError


class ModelMismatchError(CodeveilError):
    """The workspace holds vectors of another embedding model than the one in use."""


class Index:
    """A codeveil index of one folder (found upward from `path` like git finds `.git/`)."""

    def __init__(self, path: str | Path = ".", *, embedder: Embedder | None = None) -> None:
        self._start = Path(path)
        if not self._start.exists():
            raise CodeveilError(f"no such folder: {self._start}")
        if not self._start.is_dir():
            raise CodeveilError(f"not a folder: {self._start}")
        self._embedder_given = embedder
        self._embedder: CachedEmbedder | None = None
        self._client: StoreClient | None = None
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lexical_store: LexicalStore | None = None
        self._vector_store: LocalVectorStore | None = None
        self._vectors: LocalVectorIndex | None = None
        self._ranker: HybridRanker | None = None
        self._rerank_db: sqlite3.Connection | None = None
        self._search_options: SearchOptions | None = None

    @property
    def search_options(self) -> SearchOptions:
        """How `search` ranks; the defaults are the ones the benchmarks found best."""
        if self._search_options is None:
            from retrieval.fusion import SearchOptions

            self._search_options = SearchOptions()
        return self._search_options

    @search_options.setter
    def search_options(self, options: SearchOptions) -> None:
        self._search_options = options

    # -- set-up ---------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The indexed folder (the one holding `.codeveil/`)."""
        try:
            return find_root(self._start)
        except CodeveilError:
            return self._start.resolve()

    @property
    def mode(self) -> str:
        """The workspace's mode: "sealed" (search runs here) or "server-search"."""
        return load_config(find_root(self._start)).mode

    @property
    def embedder(self) -> CachedEmbedder:
        """The embedder this index uses (the workspace's model), behind the cache."""
        return self._cached_embedder()

    def _cached_embedder(self) -> CachedEmbedder:
        if self._embedder is None:
            model = self._embedder_given or self._workspace_embedder() or default_embedder()
            self._embedder = CachedEmbedder(model, EmbeddingCache())
        return self._embedder

    def _workspace_embedder(self) -> Embedder | None:
        """The model an existing workspace was built with, so a later change of the
        default never mixes vectors; None for a new index, or when CODEVEIL_EMBEDDER
        names a model explicitly (then a mismatch is reported, not papered over)."""
        if os.environ.get("CODEVEIL_EMBEDDER"):
            return None
        try:
            config = load_config(find_root(self._start))
        except CodeveilError:
            return None
        return embedder_for_model_id(config.model_id)

    def init(self, *, server: str | None = None, workspace_id: str | None = None,
             token: str | None = None, server_search: bool = False) -> RepoConfig:
        """Create `.codeveil/` here and its workspace (in-process, or on `server`).

        A new workspace is sealed: the store keeps one envelope per chunk that it cannot
        compare, and search runs on this machine. `server_search` instead lets the
        server rank encrypted vectors (for repos too big for a client's memory), at the
        leakage measured in docs/threat-model.md; the mode is the workspace's for good.

        With `workspace_id` (and the key imported with `codeveil key import`), join an
        existing workspace on `server` instead of creating one; it keeps its own mode.
        """
        with init_lock(self._start.resolve()):
            return self._init(server=server, workspace_id=workspace_id, token=token,
                              server_search=server_search)

    def _init_once(self) -> None:
        """Create the index here unless another process (a daemon, a second agent) did
        so meanwhile: the first to take the lock creates it, the others use what it made,
        so one folder ends with one workspace and one key."""
        root = self._start.resolve()
        with init_lock(root):
            if not (codeveil_dir(root) / "config.json").is_file():
                self._init()

    def _init(self, *, server: str | None = None, workspace_id: str | None = None,
              token: str | None = None, server_search: bool = False) -> RepoConfig:
        """`init`, its caller holding the init lock."""
        root = self._start.resolve()
        embedder = self._cached_embedder()
        mode = MODE_SERVER_SEARCH if server_search else MODE_SEALED
        if workspace_id is None:
            workspace_id = new_workspace_id()
            # CODEVEIL_KEY stands for every workspace: a new one is made under it (CI,
            # a second clone of a shared index); otherwise a fresh key is stored.
            key = load_key(workspace_id) if os.environ.get(ENV_KEY) else create_key(workspace_id)
            if server is None:
                from sync.local_client import LocalClient

                LocalClient.create_workspace(
                    store_path(root), workspace_id, dim=embedder.dim,
                    model_id=embedder.model_id, key_check=key.key_check, mode=mode,
                ).close()
            else:
                from sync.http_client import HttpClient

                token = HttpClient.create_workspace(
                    server, workspace_id=workspace_id, dim=embedder.dim,
                    model_id=embedder.model_id, key_check=key.key_check, mode=mode,
                )
                save_token(workspace_id, token)
        elif server is None:
            raise CodeveilError("joining an existing workspace needs --server URL")
        else:
            from sync.http_client import HttpClient

            load_key(workspace_id)
            if token:
                save_token(workspace_id, token)
            with HttpClient(server, workspace_id, load_token(workspace_id)) as joined:
                mode = joined.info().mode  # the workspace's, whatever was asked
        config = RepoConfig(workspace_id=workspace_id, model_id=embedder.model_id,
                            dim=embedder.dim, server=server, mode=mode)
        save_config(root, config)
        self._start = root
        self._check(config, load_key(workspace_id))
        return config

    def _open(self) -> tuple[Path, RepoConfig, WorkspaceKey, StoreClient]:
        root = find_root(self._start)
        config = load_config(root)
        key = load_key(config.workspace_id)
        if self._client is None:
            self._client = _open_client(root, config)
            self._check(config, key)
        return root, config, key, self._client

    def _check(self, config: RepoConfig, key: WorkspaceKey) -> None:
        client = self._client or _open_client(find_root(self._start), config)
        self._client = client
        info = client.info()
        if info.key_check != key.key_check:
            raise WrongKeyError(
                f"the key for workspace {config.workspace_id} does not match the one its index"
                " was built with; import the right one with `codeveil key import`"
            )
        for name, have, want in (("dim", config.dim, info.dim),
                                 ("model_id", config.model_id, info.model_id),
                                 ("mode", config.mode, info.mode)):
            if have != want:
                path = codeveil_dir(find_root(self._start)) / "config.json"
                raise ConfigError(
                    f"{path}: {name} is {have!r} but workspace {config.workspace_id} holds"
                    f" {want!r}; set it back to {want!r}"
                )
        model = self._cached_embedder()
        if info.model_id != model.model_id or info.dim != model.dim:
            raise ModelMismatchError(
                f"workspace {config.workspace_id} holds vectors of {info.model_id} (dim"
                f" {info.dim}) but the embedder in use is {model.model_id} (dim {model.dim})"
            )

    # -- indexing -------------------------------------------------------------------

    def index(self, *, progress: Progress | None = None, reupload: bool = False,
              embed_on: str | None = None) -> SyncReport:
        """Bring the index up to date with the folder; creates it on first use.

        `reupload` sends every file again, whatever the store's tree says: the repair of
        a store that lost rows (`codeveil doctor --repair`). `embed_on` (or the
        CODEVEIL_EMBED_ON setting) sends the embedding to a Ray cluster,
        `ray://HOST:PORT[?actors=N]`: the cluster sees the chunks' plain text, so it must
        be one you trust; vectors come back here and are encrypted here.
        """
        remote = self._remote_embedder(embed_on or os.environ.get(ENV_EMBED_ON))
        try:
            find_root(self._start)
        except CodeveilError:
            self._init_once()
        root, config, key, client = self._open()
        embedder = self._cached_embedder()
        if remote is not None:
            embedder = CachedEmbedder(remote, embedder.cache)
        from retrieval.search_ready import SearchReady, StartsSearchReady

        ready = SearchReady(root, (lambda db: self._vector_index(root, db, config))
                            if config.sealed else None)
        syncer = Syncer(
            root, state_path(root), client, key, config.workspace_id, embedder,
            None if config.sealed else crypto.VectorCipher(key, embedder.dim),
            sealed=config.sealed, progress=StartsSearchReady(progress, ready),
        )
        report = None
        try:
            report = syncer.run(reupload=reupload)
            report.embedded_on = (remote.address or "auto") if remote is not None else "here"
        finally:
            syncer.close()
            if remote is not None:
                remote.close()
            took = ready.finish(completed=report is not None)
        report.seconds_search_ready = took
        report.seconds += took
        client.verify()  # never report success over a store that cannot read its rows
        return report

    def _remote_embedder(self, embed_on: str | None) -> RayEmbedder | None:
        """A Ray pool running this index's model, for `embed_on`; None for here."""
        if not embed_on:
            return None
        from indexer.ray_embedder import RayEmbedder, parse_embed_on

        address, actors = parse_embed_on(embed_on)
        model_id = self._cached_embedder().model_id
        name = embedder_name(model_id)
        if name is None:
            raise CodeveilError(f"the model {model_id} cannot be run on a Ray cluster")
        return RayEmbedder(address, actors=actors or 2, model=name)

    # -- search ---------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int = 10,
        *,
        path: str | None = None,
        language: str | None = None,
        group: str = "chunk",
    ) -> list[Hit]:
        """The `k` results most relevant to `query`, read from disk, best first.

        Hybrid: the nearest chunks by meaning (encrypted search; a long query is cut into
        parts that each fit the model's window, and each part searched), BM25 over the
        local chunk table, and the chunks of files, frames and symbols the query names,
        fused by reciprocal rank (see `retrieval.fusion`).

        `group` picks the level: `"chunk"` ranks chunks; `"symbol"` returns one hit per
        symbol (file and symbol path, e.g. `Session > send`) and `"file"` one hit per file
        (see `retrieval.grouping`). A grouped hit shows its best chunk's lines and carries
        the group's aggregated score. `score` is the fused score: higher is better, and it
        compares hits of one result list only (it is not a cosine).

        `path` keeps hits whose path matches a glob (`src/*.py`, `*/tests/*`); `language`
        keeps one language (`python`, `go`, ...).
        """
        if not query or not query.strip():
            raise SearchError("the query is empty")
        if k < 1:
            raise SearchError(f"k must be at least 1, got {k}")
        from retrieval.fusion import group_ranking
        from retrieval.grouping import LEVELS

        if group not in LEVELS:
            raise SearchError(f"unknown group {group!r}; use one of {', '.join(LEVELS)}")
        root, config, key, client = self._open()
        db = open_state_db(state_path(root))
        try:
            self._check_state(root, LocalChunks(db), client)
            lexical = self._lexical(root).current(db)
            if config.sealed:
                self._vectors = self._vector_index(root, db, config)
            ranker = self._hybrid_ranker(config, key, client, lexical)
            keep = _hit_filter(path, language)
            options = replace(self.search_options,
                              depth=min(max(self.search_options.depth, k * OVERFETCH), 1000))
            total, with_vectors = LocalChunks(db).coverage()
            if self._vectors is not None and config.sealed:
                # Chunks whose vector this machine lacks (an emptied cache) are not
                # searched by meaning either, pending or not.
                with_vectors = min(with_vectors, self._vectors.count)
            if with_vectors < total:
                # While an index builds, the vector ranking ranks only the chunks embedded
                # so far: its first place is first among a few. Its vote shrinks with
                # the share it covers, so a hundred early vectors do not outvote BM25
                # and the evidence over the whole repo.
                options = replace(options, w_vector=options.w_vector * with_vectors / total)
            ranking = ranker.rank(query, options, mask=lexical.mask(path=path, language=language),
                                  keep=keep)
            groups = group_ranking(ranking, cast("Level", group))  # checked above
            return self._read_hits(root, LocalChunks(db), groups, k)
        finally:
            db.close()

    @staticmethod
    def _check_state(root: Path, local: LocalChunks, client: StoreClient) -> None:
        """Refuse to search with a lost client state: the hits would silently change
        (no lexical side, no exact scores, nothing to re-locate edited chunks with)."""
        if local.count_files():
            return
        held = client.info().chunks
        if held:
            raise CodeveilError(
                f"the client state {state_path(root)} is missing or empty while the store"
                f" holds {held} chunks; run `codeveil index` (or `codeveil doctor --repair`)"
                " to rebuild it from the working tree"
            )

    def _lexical(self, root: Path) -> LexicalStore:
        from retrieval.lexical import LexicalStore

        if self._lexical_store is None or self._lexical_store.directory.parent != codeveil_dir(
                root):
            self._lexical_store = LexicalStore(codeveil_dir(root) / "lexical")
        return self._lexical_store

    def _vector_index(self, root: Path, db: sqlite3.Connection,
                      config: RepoConfig) -> LocalVectorIndex:
        """This machine's own vector index, brought in step with the chunk table."""
        from retrieval.local_vectors import LocalVectorStore

        folder = codeveil_dir(root) / "vectors"
        if self._vector_store is None or self._vector_store.directory != folder:
            self._vector_store = LocalVectorStore(folder)
        embedder = self._cached_embedder()
        return self._vector_store.current(db, embedder.cache, config.model_id, config.dim)

    def _hybrid_ranker(self, config: RepoConfig, key: WorkspaceKey, client: StoreClient,
                       lexical: LexicalIndex) -> HybridRanker:
        """The ranker of this index; its vector side is this machine's own vector index
        (sealed) or the server's encrypted one (server-search)."""
        from indexer.tokens import default_counter
        from retrieval.fusion import HybridRanker

        if self._ranker is not None:
            self._ranker.use(lexical)
            return self._ranker
        embedder = self._cached_embedder().embedder
        counter = default_counter()
        if config.sealed:
            def nearest_here(vector: np.ndarray, n: int) -> list[tuple[LexDoc, float]]:
                assert self._vectors is not None  # set by `search` before it ranks
                return self._vectors.nearest(vector, n)

            self._ranker = HybridRanker(lexical, self._query_vectors, nearest_here,
                                        counter.count, embedder.max_tokens,
                                        count_many=counter.count_batch)
            return self._ranker
        from sync.server_search import ServerSearch

        server = ServerSearch(client, key, config.workspace_id, config.dim)
        reranker = self._plain_reranker(config)

        def nearest(vector: np.ndarray, n: int) -> list[tuple[LexDoc, float]]:
            # The opened metadata is a chunk location like the lexical index's docs.
            out: list[tuple[LexDoc, float]] = list(server.nearest(vector, n))
            # Exact cosines from this machine's own plain vectors, where it has them.
            exact = reranker.scores([(d.path, d.symbol, d.chunk_hash) for d, _ in out], vector)
            out = [(d, approx if e is None else e)
                   for (d, approx), e in zip(out, exact, strict=True)]
            out.sort(key=lambda pair: -pair[1])
            return out

        self._ranker = HybridRanker(lexical, self._query_vectors, nearest, counter.count,
                                    embedder.max_tokens, count_many=counter.count_batch)
        return self._ranker

    def _plain_reranker(self, config: RepoConfig) -> PlainReranker:
        from retrieval.rerank import PlainReranker

        if self._rerank_db is None:
            self._rerank_db = open_state_db(state_path(find_root(self._start)))
        embedder = self._cached_embedder()
        return PlainReranker(LocalChunks(self._rerank_db), embedder.cache, embedder.model_id,
                             config.dim)

    def _query_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of query texts (each fits the window), through a small LRU cache."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._query_cache]
        if missing:
            vecs = self._cached_embedder().embedder.embed(missing)
            for text, vec in zip(missing, vecs, strict=True):
                self._query_cache[text] = vec
        out = []
        for text in texts:
            self._query_cache.move_to_end(text)
            out.append(self._query_cache[text])
        while len(self._query_cache) > QUERY_CACHE_SIZE:
            self._query_cache.popitem(last=False)
        return np.stack(out)

    def _read_hits(self, root: Path, local: LocalChunks, groups: list[Group],
                   k: int) -> list[Hit]:
        """The first `k` groups as hits read from disk; a group shows its first member
        that is still on disk, or is marked stale; groups of deleted files are dropped."""
        from retrieval.locate import FileLines, locate

        lines = FileLines(root)
        hits: list[Hit] = []
        for g in groups:
            if lines.get(g.best.path) is None:
                continue  # the file is gone: never return chunks of deleted files
            shown, where = g.best, None
            for doc in g.members:
                where = locate(lines, local, doc.path, doc.start_line, doc.end_line,
                               doc.chunk_hash)
                if where is not None:
                    shown = doc
                    break
            start, end, text = where or (shown.start_line, shown.end_line, "")
            hits.append(Hit(
                path=shown.path, start_line=start, end_line=end, symbol=shown.symbol,
                language=shown.language, score=g.score, text=text, stale=where is None,
            ))
            if len(hits) >= k:
                break
        return hits

    def coverage(self) -> dict[str, int | bool]:
        """How much of the index search by meaning covers: `chunks` (all, searchable by
        name and words), `chunks_with_vectors` (also by meaning) and `partial` (True
        while an index, say a first one, has not sent every vector yet)."""
        root = find_root(self._start)
        db = open_state_db(state_path(root))
        try:
            total, with_vectors = LocalChunks(db).coverage()
        finally:
            db.close()
        if self._vectors is not None:
            # As the last search saw it: chunks whose vector this machine lacks (an
            # emptied cache) are not searched by meaning.
            with_vectors = min(with_vectors, self._vectors.count)
        return {"partial": with_vectors < total, "chunks": total,
                "chunks_with_vectors": with_vectors}

    def status(self) -> dict:
        """Where the index is, what it holds, and where its store lives."""
        root, config, _key, client = self._open()
        info = client.info()
        db = open_state_db(state_path(root))
        try:
            local = LocalChunks(db)
            files, chunks = local.count_files(), local.count()
        finally:
            db.close()
        return {
            "root": str(root),
            "workspace_id": config.workspace_id,
            "server": config.server or "embedded",
            "mode": config.mode,
            "model_id": config.model_id,
            "files": files,
            "chunks": chunks,
            "server_chunks": info.chunks,
            "server_nodes": info.nodes,
        }

    def close(self) -> None:
        self._ranker = None  # it holds the client and the connection closed here
        self._vectors = None
        if self._rerank_db is not None:
            self._rerank_db.close()
            self._rerank_db = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_client(root: Path, config: RepoConfig) -> StoreClient:
    if config.server is None:
        from sync.local_client import LocalClient

        return LocalClient.open(store_path(root), config.workspace_id)
    from sync.http_client import HttpClient

    return HttpClient(config.server, config.workspace_id, load_token(config.workspace_id))


def _hit_filter(path: str | None, language: str | None) -> Callable[[LexDoc], bool] | None:
    if path is None and language is None:
        return None

    def keep(doc: LexDoc) -> bool:
        return (path is None or fnmatch.fnmatch(doc.path, path)) and (
            language is None or doc.language == language)

    return keep
