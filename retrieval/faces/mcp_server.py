"""`codeveil mcp`: a Model Context Protocol server over stdio, for coding agents.

Tools (the official `mcp` SDK's `MCPServer`, stdio transport):

- `search(query, k, group, path, language, kind, repos)`: hybrid search of the repo;
  `group` is `chunk`, `symbol` or `file`; `kind` keeps code, tests, docs, examples or
  config; `repos` names other indexed folders to rank together with this one.
  Returns hits with path, lines, symbol, kind, score and the code as it is on disk now.
- `definition(name, limit)`: where a symbol is defined (`Session.send`, `Sinatra::Base`),
  candidates ranked, each with its signature and its first lines.
- `outline(path)`: a file's symbols with their lines and signatures.
- `references(name, path, limit)`: the chunks that use a name, with the lines it is on.
- `grep(pattern, path, ignore_case, limit)`: regex lines of the indexed files, narrowed by
  the grep index (exact: the lines a full scan finds).
- `index_status(server)`: where the index is and what it holds, with the vector
  builder's progress (the JSON of `codeveil status --json`).
- `sync_index(wait)`: bring the index up to date with the working tree (incremental:
  only changed files are read and chunked); returns once words and names are indexed,
  and the vectors follow from the background builder (`sync.daemon.builder`); with `wait`,
  once they are built.

The seven tools' arguments, their defaults, limits and help texts, and so their JSON
schemas, are built from the table of operations (`retrieval.faces.operations`) that the
`codeveil` command's options are built from too. A result count under 1 is refused by
its schema's bound; one over its most is taken as the most, as its description says.
An unknown or missing argument, or one its schema refuses, is one line naming it.

Every answer comes from this machine's copy: a sealed workspace's server is never asked
by a read. A server-search workspace's search ranks on its server; when that cannot be
reached its search is refused, and `index_status` and that search carry `offline`:
{server, reachable: false, last_sync, error}.

Every result of the four lookups carries `tokens`: an estimate of the tokens it costs an
agent to read, len(JSON text) / 4 rounded up (`estimate_tokens`), so a caller can weigh
a lookup against a search. Text is kept short: a definition shows CONTEXT_LINES lines
and says `truncated` (with its full line range) when it is longer; grep returns at most
`limit` lines and says `truncated`.

One `Index` serves every call; calls run one at a time (the SDK runs synchronous tools
in worker threads, and an index is not meant to be searched from two threads at once).
The model loads on the first call that needs it, so the server answers `initialize`
at once. stdout carries the protocol only: nothing here prints.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from indexer.errors import CodeveilError
from retrieval.faces.api import Index, status_json
from retrieval.faces.multi import MultiIndex
from retrieval.faces.operations import (
    DEFINITION_OP,
    GREP_OP,
    INDEX_OP,
    MCP,
    OUTLINE_OP,
    REFERENCES_OP,
    REQUIRED,
    SEARCH_OP,
    STATUS_OP,
    Arg,
    Operation,
)

INSTRUCTIONS = """\
codeveil searches this repository's code by meaning and by name (hybrid: embeddings,
BM25 and the paths, symbols and stack frames your query mentions). Ask in natural
language or paste an error or stack trace; long queries are fine. Use group="file" to
find which files to open, group="symbol" for functions and classes, group="chunk" for
exact line ranges. When you know the name, `definition` finds where it is defined,
`references` who uses it, `outline` what a file holds, and `grep` runs a regex over the
indexed files (exact and fast). Each lookup result says how many tokens it costs.
Call sync_index after editing files if results look stale.
"""

CONTEXT_LINES = 6
"""Lines of a definition shown from its first; longer ones say `truncated`."""


def estimate_tokens(payload: dict[str, Any]) -> int:
    """Tokens an agent reads for `payload`: its JSON text's length / 4, rounded up (the
    usual rule of thumb for code and English under BPE tokenizers)."""
    return math.ceil(len(json.dumps(payload, ensure_ascii=False)) / 4)


def _with_tokens(payload: dict[str, Any]) -> dict[str, Any]:
    payload["tokens"] = 0
    payload["tokens"] = estimate_tokens(payload)
    return payload


def _excerpt(root: Path, path: str, start: int, end: int) -> tuple[str, bool]:
    """The first CONTEXT_LINES lines of start..end as on disk, and whether it was cut."""
    try:
        lines = (root / path).read_text(errors="replace").split("\n")
    except OSError:
        return "", False
    last = min(end, start + CONTEXT_LINES - 1)
    return "\n".join(lines[start - 1 : last]), last < end


#: What a client may assume of a lookup: it reads the index and the files and changes
#: nothing, so clients need not ask before each call (they do for a tool without hints).
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
#: sync_index writes the index (never the files), and a second call finds nothing to do.
WRITES_INDEX = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                               idempotent_hint=True, open_world_hint=False)


def _version() -> str:
    try:
        return importlib.metadata.version("codeveil")
    except importlib.metadata.PackageNotFoundError:  # a checkout run without installing
        return "0+unknown"


class _Server(MCPServer):
    """The SDK's server with codeveil's argument checks: an unknown or missing argument,
    or one outside its schema's bounds, is refused in one line that names it (the SDK
    would drop an unknown one silently, and explain the others in pydantic's words with
    a link)."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            _check_names(name, tool.parameters, arguments)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(_one_line(name, exc.__cause__)) from None
            raise


def _check_names(tool: str, schema: dict[str, Any], given: dict[str, Any]) -> None:
    known = schema.get("properties", {})
    unknown = sorted(set(given) - set(known))
    if unknown:
        takes = ", ".join(known) or "no arguments"
        raise ToolError(f"{tool}: unknown argument {unknown[0]!r}; it takes {takes}")
    missing = [n for n in schema.get("required", []) if n not in given]
    if missing:
        about = known[missing[0]].get("description", "")
        raise ToolError(f"{tool}: missing argument {missing[0]!r}"
                        + (f" ({about.rstrip('.')})" if about else ""))


def _one_line(tool: str, exc: ValidationError) -> str:
    """The first of pydantic's complaints, in one line without its codes and link."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    bound = (err.get("ctx") or {}).get("ge")
    if err["type"] == "greater_than_equal" and bound is not None:
        return f"{tool}: argument {where!r} must be at least {bound}"
    msg = err["msg"].removeprefix("Input should be ")
    return f"{tool}: argument {where!r} should be {msg}"


#: Request kinds the SDK serves whether or not there is anything behind them: codeveil
#: has no prompts and no resources, so it does not advertise them.
_UNUSED = ("prompts/list", "prompts/get", "resources/list", "resources/read",
           "resources/templates/list")


def build_server(repo: Path) -> MCPServer:
    """The MCP server of the repo at (or above) `repo`."""
    # WARNING: at INFO the SDK logs a boxed block to stderr for every failed call, which
    # the tool's error already tells the agent.
    server: MCPServer = _Server(name="codeveil", instructions=INSTRUCTIONS,
                                version=_version(), log_level="WARNING")
    handlers = getattr(server._lowlevel_server, "_request_handlers", {})
    for method in _UNUSED:  # the capabilities are derived from what is served
        handlers.pop(method, None)
    state = _State(repo)
    for op, answer in ((SEARCH_OP, _search), (DEFINITION_OP, _definition),
                       (OUTLINE_OP, _outline), (REFERENCES_OP, _references),
                       (GREP_OP, _grep)):
        _add_tool(server, state, op, answer)
    # What the index holds, and bringing it up to date: no cost in tokens is told.
    _add_tool(server, state, STATUS_OP, _index_status, tokens=False)
    _add_tool(server, state, INDEX_OP, _sync_index, annotations=WRITES_INDEX, tokens=False)
    return server


# -- the tools built from the table of operations (retrieval.faces.operations) -------------


def _add_tool(server: MCPServer, state: _State, op: Operation,
              answer: Callable[..., dict[str, Any]], *,
              annotations: ToolAnnotations = READ_ONLY, tokens: bool = True) -> None:
    """The tool `op.tool`: its arguments and their JSON schema from the table, its
    description `answer`'s docstring. A result count over its most is taken as the most;
    with `tokens`, the answer says what it costs to read."""
    args = op.face_args(MCP)

    def tool(**given: Any) -> dict[str, Any]:
        for arg in args:
            if arg.count is not None and given.get(arg.name) is not None:
                given[arg.name] = arg.count.clamp(given[arg.name])
        out = answer(state, **given)
        return _with_tokens(out) if tokens else out

    tool.__name__ = op.tool
    # The SDK reads the arguments from the signature (inspect.signature honours this).
    tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_parameter(arg) for arg in args], return_annotation=dict[str, Any])
    server.add_tool(tool, name=op.tool, description=answer.__doc__, annotations=annotations)


def _index_status(state: _State, server: bool) -> dict[str, Any]:
    """Where the index is and what it holds: root folder, workspace, server (or
    embedded), model, number of files and chunks; index: {partial, chunks,
    chunks_with_vectors}; builder: the background vector builder (running, state,
    chunks_done of chunks_todo, seconds_left). The same JSON as `codeveil status --json`.
    """
    with state.use() as idx:
        return status_json(idx, idx.status(server=server))


def _sync_index(state: _State, wait: bool) -> dict[str, Any]:
    """Bring the index up to date with the files on disk (only changed files are read).
    Returns in seconds, once every file is searchable by words, names and structure;
    the vectors are built in the background (index_status shows how far), and search
    uses them as they land; with wait, it returns once they are all built. Returns
    what changed, and index/builder as index_status.
    """
    with state.use() as idx:
        report = idx.index(wait=wait)
        return {**report.to_dict(), "index": idx.coverage().to_dict(),
                "builder": idx.builder()}


def _parameter(arg: Arg) -> inspect.Parameter:
    """`arg` as a tool parameter: its type (with choices as an enum) and help text."""
    kind: Any = str if arg.type is Path else arg.type
    if arg.choices:
        kind = Literal.__getitem__(arg.choices)
    if arg.for_agent is None:
        kind = kind | None
    default = inspect.Parameter.empty if arg.for_agent is REQUIRED else arg.for_agent
    # A count's least is a bound of the schema (0 is refused); its most is not: more is
    # taken as the most, as the description says.
    least = 1 if arg.count is not None else None
    return inspect.Parameter(arg.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, Field(description=arg.agent_help(),
                                                              ge=least)])


def _search(state: _State, query: str, k: int, group: str, path: str | None,
            language: str | None, kind: str | None, repos: list[str] | None,
            ) -> dict[str, Any]:
    """Search the repository's code by meaning and by name.

    Returns hits best first: path, start_line, end_line (1-based, inclusive), symbol,
    kind (code, tests, docs, examples or config), score (higher is better; compare
    within one result list only), text (the lines as they are on disk now) and stale
    (true if the file changed since it was indexed and the lines could not be found
    again: run sync_index), and index: {partial, chunks, chunks_with_vectors}; partial
    is true while an index is still embedding (every chunk is searched by name and words
    already, only chunks_with_vectors of them by meaning); tokens: what the answer costs
    to read.
    """
    if repos:
        with state.use_many(repos) as many:
            hits = many.search(query, k=k, group=group, path=path, language=language,
                               kind=kind)
            out = {"query": query, "group": group, "hits": [h.to_dict() for h in hits],
                   "index": {r: c.to_dict() for r, c in many.coverage().items()}}
            unreachable = many.offline()
            if unreachable:
                out["offline"] = {r: u.to_dict() for r, u in unreachable.items()}
            return out
    with state.use() as idx:
        hits = idx.search(query, k=k, group=group, path=path, language=language, kind=kind)
        coverage = idx.coverage()
        offline = idx.offline
    out = {"query": query, "group": group, "hits": [h.to_dict() for h in hits],
           "index": coverage.to_dict()}
    if offline is not None:
        out["offline"] = offline.to_dict()
    return out


def _definition(state: _State, name: str, limit: int) -> dict[str, Any]:
    """Where a symbol is defined: a class, function, method, type or constant, from the
    syntax tree (not a text match).

    Returns definitions best first (the whole name over a tail of it, source over tests
    and docs): path, start_line, end_line, symbol, kind, signature, text (its first
    lines as on disk now), truncated (the definition goes on to end_line), and tokens
    (what this result costs to read).
    """
    with state.use() as idx:
        hits = idx.definition(name, limit=limit)
        root = idx.root
    out = []
    for hit in hits:
        text, cut = _excerpt(root, hit.path, hit.start_line, hit.end_line)
        out.append({**hit.to_dict(), "text": text, "truncated": cut})
    return {"name": name, "definitions": out}


def _outline(state: _State, path: str) -> dict[str, Any]:
    """The symbols a file defines, in file order: symbol, name, kind, start_line,
    end_line, signature (one line), depth (nesting), and reparsed (true if the file
    changed since it was indexed and was read as it is now). Cheaper than reading the
    file to see what is in it.
    """
    with state.use() as idx:
        result = idx.outline(path).to_dict()
    return result


def _references(state: _State, name: str, path: str | None, limit: int) -> dict[str, Any]:
    """The chunks that use a name, the definition left out.

    Each: path, start_line, end_line, symbol, lines (where the name is), text (up to 3
    of those lines), truncated, approximate (true where whole words were matched because
    the language has no grammar here; false means identifiers in the syntax tree),
    resolved (true where the file imports the name from a file defining it, or defines
    it: Python, JavaScript/TypeScript relative imports, Go packages; those rank first).
    """
    with state.use() as idx:
        hits = idx.references(name, path=path, limit=limit)
    return {"name": name, "references": [h.to_dict() for h in hits]}


def _grep(state: _State, pattern: str, path: str | None, ignore_case: bool,
          limit: int) -> dict[str, Any]:
    """Lines of the indexed files matching a regular expression (matched line by line
    like ripgrep), read from disk now; exact (the same lines a scan of every file finds)
    and fast (a trigram index rules files out). truncated says there were more than
    `limit`. Each match: path, line, column, text.
    """
    with state.use() as idx:
        result = idx.grep(pattern, path=path, ignore_case=ignore_case, limit=limit)
    return result.to_dict()


class _State:
    """The one Index of this server, opened on first use, used by one call at a time."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._index: Index | None = None
        # The last set of repositories searched together (an agent repeats it).
        self._many: tuple[tuple[str, ...], MultiIndex] | None = None

    @contextmanager
    def use(self) -> Iterator[Index]:
        """The index, locked; codeveil's errors become tool errors the agent can read
        (the SDK shows other exceptions as a bare "error executing tool")."""
        with self._lock, _tool_errors():
            if self._index is None:
                self._index = Index(self.repo)
            yield self._index

    @contextmanager
    def use_many(self, others: list[str]) -> Iterator[MultiIndex]:
        """This repository and `others` as one MultiIndex, locked, kept for the next
        call that names the same ones."""
        with self._lock, _tool_errors():
            wanted = tuple(others)
            if self._many is None or self._many[0] != wanted:
                if self._many is not None:
                    self._many[1].close()
                    self._many = None
                self._many = (wanted, MultiIndex([self.repo, *map(Path, wanted)]))
            yield self._many[1]


@contextmanager
def _tool_errors() -> Iterator[None]:
    from sync.checkout.config import NoIndexError
    from sync.checkout.index_state import IndexNotBuilt

    try:
        yield
    except (NoIndexError, IndexNotBuilt) as exc:
        # The agent can build it itself: say the tool, not only the shell command.
        raise ToolError(f"{exc}; or call the sync_index tool, which builds it") from exc
    except CodeveilError as exc:
        raise ToolError(str(exc)) from exc
    except sqlite3.DatabaseError as exc:
        raise ToolError(f"an index file is corrupt ({exc}); `codeveil doctor` finds"
                        " which, `codeveil doctor --repair` rebuilds it") from exc


def run(repo: Path) -> None:
    """Serve the repo at `repo` over stdio until the client closes the connection."""
    build_server(repo).run("stdio")
