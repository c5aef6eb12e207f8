"""Which syntax nodes define something, per grammar, and the names they define: what the
chunker scopes its chunks by (`indexer.chunker`) and the definitions index reads
(`indexer.definitions`), from the same tree-sitter tree."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

from tree_sitter import Node

from indexer.textsplit import Path, clean_name

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
DEFINITIONS: Final[dict[str, frozenset[str]]] = {
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
    # `M.f = function() end` and `local f = function() end` name a function as surely as
    # `function M.f() end` does; a module written inside `return function(busted) ... end`
    # defines nothing else.
    "lua": frozenset({"function_declaration", "assignment_statement", "variable_declaration"}),
}

# Definitions that only wrap another one: the inner node names the scope.
WRAPPERS: Final = frozenset({"decorated_definition", "export_statement", "template_declaration"})

# Comment-like nodes that belong to the definition right below them.
LEADING: Final = frozenset({"attribute_item", "decorator", "annotation"})

IDENTIFIERS: Final = frozenset(
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
FUNCTION_VALUES: Final = frozenset(
    {"arrow_function", "function_expression", "function", "generator_function", "class"}
)
_DECLARATOR_NAMES: Final = frozenset(
    {"identifier", "field_identifier", "type_identifier", "destructor_name", "operator_name"}
)


# --- names of definitions -----------------------------------------------------------------


def node_text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def definition_names(node: Node) -> Path:
    """Name of a definition node as path components: `impl Foo` -> (Foo,), Go
    `func (s *Session) Send` -> (Session, Send); () when it has none."""
    handler = _NAME_HANDLERS.get(node.type)
    return handler(node) if handler is not None else plain_name(node)


def plain_name(node: Node) -> Path:
    name = node.child_by_field_name("name")
    if name is None:
        name = next((c for c in node.named_children if c.type in IDENTIFIERS), None)
    return name_of(name)


def name_of(name: Node | None) -> Path:
    if name is None:
        return ()
    text = node_text(name)
    if name.type in _QUALIFIED:
        return tuple(clean_name(part) for part in _QUALIFIER_SEPARATOR.split(text) if part)
    cleaned = clean_name(text)
    return (cleaned,) if cleaned else ()


def _field_names(field: str) -> Callable[[Node], Path]:
    """Names of the definition held in `field` (decorators, exports)."""

    def names(node: Node) -> Path:
        inner = node.child_by_field_name(field)
        return definition_names(inner) if inner is not None else ()

    return names


def _template_names(node: Node) -> Path:
    for child in reversed(node.named_children):
        names = definition_names(child)
        if names:
            return names
    return ()


def _variable_names(node: Node) -> Path:
    """`const handler = () => ...`: the variable names a function or class; Lua's
    `local f = function() end` likewise."""
    for child in node.named_children:
        if child.type == "variable_declarator":
            value = child.child_by_field_name("value")
            if value is not None and value.type in FUNCTION_VALUES:
                return plain_name(child)
        elif child.type == "assignment_statement":
            return _lua_assigned_names(child)
    return ()


def lua_function_targets(node: Node) -> Iterator[Node]:
    """The targets a Lua assignment gives a function (`M.f` of `M.f = function() end`),
    in order."""
    if len(node.named_children) < 2:
        return
    targets, values = node.named_children[0].named_children, node.named_children[1].named_children
    for target, value in zip(targets, values, strict=False):
        if value.type == "function_definition":
            yield target


def _lua_assigned_names(node: Node) -> Path:
    """`M.f = function() end`: the name of the first target given a function."""
    target = next(lua_function_targets(node), None)
    return name_of(target) if target is not None else ()


def _member_names(node: Node) -> Path:
    """Class fields and object pairs count only when they hold a function."""
    value = node.child_by_field_name("value")
    if value is None or value.type not in FUNCTION_VALUES:
        return ()
    key = (
        node.child_by_field_name("name")
        or node.child_by_field_name("property")
        or node.child_by_field_name("key")
    )
    return name_of(key)


def _method_names(node: Node) -> Path:
    """Go methods are named after their receiver type; elsewhere a plain name."""
    name = plain_name(node)
    receiver = node.child_by_field_name("receiver")
    if receiver is None or not name:
        return name
    found = _first_of_type(receiver, "type_identifier")
    return (clean_name(node_text(found)), *name) if found is not None else name


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
    return name_of(target)


def _declarator_names(node: Node) -> Path:
    """C/C++: the declared name sits at the bottom of a chain of declarators."""
    if node.child_by_field_name("name") is not None:
        return plain_name(node)
    current = node.child_by_field_name("declarator")
    while current is not None:
        if current.type in _DECLARATOR_NAMES:
            return name_of(current)
        if current.type == "qualified_identifier":
            return tuple(clean_name(p) for p in node_text(current).split("::") if p.strip())
        inner = current.child_by_field_name("declarator")
        if inner is None and current.named_child_count:
            inner = current.named_children[0]
        current = inner
    return ()


def _go_type_names(node: Node) -> Path:
    for child in node.named_children:
        if child.type in ("type_spec", "type_alias"):
            return plain_name(child)
    return ()


def _block_namespace_names(node: Node) -> Path:
    """PHP `namespace Foo;` is a statement, not a scope; `namespace Foo { }` is."""
    if node.child_by_field_name("body") is None:
        return ()
    return plain_name(node)


def _companion_names(node: Node) -> Path:
    return plain_name(node) or ("Companion",)


_NAME_HANDLERS: Final[dict[str, Callable[[Node], Path]]] = {
    "decorated_definition": _field_names("definition"),
    "export_statement": _field_names("declaration"),
    "template_declaration": _template_names,
    "lexical_declaration": _variable_names,
    "variable_declaration": _variable_names,
    "assignment_statement": _lua_assigned_names,
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
