"""What a file defines, read from the same syntax tree the chunker splits.

A chunk can hold several definitions (a class header and three small methods), so the
chunk table's symbol paths do not say on which line each one starts. At index time
`chunk_and_define` parses a file once, chunks it, and lists every definition in it:
its symbol path (`("Session", "send")`, the chunker's own naming), a kind, its lines
and its one-line signature. The chunk table keeps that list beside the chunks
(`indexer.local_chunks`), so a lookup never parses.

Definitions are the nodes the chunker splits along (functions, classes, methods, types,
impls, modules) plus the named values of a module or class (constants, variables,
type aliases, macros), found with one tree-sitter query a language. The same module
finds the identifier nodes of a name (`identifier_lines`), for references.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from tree_sitter import Node, Query, QueryCursor
from tree_sitter_language_pack import get_language

from indexer.chunk import Chunk
from indexer.chunker import DEFAULT_MAX_TOKENS, ParsedTree, chunk_file, parse
from indexer.languages import GRAMMAR_LANGUAGES, language_for_path
from indexer.syntax_names import (
    DEFINITIONS,
    FUNCTION_VALUES,
    IDENTIFIERS,
    WRAPPERS,
    definition_names,
    lua_function_targets,
    name_of,
    node_text,
    plain_name,
)
from indexer.textsplit import Path
from indexer.tokens import TokenCounter

__all__ = ["Definition", "chunk_and_define", "definitions_of", "identifier_lines"]

SIGNATURE_CHARS: Final = 200
"""A signature longer than this is cut (with "…"): one line for an agent to read."""


@dataclass(frozen=True, slots=True)
class Definition:
    """One definition in a file: `names` is its symbol path, outermost first."""

    names: Path
    kind: str  # class, function, method, type, constant, ... (see `_kind`)
    start_line: int  # 1-based: the line the definition itself starts on
    end_line: int  # inclusive
    signature: str  # its first line, stripped

    @property
    def symbol(self) -> str:
        """`Session > send`, as chunk symbols are written."""
        return " > ".join(self.names)


# Named values that are not scopes: read as definitions, never split along.
_VALUES: Final[dict[str, frozenset[str]]] = {
    "python": frozenset({"assignment"}),
    "javascript": frozenset({"variable_declarator", "assignment_expression"}),
    "typescript": frozenset({"variable_declarator", "assignment_expression"}),
    "tsx": frozenset({"variable_declarator", "assignment_expression"}),
    "go": frozenset({"const_spec", "var_spec", "type_spec", "type_alias"}),
    "rust": frozenset({"const_item", "static_item", "type_item"}),
    "c": frozenset({"preproc_def", "preproc_function_def"}),
    "cpp": frozenset({"preproc_def", "preproc_function_def", "alias_declaration"}),
    "java": frozenset({"field_declaration"}),
    "ruby": frozenset({"assignment"}),
    "lua": frozenset({"assignment_statement"}),
}

# Scope nodes whose names the value nodes above already give, more precisely.
_REPLACED: Final[dict[str, frozenset[str]]] = {
    "javascript": frozenset({"lexical_declaration", "variable_declaration"}),
    "typescript": frozenset({"lexical_declaration", "variable_declaration"}),
    "tsx": frozenset({"lexical_declaration", "variable_declaration"}),
    "go": frozenset({"type_declaration"}),
    "lua": frozenset({"variable_declaration"}),
}

# A value counts only where a reader looks for definitions: the file's top level, or
# a class body (a local variable is not a definition anyone asks for).
_TOP_LEVEL: Final = frozenset({"module", "program", "source_file", "translation_unit"})
_PASS_THROUGH: Final = frozenset({
    "expression_statement", "lexical_declaration", "variable_declaration", "export_statement",
    "const_declaration", "var_declaration", "type_declaration", "block", "class_body",
    "body_statement", "declaration_list", "field_declaration_list", "const_spec_list",
    "var_spec_list", "interface_body", "enum_body", "preproc_ifdef", "preproc_if",
    "preproc_else", "linkage_specification", "namespace_definition", "module",
})


def chunk_and_define(
    path: str,
    text: str,
    *,
    language: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    counter: TokenCounter | None = None,
) -> tuple[list[Chunk], list[Definition]]:
    """`chunker.chunk_file(path, text, ...)` and the file's definitions, from one parse."""
    language = language or language_for_path(path) or "text"
    tree = parse(text, language) if language in GRAMMAR_LANGUAGES and text.strip() else None
    chunks = chunk_file(path, text, language=language, max_tokens=max_tokens,
                        counter=counter, tree=tree)
    return chunks, (_definitions(tree, text) if tree is not None else [])


def definitions_of(text: str, language: str) -> list[Definition]:
    """The definitions of `text` in `language` (none without a grammar), in file order."""
    if language not in GRAMMAR_LANGUAGES or not text.strip():
        return []
    tree = parse(text, language)
    return _definitions(tree, text) if tree is not None else []


def identifier_lines(text: str, language: str, name: str) -> list[int] | None:
    """1-based lines where an identifier node spells `name` (comments and strings do not
    count), or None when `language` has no grammar here."""
    if language not in GRAMMAR_LANGUAGES:
        return None
    tree = parse(text, language)
    if tree is None:
        return None
    query = _query(tree[0], "identifiers")
    if query is None:
        return None
    found = QueryCursor(query).captures(tree[1]).get("id", [])
    wanted = name.encode("utf-8")
    return sorted({n.start_point.row + 1 for n in found if n.text == wanted})


# --- the query of each language ---------------------------------------------------------

_local = threading.local()


def _node_types(language: str) -> frozenset[str]:
    scopes = DEFINITIONS[language] - WRAPPERS - _REPLACED.get(language, frozenset())
    return scopes | _VALUES.get(language, frozenset())


def _query(language: str, what: str) -> Query | None:
    """This thread's compiled query for the definitions or the identifiers of
    `language`, naming only the node types its grammar has."""
    cache: dict[tuple[str, str], Query | None] = _local.__dict__.setdefault("queries", {})
    key = (language, what)
    if key not in cache:
        grammar = get_language(language)  # type: ignore[arg-type]
        wanted = _node_types(language) if what == "definitions" else IDENTIFIERS
        kinds = sorted(k for k in wanted if grammar.id_for_node_kind(k, True))
        capture = "def" if what == "definitions" else "id"
        source = "[" + " ".join(f"({k})" for k in kinds) + f"] @{capture}"
        cache[key] = Query(grammar, source) if kinds else None
    return cache[key]


def _definitions(tree: ParsedTree, text: str) -> list[Definition]:
    language, root = tree
    query = _query(language, "definitions")
    if query is None:
        return []
    nodes = QueryCursor(query).captures(root).get("def", [])
    values = _VALUES.get(language, frozenset())
    kinds = _node_types(language)
    # The file's own lines: the root node's text starts where its first node does, which
    # is not the file's first line when that is blank or a comment.
    source_lines = text.encode("utf-8", "replace").split(b"\n")
    own: dict[int, Path] = {}  # node id -> its own names ((): not a definition)
    out: list[Definition] = []
    for node in sorted(nodes, key=lambda n: (n.start_byte, -n.end_byte)):
        for names in _names_of(node, language, values):
            scope = _scope(node, language, values, kinds, own)
            start, end = node.start_point.row + 1, node.end_point.row + 1
            if node.end_point.column == 0 and end > start:
                end -= 1  # a node that ends after its newline (C macros)
            if node.type in ("assignment_statement", "assignment_expression"):
                # Lua and JS, naming a function: an object's field, or a variable
                kind = "method" if len(names) > 1 else "function"
            else:
                kind = _kind(node.type, scope + names[:-1])
            out.append(Definition(scope + names, kind, start, end,
                                  _signature(source_lines[start - 1])))
    return out


def _names_of(node: Node, language: str, values: frozenset[str]) -> Iterator[Path]:
    """The names `node` defines (several for `var a, b int`); none if it defines none."""
    if node.type == "assignment_statement":  # Lua: functions are values
        yield from _lua_function_names(node)
        return
    if node.type == "assignment_expression":  # JS: `parser.onPart = function () {...}`
        yield from _assigned_function_names(node)
        return
    if node.type in values:
        if not _at_definition_level(node) and not _holds_function(node):
            return
        yield from _value_names(node, language)
        return
    names = definition_names(node)
    if names:
        yield _untruncated(names, node)


def _untruncated(names: Path, node: Node) -> Path:
    """The chunker shortens long names for its one-line headers (`...…`); a definition
    keeps its name whole, so that a lookup by the whole name finds it."""
    if not names[-1].endswith("…"):
        return names
    name = node.child_by_field_name("name")
    full = " ".join(node_text(name).split()) if name is not None else ""
    if full.startswith(names[-1][:-1]):
        return (*names[:-1], full)
    return names


def _holds_function(node: Node) -> bool:
    """`const handler = () => ...` names a function wherever it stands."""
    value = node.child_by_field_name("value")
    return value is not None and value.type in FUNCTION_VALUES


def _lua_function_names(node: Node) -> Iterator[Path]:
    """`local f = function() end`, `M.f = function() end`: the names given a function,
    wherever they stand (a module's functions are often locals of its body)."""
    for target in lua_function_targets(node):
        names = tuple(p for p in re.split(r"[.:]", node_text(target)) if p)
        if names and all(n.isidentifier() for n in names):
            yield names


def _assigned_function_names(node: Node) -> Iterator[Path]:
    """The name a JavaScript assignment gives a function (`x.f = () => {}`, `f =
    function () {}`), wherever it stands; `this.` is no part of the name."""
    value = node.child_by_field_name("right")
    target = node.child_by_field_name("left")
    if value is None or target is None or value.type not in FUNCTION_VALUES:
        return
    if target.type not in ("identifier", "member_expression"):
        return
    names = tuple(node_text(target).split("."))
    if names[0] == "this":
        names = names[1:]
    if names and all(re.fullmatch(r"[\w$]+", n) for n in names):
        yield names


def _value_names(node: Node, language: str) -> Iterator[Path]:
    kind = node.type
    if kind == "assignment":
        left = node.child_by_field_name("left")
        if left is not None and left.type in ("identifier", "constant"):
            yield name_of(left)
    elif kind in ("const_spec", "var_spec"):
        for name in node.children_by_field_name("name"):
            yield name_of(name)
    elif kind == "variable_declarator":
        declared = node.child_by_field_name("name")
        if declared is not None and declared.type == "identifier":
            yield name_of(declared)
    elif kind == "field_declaration":  # Java: every declarator of the field
        for declarator in node.children_by_field_name("declarator"):
            found = declarator.child_by_field_name("name")
            if found is not None:
                yield name_of(found)
    else:
        names = plain_name(node)
        if names:
            yield names


def _at_definition_level(node: Node) -> bool:
    """Whether a value sits at the top of its file or in a class-like body (a function's
    local variables are no definitions)."""
    parent = node.parent
    while parent is not None and parent.type in _PASS_THROUGH:
        if parent.type == "block":  # Python: a block is a class's only if a class holds it
            holder = parent.parent
            return holder is not None and holder.type == "class_definition"
        parent = parent.parent
    if parent is None or parent.type in _TOP_LEVEL:
        return True
    return "class" in parent.type or "interface" in parent.type or parent.type in (
        "module", "mod_item", "impl_item", "object_declaration")


def _scope(node: Node, language: str, values: frozenset[str], kinds: frozenset[str],
           own: dict[int, Path]) -> Path:
    """Names of the definitions around `node`, outermost first."""
    parts: list[Path] = []
    parent = node.parent
    while parent is not None:
        if parent.type in kinds:
            if parent.id not in own:
                own[parent.id] = next(iter(_names_of(parent, language, values)), ())
            if own[parent.id]:
                parts.append(own[parent.id])
        parent = parent.parent
    return tuple(name for names in reversed(parts) for name in names)


def _kind(node_type: str, scope: Path) -> str:
    """A word for what a node of `node_type` defines."""
    for marker, kind in _KIND_MARKERS:
        if marker in node_type:
            if kind == "function" and scope:
                return "method"
            return kind
    return "definition"


_KIND_MARKERS: Final = (
    ("constructor", "method"),
    ("destructor", "method"),
    ("protocol_function", "method"),
    ("impl", "impl"),
    ("interface", "interface"),
    ("protocol", "interface"),
    ("trait", "trait"),
    ("struct", "struct"),
    ("union", "struct"),
    ("enum", "enum"),
    ("record", "class"),
    ("class", "class"),
    ("object", "class"),
    ("companion", "class"),
    ("namespace", "module"),
    ("mod_item", "module"),
    ("module", "module"),
    ("init_declaration", "method"),
    ("method", "method"),
    ("singleton", "method"),
    ("macro", "macro"),
    ("preproc", "macro"),
    ("function", "function"),
    ("given", "function"),
    ("operator", "method"),
    ("subscript", "method"),
    ("property", "property"),
    ("field", "field"),
    ("pair", "function"),
    ("delegate", "type"),
    ("type", "type"),
    ("alias", "type"),
    ("const", "constant"),
    ("static", "constant"),
    ("assignment", "variable"),
    ("var_spec", "variable"),
    ("variable", "variable"),
)


def _signature(line_bytes: bytes) -> str:
    """The line a definition starts on, its runs of spaces made one."""
    line = " ".join(line_bytes.decode("utf-8", "replace").split())
    if len(line) > SIGNATURE_CHARS:
        line = line[: SIGNATURE_CHARS - 1] + "…"
    return line
