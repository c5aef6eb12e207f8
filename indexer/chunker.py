"""Split a file into chunks along its syntax tree: split-then-merge, as in cAST.

Top-level syntax nodes become pieces; a node over the token budget is replaced by
its children, recursively, until every piece fits (or is a single line, which is
never split). `textsplit.pack` then merges neighbouring pieces up to the budget,
cutting where the tree is shallowest. Comments and attributes directly above a
definition are glued to it. Chunks are runs of whole lines that together cover
every non-blank line of the file exactly once.

Every tree-sitter call of the project lives in this module.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, pairwise
from typing import Final

from tree_sitter import Node, Parser
from tree_sitter_language_pack import get_parser

from indexer.chunk import Chunk
from indexer.languages import GRAMMAR_LANGUAGES, NOTEBOOK, language_for_path
from indexer.notebook import Cell, NotebookError, parse_notebook
from indexer.textsplit import (
    GLUE,
    Path,
    Pieces,
    clean_name,
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

__all__ = ["DEFAULT_MAX_TOKENS", "chunk_file", "split_lines"]


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
) -> list[Chunk]:
    """Chunks of one file, in order, covering each of its non-blank lines once.

    `path` is repo-relative with POSIX separators. `language` is a name from
    `languages.language_for_path`; when None it is looked up from `path`, and a
    path of unknown type is chunked as plain text. `max_tokens` bounds each
    chunk's text; it is lowered further when the path is long, so that the header
    and the text together fit the model's window. Only a chunk made of a single
    line longer than the budget can exceed it. A notebook is chunked cell by cell
    (outputs left out), each chunk in its cell's language, its lines those of the
    cell's source in the notebook's JSON.
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
        for start, end, symbol in _spans(path, lines, language, max_tokens, counter)
    ]


def _spans(
    path: str,
    lines: Sequence[str],
    language: str,
    max_tokens: int,
    counter: TokenCounter,
    measured: Sequence[str] | None = None,
) -> list[tuple[int, int, str]]:
    """(first line, last line, symbol) of each chunk of `lines`, 0-based, inclusive.

    `measured` are the lines whose word pieces count against the budget, one for each
    of `lines` (by default `lines` themselves): a notebook cell is parsed as its code
    but shown, and embedded, as the JSON strings that hold it.
    """
    prefix = [0, *accumulate(counter.line_counts(measured or lines))]
    path_tokens = counter.count(path)
    room = CONTENT_MAX_TOKENS - path_tokens - 1 - MIN_SYMBOL_TOKENS
    budget = min(max_tokens, max(MIN_TEXT_BUDGET, room))

    pieces = None
    if language in GRAMMAR_LANGUAGES:
        pieces = _syntax_pieces("".join(lines), lines, prefix, budget, language)
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

_JS_DEFINITIONS: Final = frozenset(
    {
        "function_declaration",
        "generator_function_declaration",
        "class_declaration",
        "class",
        "method_definition",
        "lexical_declaration",
        "variable_declaration",
        "export_statement",
        "field_definition",
        "pair",
    }
)
_TS_DEFINITIONS: Final = _JS_DEFINITIONS | {
    "abstract_class_declaration",
    "interface_declaration",
    "type_alias_declaration",
    "enum_declaration",
    "internal_module",
    "module",
    "function_signature",
    "method_signature",
    "abstract_method_signature",
    "public_field_definition",
}
_C_DEFINITIONS: Final = frozenset(
    {
        "function_definition",
        "struct_specifier",
        "union_specifier",
        "enum_specifier",
        "type_definition",
    }
)

# Node types that open a named scope, per language.
_DEFINITIONS: Final[dict[str, frozenset[str]]] = {
    "python": frozenset({"function_definition", "class_definition", "decorated_definition"}),
    "javascript": _JS_DEFINITIONS,
    "typescript": _TS_DEFINITIONS,
    "tsx": _TS_DEFINITIONS,
    "go": frozenset({"function_declaration", "method_declaration", "type_declaration"}),
    "rust": frozenset(
        {
            "function_item",
            "function_signature_item",
            "struct_item",
            "enum_item",
            "union_item",
            "trait_item",
            "impl_item",
            "mod_item",
            "macro_definition",
        }
    ),
    "java": frozenset(
        {
            "class_declaration",
            "interface_declaration",
            "enum_declaration",
            "record_declaration",
            "annotation_type_declaration",
            "method_declaration",
            "constructor_declaration",
            "compact_constructor_declaration",
        }
    ),
    "c": _C_DEFINITIONS,
    "cpp": _C_DEFINITIONS
    | {"class_specifier", "namespace_definition", "template_declaration", "concept_definition"},
    "csharp": frozenset(
        {
            "class_declaration",
            "struct_declaration",
            "interface_declaration",
            "enum_declaration",
            "record_declaration",
            "record_struct_declaration",
            "method_declaration",
            "constructor_declaration",
            "destructor_declaration",
            "operator_declaration",
            "property_declaration",
            "namespace_declaration",
            "local_function_statement",
            "delegate_declaration",
        }
    ),
    "ruby": frozenset({"class", "module", "method", "singleton_method"}),
    "php": frozenset(
        {
            "class_declaration",
            "interface_declaration",
            "trait_declaration",
            "enum_declaration",
            "function_definition",
            "method_declaration",
            "namespace_definition",
        }
    ),
    "kotlin": frozenset(
        {"class_declaration", "object_declaration", "function_declaration", "companion_object"}
    ),
    "swift": frozenset(
        {
            "class_declaration",
            "protocol_declaration",
            "function_declaration",
            "protocol_function_declaration",
            "init_declaration",
            "deinit_declaration",
            "subscript_declaration",
        }
    ),
    "scala": frozenset(
        {
            "class_definition",
            "object_definition",
            "trait_definition",
            "enum_definition",
            "function_definition",
            "function_declaration",
            "given_definition",
        }
    ),
    "bash": frozenset({"function_definition"}),
    "lua": frozenset({"function_declaration"}),
}

# Definitions that only wrap another one: the inner node names the scope.
_WRAPPERS: Final = frozenset({"decorated_definition", "export_statement", "template_declaration"})

# Comment-like nodes that belong to the definition right below them.
_LEADING: Final = frozenset({"attribute_item", "decorator", "annotation"})

_IDENTIFIERS: Final = frozenset(
    {
        "identifier",
        "type_identifier",
        "simple_identifier",
        "constant",
        "field_identifier",
        "property_identifier",
        "name",
        "word",
        "namespace_identifier",
        "qualified_name",
        "scope_resolution",
        "dot_index_expression",
        "method_index_expression",
    }
)
_QUALIFIED: Final = frozenset(
    {"scope_resolution", "qualified_identifier", "dot_index_expression", "method_index_expression"}
)
_QUALIFIER_SEPARATOR: Final = re.compile(r"::|[.:]")
_FUNCTION_VALUES: Final = frozenset(
    {"arrow_function", "function_expression", "function", "generator_function", "class"}
)
_DECLARATOR_NAMES: Final = frozenset(
    {"identifier", "field_identifier", "type_identifier", "destructor_name", "operator_name"}
)

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


def _syntax_pieces(
    text: str, lines: Sequence[str], prefix: Sequence[int], budget: int, language: str
) -> Pieces | None:
    """Pieces along the syntax tree, or None to fall back to the line splitter."""
    parser = _parser(language)
    if parser is None:
        return None
    source = text.encode("utf-8", "replace")
    root = parser.parse(source).root_node
    if language == "c" and root.has_error:
        # A .h file is as often C++ as C: take the C++ reading if only it parses.
        cpp = _parser("cpp")
        cpp_root = cpp.parse(source).root_node if cpp is not None else None
        if cpp_root is not None and not cpp_root.has_error:
            language, root = "cpp", cpp_root
    builder = _TreeSplitter(lines, prefix, budget, _DEFINITIONS[language])
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
        if node.type in self.definitions and node.type not in _WRAPPERS:
            return scope + _names(node)
        return scope

    def _paths(self, members: list[_Item]) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
        """Paths of the definitions in a group, and of the scopes of its other nodes."""
        defined: list[Path] = []
        within: list[Path] = []
        for node, scope, _, _ in members:
            names = _names(node) if node.type in self.definitions else ()
            if names:
                defined.append(scope + names)
            else:
                within.append(scope)
        return tuple(dict.fromkeys(defined)), tuple(dict.fromkeys(within))


def _is_header(members: list[_Item]) -> bool:
    """Whether the first group of a split node is its header (`def f(x):`, `{`).

    Keywords and punctuation appear as direct children only in a node's own header;
    a list of statements has named children only.
    """
    return any(not item[0].is_named for item in members)


def _is_leading(members: list[_Item]) -> bool:
    """Whether the group is only comments or attributes (which describe what follows)."""
    return all("comment" in item[0].type or item[0].type in _LEADING for item in members)


# --- names of definitions -----------------------------------------------------------------


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _names(node: Node) -> Path:
    """Name of a definition node as path components: `impl Foo` -> (Foo,), Go
    `func (s *Session) Send` -> (Session, Send); () when it has none."""
    handler = _NAME_HANDLERS.get(node.type)
    return handler(node) if handler is not None else _plain_name(node)


def _plain_name(node: Node) -> Path:
    name = node.child_by_field_name("name")
    if name is None:
        name = next((c for c in node.named_children if c.type in _IDENTIFIERS), None)
    return _name_of(name)


def _name_of(name: Node | None) -> Path:
    if name is None:
        return ()
    text = _text(name)
    if name.type in _QUALIFIED:
        return tuple(clean_name(part) for part in _QUALIFIER_SEPARATOR.split(text) if part)
    cleaned = clean_name(text)
    return (cleaned,) if cleaned else ()


def _field_names(field: str) -> Callable[[Node], Path]:
    """Names of the definition held in `field` (decorators, exports)."""

    def names(node: Node) -> Path:
        inner = node.child_by_field_name(field)
        return _names(inner) if inner is not None else ()

    return names


def _template_names(node: Node) -> Path:
    for child in reversed(node.named_children):
        names = _names(child)
        if names:
            return names
    return ()


def _variable_names(node: Node) -> Path:
    """`const handler = () => ...`: the variable names a function or class."""
    for child in node.named_children:
        if child.type == "variable_declarator":
            value = child.child_by_field_name("value")
            if value is not None and value.type in _FUNCTION_VALUES:
                return _plain_name(child)
    return ()


def _member_names(node: Node) -> Path:
    """Class fields and object pairs count only when they hold a function."""
    value = node.child_by_field_name("value")
    if value is None or value.type not in _FUNCTION_VALUES:
        return ()
    key = (
        node.child_by_field_name("name")
        or node.child_by_field_name("property")
        or node.child_by_field_name("key")
    )
    return _name_of(key)


def _method_names(node: Node) -> Path:
    """Go methods are named after their receiver type; elsewhere a plain name."""
    name = _plain_name(node)
    receiver = node.child_by_field_name("receiver")
    if receiver is None or not name:
        return name
    found = _first_of_type(receiver, "type_identifier")
    return (clean_name(_text(found)), *name) if found is not None else name


def _first_of_type(node: Node, kind: str) -> Node | None:
    for child in node.named_children:
        if child.type == kind:
            return child
        found = _first_of_type(child, kind)
        if found is not None:
            return found
    return None


def _impl_names(node: Node) -> Path:
    """`impl<T> Trait for Foo<T>` -> (Foo,)."""
    target = node.child_by_field_name("type")
    if target is not None and target.type == "generic_type":
        target = target.child_by_field_name("type") or target
    return _name_of(target)


def _declarator_names(node: Node) -> Path:
    """C/C++: the declared name sits at the bottom of a chain of declarators."""
    if node.child_by_field_name("name") is not None:
        return _plain_name(node)
    current = node.child_by_field_name("declarator")
    while current is not None:
        if current.type in _DECLARATOR_NAMES:
            return _name_of(current)
        if current.type == "qualified_identifier":
            return tuple(clean_name(p) for p in _text(current).split("::") if p.strip())
        inner = current.child_by_field_name("declarator")
        if inner is None and current.named_child_count:
            inner = current.named_children[0]
        current = inner
    return ()


def _go_type_names(node: Node) -> Path:
    for child in node.named_children:
        if child.type in ("type_spec", "type_alias"):
            return _plain_name(child)
    return ()


def _block_namespace_names(node: Node) -> Path:
    """PHP `namespace Foo;` is a statement, not a scope; `namespace Foo { }` is."""
    if node.child_by_field_name("body") is None:
        return ()
    return _plain_name(node)


def _companion_names(node: Node) -> Path:
    return _plain_name(node) or ("Companion",)


_NAME_HANDLERS: Final[dict[str, Callable[[Node], Path]]] = {
    "decorated_definition": _field_names("definition"),
    "export_statement": _field_names("declaration"),
    "template_declaration": _template_names,
    "lexical_declaration": _variable_names,
    "variable_declaration": _variable_names,
    "field_definition": _member_names,
    "public_field_definition": _member_names,
    "pair": _member_names,
    "method_declaration": _method_names,
    "impl_item": _impl_names,
    "function_definition": _declarator_names,
    "type_definition": _declarator_names,
    "type_declaration": _go_type_names,
    "namespace_definition": _block_namespace_names,
    "companion_object": _companion_names,
}
