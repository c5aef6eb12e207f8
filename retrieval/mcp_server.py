"""`codeveil mcp`: a Model Context Protocol server over stdio, for coding agents.

Tools (the official `mcp` SDK's `MCPServer`, stdio transport):

- `search(query, k, group, path, language, kind)`: hybrid search of the repo; `group` is
  `chunk`, `symbol` or `file`; `kind` keeps code, tests, docs, examples or config.
  Returns hits with path, lines, symbol, kind, score and the code as it is on disk now.
- `index_status()`: where the index is and what it holds.
- `sync_index()`: bring the index up to date with the working tree (incremental: only
  changed files are read, chunked, embedded and sent).

One `Index` serves every call; calls run one at a time (the SDK runs synchronous tools
in worker threads, and an index is not meant to be searched from two threads at once).
The model loads on the first call that needs it, so the server answers `initialize`
at once. stdout carries the protocol only: nothing here prints.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from indexer.errors import CodeveilError
from retrieval.api import Index

INSTRUCTIONS = """\
codeveil searches this repository's code by meaning and by name (hybrid: embeddings,
BM25 and the paths, symbols and stack frames your query mentions). Ask in natural
language or paste an error or stack trace; long queries are fine. Use group="file" to
find which files to open, group="symbol" for functions and classes, group="chunk" for
exact line ranges. Call sync_index after editing files if results look stale.
"""

MAX_K = 100


def build_server(repo: Path) -> MCPServer:
    """The MCP server of the repo at (or above) `repo`."""
    server: MCPServer = MCPServer(name="codeveil", instructions=INSTRUCTIONS)
    state = _State(repo)

    @server.tool()
    def search(
        query: str,
        k: int = 10,
        group: Literal["chunk", "symbol", "file"] = "chunk",
        path: str | None = None,
        language: str | None = None,
        kind: str | None = None,
    ) -> dict[str, Any]:
        """Search the repository's code for `query` (a question, a description of
        behaviour, an identifier, an error message or a stack trace).

        k: how many results (1-100). group: "chunk" (line ranges), "symbol" (one result
        per function/class) or "file" (one result per file). path: a glob the result
        paths must match, e.g. "src/*" or "*.py". language: e.g. "python". kind: only
        files of these kinds, e.g. "code" or "code,tests" (code, tests, docs, examples,
        config).
        Returns hits best first: path, start_line, end_line (1-based, inclusive),
        symbol, kind (code, tests, docs, examples or config), score (higher is
        better; compare within one result list only), text
        (the lines as they are on disk now) and stale (true if the file changed since it
        was indexed and the lines could not be found again: run sync_index), and
        index: {partial, chunks, chunks_with_vectors}; partial is true while an index
        is still embedding (every chunk is searched by name and words already, only
        chunks_with_vectors of them by meaning).
        """
        k = max(1, min(int(k), MAX_K))
        with state.use() as idx:
            hits = idx.search(query, k=k, group=group, path=path, language=language,
                              kind=kind)
            coverage = idx.coverage()
        return {"query": query, "group": group,
                "hits": [h.to_dict() for h in hits], "index": coverage}

    @server.tool()
    def index_status() -> dict[str, Any]:
        """Where the index is and what it holds: root folder, workspace, server (or
        embedded), model, number of files and chunks."""
        with state.use() as idx:
            return idx.status()

    @server.tool()
    def sync_index() -> dict[str, Any]:
        """Bring the index up to date with the files on disk (only changed files are
        read and embedded; the first run indexes everything and can take minutes).
        Returns what changed."""
        with state.use() as idx:
            return idx.index().to_dict()

    return server


class _State:
    """The one Index of this server, opened on first use, used by one call at a time."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._index: Index | None = None

    @contextmanager
    def use(self) -> Iterator[Index]:
        """The index, locked; codeveil's errors become tool errors the agent can read
        (the SDK shows other exceptions as a bare "error executing tool")."""
        with self._lock:
            try:
                if self._index is None:
                    self._index = Index(self.repo)
                yield self._index
            except CodeveilError as exc:
                raise ToolError(str(exc)) from exc
            except sqlite3.DatabaseError as exc:
                raise ToolError(f"an index file is corrupt ({exc}); `codeveil doctor` finds"
                                " which, `codeveil doctor --repair` rebuilds it") from exc


def run(repo: Path) -> None:
    """Serve the repo at `repo` over stdio until the client closes the connection."""
    build_server(repo).run("stdio")
