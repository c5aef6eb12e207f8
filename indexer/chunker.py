"""Split a file into chunks along its syntax tree: split-then-merge, as in cAST.

Top-level syntax nodes become pieces; a node over the token budget is replaced by
its children, recursively, until every piece fits (or is a single line, which is
never split). `textsplit.pack` then merges neighbouring pieces up to the budget,
cutting where the tree is shallowest. Comments and attributes directly above a
definition are glued to it. Chunks are runs of whole lines that together cover
every non-blank line of the file exactly once.

Every tree-sitter call of the project lives in this module, in indexer.syntax_names
(which nodes define what, and their names) and in indexer.definitions, which reads
the definitions of the same tree (`parse` hands it over: one parse a file).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from itertools import accumulate, pairwise
from typing import Final

from tree_sitter import Node, Parser, Query, QueryCursor
from tree_sitter_language_pack import get_language, get_parser

from indexer.chunk import Chunk
from indexer.languages import GRAMMAR_LANGUAGES, NOTEBOOK, language_for_path
from indexer.notebook import Cell, NotebookError, parse_notebook
from indexer.syntax_names import DEFINITIONS, LEADING, WRAPPERS, definition_names
from indexer.textsplit import (
    GLUE,
    Path,
    Pieces,
    format_symbol,
    line_costs,
    pack,
    symbol_parts,
    text_pieces,
)
from indexer.tokens import CONTENT_MAX_TOKENS, TokenCounter, default_counter

HEADER_RESERVE: Final = 32
"""Tokens kept free by default for the `path > symbol` header line."""

DEFAULT_MAX_TOKENS: Final = CONTENT_MAX_TOKENS - HEADER_RESERVE
"""Default budget of a chunk's own text, in word pieces."""

MIN_SYMBOL_TOKENS: Final = 12
"""A symbol always gets at least this much room next to a full chunk."""

MIN_TEXT_BUDGET: Final = 32
"""Floor for the text budget when a very long path eats the window."""

__all__ = ["DEFAULT_MAX_TOKENS", "ParsedTree", "chunk_file", "parse", "split_lines"]

ParsedTree = tuple[str, Node]
"""(language, root node): a file's syntax tree, under the grammar that read it (a `.h`
file read as C++ says "cpp")."""


def split_lines(text: str) -> list[str]:
    """Lines of `text` split at "\\n" only, each keeping its line ending."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def chunk_file(
    path: str,
    text: str,
    *,
    language: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    counter: TokenCounter | None = None,
    tree: ParsedTree | None = None,
) -> list[Chunk]:
    """Chunks of one file, in order, covering each of its non-blank lines once.

    `path` is repo-relative with POSIX separators. `language` is a name from
    `languages.language_for_path`; when None it is looked up from `path`, and a
    path of unknown type is chunked as plain text. `max_tokens` bounds each
    chunk's text; it is lowered further when the path is long, so that the header
    and the text together fit the model's window. Only a chunk made of a single
    line longer than the budget can exceed it. A notebook is chunked cell by cell
    (outputs left out), each chunk in its cell's language, its lines those of the
    cell's source in the notebook's JSON. `tree` is `parse(text, language)` when the
    caller parsed the file already.
    """
    if not text.strip():
        return []
    counter = counter or default_counter()
    language = language or language_for_path(path) or "text"
    if language == NOTEBOOK:
        return _notebook_chunks(path, text, max_tokens, counter)
    lines = split_lines(text)
    return [
        Chunk(path, start + 1, end + 1, language, symbol, "".join(lines[start : end + 1]))
        for start, end, symbol in _spans(path, lines, language, max_tokens, counter,
                                         tree=tree)
    ]


def _spans(
    path: str,
    lines: Sequence[str],
    language: str,
    max_tokens: int,
    counter: TokenCounter,
    measured: Sequence[str] | None = None,
    tree: ParsedTree | None = None,
) -> list[tuple[int, int, str]]:
    """(first line, last line, symbol) of each chunk of `lines`, 0-based, inclusive.

    `measured` are the lines whose word pieces count against the budget, one for each
    of `lines` (by default `lines` themselves): a notebook cell is parsed as its code
    but shown, and embedded, as the JSON strings that hold it. `tree` is the parse of
    `lines` when the caller has it.
    """
    prefix = [0, *accumulate(counter.line_counts(measured or lines))]
    path_tokens = counter.count(path)
    room = CONTENT_MAX_TOKENS - path_tokens - 1 - MIN_SYMBOL_TOKENS
    budget = min(max_tokens, max(MIN_TEXT_BUDGET, room))

    pieces = None
    if language in GRAMMAR_LANGUAGES:
        pieces = _syntax_pieces(lines, prefix, budget,
                                tree or parse("".join(lines), language))
    if pieces is None:
        pieces = text_pieces(lines, language)

    runs = pack(pieces.starts, pieces.costs, len(lines), prefix, budget)
    spans = []
    for first, last in runs:
        stop = pieces.starts[last + 1] if last + 1 < len(pieces.starts) else len(lines)
        start, end = _trim(lines, pieces.starts[first], stop - 1)
        if start > end:
            continue
        bounds = [*pieces.starts[first : last + 1], stop]
        sizes = [prefix[b] - prefix[a] for a, b in pairwise(bounds)]
        parts = symbol_parts(
            pieces.defined[first : last + 1], pieces.within[first : last + 1], sizes
        )
        slack = CONTENT_MAX_TOKENS - path_tokens - 1 - (prefix[end + 1] - prefix[start])
        spans.append((start, end, _fit_symbol(*parts, max(slack, MIN_SYMBOL_TOKENS), counter)))
    return spans


_RAW_CELL_LANGUAGES: Final = {"text/restructuredtext": "rst", "text/x-rst": "rst",
                               "text/markdown": "markdown", "text/x-markdown": "markdown",
                               "text/html": "html", "text/latex": "latex"}


def _cell_language(cell: Cell, code_language: str) -> str:
    """Code cells are in the notebook's language, markdown cells in Markdown, and raw
    cells in what their metadata says (often reStructuredText in docs), else text."""
    if cell.kind == "code":
        return code_language
    if cell.kind == "markdown":
        return "markdown"
    return _RAW_CELL_LANGUAGES.get(cell.mimetype.lower(), "text")


def _notebook_chunks(path: str, text: str, max_tokens: int, counter: TokenCounter) -> list[Chunk]:
    """A notebook's chunks: each cell's source chunked as its own language (markdown
    cells as prose), never its outputs; line numbers and text are the file's own."""
    try:
        notebook = parse_notebook(text)
    except NotebookError:
        # The walk rejects broken notebooks; one passed here directly is still chunked.
        return chunk_file(path, text, language="json", max_tokens=max_tokens, counter=counter)
    file_lines = split_lines(text)
    chunks: list[Chunk] = []
    for cell in notebook.cells:
        if not cell.source or not cell.text.strip():
            continue
        language = _cell_language(cell, notebook.language)
        first, last = cell.source[0].file_line, cell.source[-1].file_line
        if chunks and first < chunks[-1].end_line:  # cells share a line: no cell layout
            return chunk_file(path, text, language="json", max_tokens=max_tokens,
                              counter=counter)
        if cell.one_line_each():
            # Parsed as the cell's code, measured and shown as the file's lines.
            lines = [line.text for line in cell.source]
            where = [line.file_line for line in cell.source]
            measured = [file_lines[w] for w in where]
            spans = [(where[s], where[e], symbol) for s, e, symbol in
                     _spans(path, lines, language, max_tokens, counter, measured=measured)]
        else:  # a source written as one string: its lines are the file's lines
            spans = [(first + s, first + e, symbol) for s, e, symbol in
                     _spans(path, file_lines[first : last + 1], "text", max_tokens, counter)]
        chunks.extend(
            Chunk(path, s + 1, e + 1, language, symbol, "".join(file_lines[s : e + 1]))
            for s, e, symbol in spans
        )
    return chunks


def _trim(lines: Sequence[str], start: int, end: int) -> tuple[int, int]:
    """Narrow start..end (inclusive) to its first and last non-blank lines."""
    while start <= end and not lines[start].strip():
        start += 1
    while end >= start and not lines[end].strip():
        end -= 1
    return start, end


def _fit_symbol(common: Path, names: tuple[str, ...], limit: int, counter: TokenCounter) -> str:
    """The most informative form of the symbol path that fits `limit` tokens."""
    candidates = (
        format_symbol(common, names),
        format_symbol(common, names[:1]),
        format_symbol(common[-1:], names[:1]),
        format_symbol((), names[:1]) if names else format_symbol(common[-1:], ()),
    )
    for candidate in candidates:
        # A word piece covers at least one character, so short text needs no count.
        if len(candidate) <= limit or counter.count(candidate) <= limit:
            return candidate
    return ""


# --- syntax tree -> pieces ------------------------------------------------------------

_local = threading.local()


def _parser(language: str) -> Parser | None:
    """This thread's parser for `language` (parsers must not be shared by threads)."""
    parsers: dict[str, Parser | None] = _local.__dict__.setdefault("parsers", {})
    if language not in parsers:
        try:
            parsers[language] = get_parser(language)  # type: ignore[arg-type]
        except LookupError:
            parsers[language] = None
    return parsers[language]


def parse(text: str, language: str) -> ParsedTree | None:
    """The syntax tree of `text` in `language`, or None without a grammar for it."""
    parser = _parser(language)
    if parser is None:
        return None
    source = text.encode("utf-8", "replace")
    root = parser.parse(source).root_node
    if language == "c" and root.has_error:
        # A .h file is as often C++ as C: take the C++ reading if it parses, or if it
        # breaks in fewer places (a C++ header full of macros parses in neither).
        cpp = _parser("cpp")
        cpp_root = cpp.parse(source).root_node if cpp is not None else None
        if cpp_root is not None and (not cpp_root.has_error
                                     or _errors(cpp_root, "cpp") < _errors(root, "c")):
            language, root = "cpp", cpp_root
    return language, root


def _errors(root: Node, language: str) -> int:
    """How many ERROR nodes the tree holds (counted by a query, in C)."""
    query = _error_queries.get(language)
    if query is None:
        grammar = get_language(language)  # type: ignore[arg-type]
        query = _error_queries[language] = Query(grammar, "(ERROR) @e")
    return len(QueryCursor(query).captures(root).get("e", []))


_error_queries: dict[str, Query] = {}


def _syntax_pieces(
    lines: Sequence[str], prefix: Sequence[int], budget: int, tree: ParsedTree | None
) -> Pieces | None:
    """Pieces along the syntax tree, or None to fall back to the line splitter."""
    if tree is None:
        return None
    language, root = tree
    builder = _TreeSplitter(lines, prefix, budget, DEFINITIONS[language])
    try:
        builder.visit(_items(root.children, ()), 0, len(lines) - 1, 0, 0)
    except RecursionError:
        return None  # absurdly deep nesting: lines will do
    return builder.pieces


# An item is a syntax node with the scope it sits in and the lines it spans.
_Item = tuple[Node, Path, int, int]


def _rows(node: Node) -> tuple[int, int] | None:
    """First and last line of `node`, or None for an empty (e.g. missing) node."""
    if node.start_byte == node.end_byte:
        return None
    start = node.start_point.row
    end_point = node.end_point
    end = end_point.row
    # Some grammars end a node after its newline (Rust and C line comments,
    # preprocessor lines): it does not really reach into the next line.
    if end_point.column == 0 and end > start:
        end -= 1
    return start, end


def _items(nodes: Iterable[Node], scope: Path) -> list[_Item]:
    items = []
    for node in nodes:
        rows = _rows(node)
        if rows is not None:
            items.append((node, scope, rows[0], rows[1]))
    return items


def _group(items: Sequence[_Item]) -> list[tuple[int, int, list[_Item]]]:
    """Items merged into groups that share no line with each other."""
    groups: list[tuple[int, int, list[_Item]]] = []
    for item in items:
        if groups and item[2] <= groups[-1][1]:
            start, end, members = groups[-1]
            members.append(item)
            groups[-1] = (start, max(end, item[3]), members)
        else:
            groups.append((item[2], item[3], [item]))
    return groups


class _TreeSplitter:
    """Walks the syntax tree top-down, emitting a piece for every node that fits."""

    def __init__(
        self,
        lines: Sequence[str],
        prefix: Sequence[int],
        budget: int,
        definitions: frozenset[str],
    ) -> None:
        self.lines = lines
        self.prefix = prefix
        self.budget = budget
        self.definitions = definitions
        self.pieces = Pieces()

    def visit(
        self,
        items: list[_Item],
        lo: int,
        hi: int,
        depth: int,
        first_cost: int,
        split_first: bool = False,
    ) -> None:
        """Emit pieces covering lines lo..hi, which hold `items` (siblings, in order).

        `split_first` asks for the first group to be split even if it fits.
        """
        groups = _group(items)
        if not groups:
            self.pieces.add(lo, first_cost)
            return
        glued = False
        glue_start = lo  # first line of the header or comments glued to the coming group
        for index, (start, end, members) in enumerate(groups):
            first = lo if index == 0 else start
            last = groups[index + 1][0] - 1 if index + 1 < len(groups) else hi
            if index == 0:
                cost = first_cost
            elif glued:
                cost = GLUE
            else:
                cost = 2 * depth + (0 if not self.lines[start - 1].strip() else 1)
            # A group that does not fit together with the header or comment glued to
            # it is split even if it fits by itself, so they can join its first part.
            split = glued and self._tokens(glue_start, last) > self.budget
            split = split or (index == 0 and split_first)
            self._emit(members, (first, last, start, end), depth, cost, split)
            if index + 1 < len(groups):
                leading = index == 0 and _is_header(members)
                leading = leading or (_is_leading(members) and groups[index + 1][0] == end + 1)
                if leading and not glued:
                    glue_start = first
                glued = leading

    def _tokens(self, first: int, last: int) -> int:
        return self.prefix[last + 1] - self.prefix[first]

    def _emit(
        self,
        members: list[_Item],
        span: tuple[int, int, int, int],
        depth: int,
        cost: int,
        split: bool,
    ) -> None:
        """Pieces for one group; `split` asks to split it even if it fits.

        `span` is (first, last, start, end): the lines the piece must cover, and the
        lines the group's nodes occupy. Lines in between that no node occupies (the
        text of a string whose escapes were expanded, say) can only be split by line.
        """
        first, last, start, end = span
        total = self._tokens(first, last)
        if total <= self.budget and not split:
            self.pieces.add(first, cost, *self._paths(members))
            return
        if start == end and self._tokens(start, end) == total:
            self.pieces.add(first, cost, *self._paths(members))  # one line is never split
            return
        children = self._expand(members) if start < end else None
        if children is not None:
            self.visit(children, first, last, depth + 1, cost, split)
            return
        paths = self._paths(members)
        self.pieces.add(first, cost, *paths)
        if total <= self.budget:
            return
        costs = line_costs(self.lines, first + 1, last + 1, depth + 1)
        for offset, line_cost in enumerate(costs, start=first + 1):
            self.pieces.add(offset, line_cost, *paths)

    def _expand(self, members: list[_Item]) -> list[_Item] | None:
        """Children of the group's nodes, or None if none of them has any."""
        expanded: list[_Item] = []
        grew = False
        for item in members:
            node, scope = item[0], item[1]
            children = _items(node.children, self._inner_scope(node, scope))
            if children:
                expanded.extend(children)
                grew = True
            else:
                expanded.append(item)
        return expanded if grew else None

    def _inner_scope(self, node: Node, scope: Path) -> Path:
        if node.type in self.definitions and node.type not in WRAPPERS:
            return scope + definition_names(node)
        return scope

    def _paths(self, members: list[_Item]) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
        """Paths of the definitions in a group, and of the scopes of its other nodes."""
        defined: list[Path] = []
        within: list[Path] = []
        for node, scope, _, _ in members:
            names = definition_names(node) if node.type in self.definitions else ()
            if names:
                defined.append(scope + names)
            else:
                within.append(scope)
                defined.extend(self._nested(node, scope))
        return tuple(dict.fromkeys(defined)), tuple(dict.fromkeys(within))

    def _nested(self, node: Node, scope: Path) -> list[Path]:
        """The outermost named definitions inside a node that names nothing itself: the
        functions of a Lua module written inside the function it returns, of an `#ifdef`
        block, of an anonymous wrapper. Each node is looked at once, since the pieces
        of a file are disjoint."""
        out: list[Path] = []
        stack = list(reversed(node.children))
        definitions = self.definitions
        while stack:
            child = stack.pop()
            if child.type in definitions:
                names = definition_names(child)
                if names:
                    out.append(scope + names)
                    continue
            # A definition inside a node of one line is not one anybody looks for.
            if child.child_count and child.end_point.row > child.start_point.row:
                stack.extend(reversed(child.children))
        return out


def _is_header(members: list[_Item]) -> bool:
    """Whether the first group of a split node is its header (`def f(x):`, `{`).

    Keywords and punctuation appear as direct children only in a node's own header;
    a list of statements has named children only.
    """
    return any(not item[0].is_named for item in members)


def _is_leading(members: list[_Item]) -> bool:
    """Whether the group is only comments or attributes (which describe what follows)."""
    return all("comment" in item[0].type or item[0].type in LEADING for item in members)
