"""The public Python API: `Index(path).index()` and `Index(path).search(query)`.

    from retrieval import Index
    idx = Index("path/to/repo")
    idx.index(wait=True)   # first run creates .codeveil/ and the workspace; without
                           # wait, as `codeveil index`: words now, vectors in the background
    for hit in idx.search("where do we retry failed uploads", k=5):
        print(hit.path, hit.start_line, hit.end_line, hit.symbol, hit.score)
"""

from __future__ import annotations

import logging
import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from indexer.embed_cache import CachedEmbedder
from indexer.embedder import Embedder
from indexer.errors import CodeveilError
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval.indexes.filters import HitFilter
from retrieval.search.coverage import Coverage
from retrieval.search.hits import Hit
from retrieval.search.limits import DEFINITIONS, REFERENCES, SEARCH
from retrieval.search.searcher import (
    MAX_DEPTH,
    OVERFETCH,
    QUERY_CACHE_SIZE,
    SearchReader,
    ranking_depth,
)
from sync.checkout.config import (
    RepoConfig,
    find_root,
    load_config,
    state_path,
)
from sync.checkout.index_state import (
    IndexNotBuilt,
    never_completed_message,
    other_workspace,
    was_completed,
)
from sync.checkout.server_contact import Unreachable
from sync.client import StoreClient
from sync.errors import KeyMismatchError, SyncError
from sync.syncer.syncer import Progress, SyncReport
from sync.workspace.status import WorkspaceStatus
from sync.workspace.workspace import Workspace

if TYPE_CHECKING:
    # The ranking stack is imported on the first search: `codeveil index` never ranks.
    from retrieval.agent.agent_tools import AgentTools
    from retrieval.agent.grep import GrepResult
    from retrieval.agent.references import ReferenceHit
    from retrieval.agent.symbols import DefinitionHit, Outline
    from retrieval.indexes.lexical import LexicalStore
    from retrieval.indexes.local_vectors import LocalVectorIndex, LocalVectorStore
    from retrieval.search.grouping import Group, Level
    from retrieval.search.options import SearchOptions

log = logging.getLogger(__name__)

#: Results placed exactly past the k asked for, to stand in for those whose file is gone.
READ_SPARE = 10

# How deep a search reads, and its query cache: retrieval.search.searcher (names kept here).
__all__ = ["MAX_DEPTH", "OVERFETCH", "QUERY_CACHE_SIZE", "Index", "SearchError",
           "WrongKeyError", "lost_state_message", "ranking_depth"]


class SearchError(CodeveilError):
    """A search was asked with options that cannot work (bad k, unknown group...)."""


class ServerSearchOffline(CodeveilError):
    """A server-search workspace's search, with its server unreachable: it ranks there."""


def server_search_offline_message(error: str) -> str:
    return (f"this workspace ranks on its server (server-search), which cannot be reached"
            f" ({error}); search needs it, while `codeveil def`, `outline`, `uses` and"
            " `grep` answer from this machine")


# The key on this machine is not the one the workspace was built with: the same error
# as sync's own check raises, under the name the API has always exported.
WrongKeyError = KeyMismatchError

class Index:
    """A codeveil index of one folder (found upward from `path` like git finds `.git/`)."""

    def __init__(self, path: str | Path = ".", *, embedder: Embedder | None = None) -> None:
        self._ws = Workspace(path, embedder=embedder)
        self._reader = SearchReader(self._ws)
        self._search_db: sqlite3.Connection | None = None
        self._search_db_identity: tuple[int, int] | None = None
        self._search_options: SearchOptions | None = None
        self._tools: AgentTools | None = None

    @property
    def search_options(self) -> SearchOptions:
        """How `search` ranks; the defaults are the ones the benchmarks found best."""
        if self._search_options is None:
            from retrieval.search.options import SearchOptions

            self._search_options = SearchOptions()
        return self._search_options

    @search_options.setter
    def search_options(self, options: SearchOptions) -> None:
        self._search_options = options

    # -- set-up ---------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The indexed folder (the one holding `.codeveil/`)."""
        return self._ws.root

    @property
    def mode(self) -> str:
        """The workspace's mode: "sealed" (search runs here) or "server-search"."""
        return self._ws.mode

    @property
    def embedder(self) -> CachedEmbedder:
        """The embedder this index uses (the workspace's model), behind the cache."""
        return self._ws.embedder

    @property
    def workspace(self) -> Workspace:
        """The workspace underneath (sync.workspace.workspace): creating, opening,
        checking, syncing."""
        return self._ws

    def init(self, *, server: str | None = None, workspace_id: str | None = None,
             token: str | None = None, server_search: bool = False) -> RepoConfig:
        """Create `.codeveil/` here and its workspace (in-process, or on `server`); with
        `workspace_id`, join that workspace on `server` instead. Sealed unless
        `server_search`. See `sync.workspace.workspace.Workspace.init`."""
        return self._ws.init(server=server, workspace_id=workspace_id, token=token,
                             server_search=server_search)

    # -- indexing -------------------------------------------------------------------

    def index(self, *, progress: Progress | None = None, reupload: bool = False,
              embed_on: str | None = None, wait: bool = False) -> SyncReport:
        """Bring the index up to date with the folder; creates it on first use.

        It returns once the words, names and structure are indexed
        (`Workspace.index_words`: seconds) and leaves the model's work and the sync to
        the index's background builder (`sync.daemon.builder`), started here; `builder()` tells
        how it goes. With `wait` it returns once every chunk has its vectors and the
        store holds them. The default is the command's and the MCP tool's
        (retrieval.faces.operations).

        `reupload` (send every file again) and `embed_on` (a Ray cluster,
        `ray://HOST:PORT[?actors=N]`, which sees the chunks' plain text: one you trust)
        as `sync.workspace.workspace.Workspace.sync`, and only with `wait`. An index that sends
        many files also leaves the search side built (retrieval.indexes.search_ready), so the
        first search does not build it.
        """
        from retrieval.indexes.search_ready import SearchReady
        from sync.daemon.builder import Builder

        if not wait:
            report = self._ws.index_words(progress=progress)
            SearchReady(self._ws).words()
            report.offline = self._ask_server()
            Builder(self._ws.root).start()
            return report
        self._ws.ensure()
        builder = Builder(self._ws.root)
        builder.stop()  # its sync and this one would do the same work twice
        with builder.hold(wait=30.0) as held:
            if not held:
                raise CodeveilError(
                    f"the vector builder of {builder.root} did not stop; see"
                    f" {builder.files.log}")
            report = self._ws.sync(progress=progress, reupload=reupload, embed_on=embed_on,
                                   follower=SearchReady(self._ws, self._vector_index))
        builder.clear_failure()
        st = builder.state()
        if st is not None and st.state == "stopped":
            # This sync stopped the builder and did its work: what is left is "done"
            # (or offline), not a builder someone stopped halfway.
            st.state, st.offline = ("offline" if report.offline else "done"), report.offline
            builder.write(st)
        return report

    def _ask_server(self) -> str:
        """A server that refuses this checkout (a token it does not accept, a workspace
        it does not hold) says so now, in one line, rather than in the builder's log; one
        that does not answer leaves the builder to index offline, and the reason is
        returned ("" when the server answered or there is none) for the command to say."""
        from sync.transport.http_client import ServerUnavailable

        if load_config(find_root(self._ws.root)).server is None:
            return ""
        try:
            self._ws.open_or_last_known()
        except ServerUnavailable as exc:  # a workspace still to be created there
            return str(exc)
        return "" if self._ws.offline is None else self._ws.offline.summary()

    def builder(self) -> dict[str, object]:
        """The background vector builder of this index (`sync.daemon.builder`): `running`,
        `given_up` (why, or None) and its last state and progress (`state`, `chunks_todo`,
        `chunks_done`, `chunks_per_s`, `seconds_left`, ...), empty when none ran."""
        from sync.daemon.builder import Builder

        builder = Builder(self._ws.root)
        st = builder.state()
        return {"running": builder.running(), "given_up": builder.given_up(),
                **(st.to_dict() if st is not None else {})}

    # -- search ---------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int = SEARCH.default,
        *,
        path: str | None = None,
        language: str | None = None,
        kind: str | Sequence[str] | None = None,
        group: str = "chunk",
    ) -> list[Hit]:
        """The `k` results most relevant to `query`, read from disk, best first.

        Hybrid: the nearest chunks by meaning (encrypted search; a long query is cut into
        parts that each fit the model's window, and each part searched), BM25 over the
        local chunk table, and the chunks of files, frames and symbols the query names,
        fused by reciprocal rank (see `retrieval.search.fusion`).

        `group` picks the level: `"chunk"` ranks chunks; `"symbol"` returns one hit per
        symbol (file and symbol path, e.g. `Session > send`) and `"file"` one hit per file
        (see `retrieval.search.grouping`). A grouped hit shows its best chunk's lines and carries
        the group's aggregated score. `score` is the fused score: higher is better, and it
        compares hits of one result list only (it is not a cosine).

        `path` keeps hits whose path matches a glob (`src/*.py`, `*/tests/*`); `language`
        keeps one language (`python`, `go`, ...); `kind` keeps files of some kinds
        (`"code"`, `"code,docs"` or `["tests", "examples"]`; see `indexer.kinds`).
        """
        keep, level = _search_arguments(query, k, path, language, kind, group)
        from retrieval.search.fusion import group_ranking

        # A sealed workspace on a server is not asked (its client is None): the search
        # runs on this machine's copy. A server-search one ranks on its server.
        root, config, key, client = self._ws.open_for_read(ranks=True)
        if self._ws.offline is not None and not config.sealed:
            raise ServerSearchOffline(server_search_offline_message(self._ws.offline.error))
        db = self._state_db(root)  # kept: opening one costs more than a query
        self._check_state(root, db, None if self._ws.offline else client)
        searcher = self._reader.searcher(root, db, config, key, client)
        try:
            ranking = searcher.rank(query, self.search_options, k, keep)
        except SyncError as exc:  # a server-search workspace's ranking
            from sync.transport.http_client import ServerUnavailable  # imported only by a client

            if not isinstance(exc, ServerUnavailable):
                raise
            raise ServerSearchOffline(server_search_offline_message(str(exc))) from exc
        # Past k, a few more in their exact place stand in for hits of deleted files.
        groups = group_ranking(ranking, level, limit=k + READ_SPARE)
        return self._read_hits(root, LocalChunks(db), groups, k)

    @property
    def offline(self) -> Unreachable | None:
        """Set when the last search or status answered from this machine's copy alone
        because the server did not answer (`sync.checkout.server_contact.Unreachable`)."""
        return self._ws.offline

    def _state_db(self, root: Path) -> sqlite3.Connection:
        """The connection searches read the client state through: opened once and kept,
        and opened again if the file was replaced (`doctor --repair` moves a damaged one
        aside, a user deletes it)."""
        path = state_path(root)
        if self._search_db is not None and _file_identity(path) != self._search_db_identity:
            self._search_db.close()
            self._search_db = None
        if self._search_db is None:
            self._search_db = open_state_db(path)
            self._search_db_identity = _file_identity(path)
        return self._search_db

    @staticmethod
    def _check_state(root: Path, db: sqlite3.Connection, client: StoreClient | None) -> None:
        """Refuse to search with a lost client state: the hits would silently change
        (no lexical side, no exact scores, nothing to re-locate edited chunks with); or
        over an index that was never built. `client` is None when the server did not
        answer."""
        if LocalChunks(db).count_files():
            other = other_workspace(root, db)
            if other is not None:
                raise CodeveilError(other)
            return
        held = client.info().chunks if client is not None else 0
        if held:
            raise CodeveilError(lost_state_message(root, held))
        if not was_completed(db):
            raise IndexNotBuilt(never_completed_message(root))

    def _vector_index(self, root: Path, db: sqlite3.Connection,
                      config: RepoConfig) -> LocalVectorIndex:
        """This machine's own vector index, brought in step with the chunk table."""
        return self._reader.vector_index(root, db, config)

    def _query_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of query texts (each fits the window), through a small LRU cache."""
        return self._reader.queries(texts)

    # What the last search read (retrieval.search.searcher), for the lookups and tests below.

    @property
    def _query_cache(self) -> OrderedDict[str, np.ndarray]:
        return self._reader.queries.cache

    @_query_cache.setter
    def _query_cache(self, cache: OrderedDict[str, np.ndarray]) -> None:
        self._reader.queries.cache = cache

    @property
    def _lexical_store(self) -> LexicalStore | None:
        return self._reader.lexical_store

    @property
    def _vector_store(self) -> LocalVectorStore | None:
        return self._reader.vector_store

    @property
    def _vectors(self) -> LocalVectorIndex | None:
        return self._reader.vectors

    def _read_hits(self, root: Path, local: LocalChunks, groups: list[Group],
                   k: int) -> list[Hit]:
        """The first `k` groups as hits read from disk; a group shows its first member
        that is still on disk, or is marked stale; groups of deleted files are dropped."""
        from indexer.kinds import file_kind
        from retrieval.search.locate import FileLines, locate

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
                language=shown.language, kind=file_kind(shown.path), score=g.score,
                text=text, stale=where is None,
            ))
            if len(hits) >= k:
                break
        return hits

    # -- agent tools: definitions, outlines, references, grep ------------------------

    @property
    def tools(self) -> AgentTools:
        """The lookups beside search (retrieval.agent.agent_tools), for this index's folder."""
        if self._tools is None:
            from retrieval.agent.agent_tools import AgentTools

            self._tools = AgentTools(self._ws.root)
        return self._tools

    def definition(self, name: str, *,
                   limit: int = DEFINITIONS.default) -> list[DefinitionHit]:
        """Where `name` (`send`, `Session.send`, `Sinatra::Base`, `pkg.Func`) is defined,
        best first: `retrieval.agent.agent_tools.AgentTools.definition`."""
        return self.tools.definition(name, limit=limit)

    def outline(self, path: str | Path) -> Outline:
        """The symbols of one file with their lines and signatures:
        `retrieval.agent.agent_tools.AgentTools.outline`."""
        return self.tools.outline(path)

    def grep(self, pattern: str, *, path: str | None = None, ignore_case: bool = False,
             limit: int | None = None) -> GrepResult:
        """The lines of the indexed files matching a regular expression, narrowed by the
        grep index: `retrieval.agent.agent_tools.AgentTools.grep`."""
        return self.tools.grep(pattern, path=path, ignore_case=ignore_case, limit=limit)

    def references(self, name: str, *, path: str | None = None,
                   limit: int = REFERENCES.default) -> list[ReferenceHit]:
        """The chunks that use `name`: `retrieval.agent.agent_tools.AgentTools.references`."""
        return self.tools.references(name, path=path, limit=limit)

    def coverage(self) -> Coverage:
        """How much of the index search by meaning covers (`retrieval.search.coverage`):
        `chunks`, `chunks_with_vectors` and `partial`."""
        total, with_vectors = LocalChunks(self._state_db(find_root(self._ws.root))).coverage()
        vectors = self._reader.vectors
        if vectors is not None:
            # As the last search saw it: chunks whose vector this machine lacks (an
            # emptied cache) are not searched by meaning.
            with_vectors = min(with_vectors, vectors.count)
        return Coverage.of(total, with_vectors)

    def status(self, *, server: bool = False) -> WorkspaceStatus:
        """Where the index is, what it holds, and where its store lives: read as
        attributes, or as the dict it used to be. A workspace on a server is asked only
        with `server` (its counts, and whether its tree of this checkout's ref is the
        one this checkout synced: `server_tree`)."""
        return self._ws.status(server=server)

    def close(self) -> None:
        self._reader.close()
        if self._search_db is not None:
            self._search_db.close()
            self._search_db = None
        self._ws.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _search_arguments(query: str, k: int, path: str | None, language: str | None,
                      kind: str | Sequence[str] | None, group: str,
                      ) -> tuple[HitFilter | None, Level]:
    """`Index.search`'s arguments checked: the filter they ask for, and the level."""
    if not query or not query.strip():
        raise SearchError("the query is empty")
    if k < 1:
        raise SearchError(f"k must be at least 1, got {k}")
    from indexer.kinds import parse_kinds
    from retrieval.search.grouping import LEVELS

    try:
        kinds = parse_kinds(kind if kind is None or isinstance(kind, str) else list(kind))
    except ValueError as exc:
        raise SearchError(str(exc)) from None
    if group not in LEVELS:
        raise SearchError(f"unknown group {group!r}; use one of {', '.join(LEVELS)}")
    if language is not None:
        from indexer.languages import parse_language

        try:
            language = parse_language(language)
        except ValueError as exc:
            raise SearchError(str(exc)) from None
    return HitFilter.of(path, language, kinds), cast("Level", group)  # checked above


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`, None if it is gone: tells a replaced file apart."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def status_json(idx: Index, info: WorkspaceStatus) -> dict[str, object]:
    """The status as `codeveil status --json` prints it and the MCP tool `index_status`
    answers it, one shape: `info` (`Index.status`), `index` (the coverage: how many
    chunks have vectors) and `builder` (`Index.builder`)."""
    return {**info.to_dict(), "index": idx.coverage().to_dict(), "builder": idx.builder()}


def lost_state_message(root: Path, held_chunks: int) -> str:
    """What search and status say when the client state holds no file beside a store that
    holds chunks: a lost state, not an empty index."""
    return (f"the client state {state_path(root)} is missing or empty while the store"
            f" holds {held_chunks} chunks; run `codeveil index` (or `codeveil doctor --repair`)"
            " to rebuild it from the working tree")


