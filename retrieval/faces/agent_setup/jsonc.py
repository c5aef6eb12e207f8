"""JSON with comments and trailing commas (JSONC, as VS Code and Cursor read their
settings): read it, and set or remove one member of an object by editing the text, so
that every comment, blank line and the file's layout stay as the user wrote them.

The edit is made on the text: the members' places come from a small parser that skips
`//` and `/* */` comments and knows strings. A caller re-reads the result with `loads`
and compares it with what it meant to write (`install` does), so an edit this
module got wrong is refused rather than written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from indexer.errors import CodeveilError

__all__ = ["JsoncError", "loads", "remove_member", "set_member"]


class JsoncError(CodeveilError):
    """The text is not JSON even with comments and trailing commas allowed."""


_TOKEN = re.compile(r'''
    (?P<space>\s+)
  | (?P<line>//[^\n]*)
  | (?P<block>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<punct>[{}\[\]:,])
  | (?P<atom>[-+\w.]+)
''', re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class _Token:
    kind: str  # "string", "punct" or "atom"
    text: str
    start: int
    end: int


def _tokens(text: str) -> list[_Token]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise JsoncError(f"unexpected {text[pos]!r} at offset {pos}")
        kind = m.lastgroup or ""
        if kind in ("string", "punct", "atom"):
            out.append(_Token(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return out


def loads(text: str) -> Any:
    """The value of JSONC `text`: JSON once its comments and trailing commas go."""
    tokens = _tokens(text)
    kept = [t.text for i, t in enumerate(tokens)
            if not (t.text == "," and i + 1 < len(tokens) and tokens[i + 1].text in "]}")]
    try:
        return json.loads(" ".join(kept))
    except ValueError as exc:
        raise JsoncError(str(exc)) from None


@dataclass
class _Member:
    key: str
    start: int  # the key's first character
    value_start: int
    value_end: int
    comma: int | None  # the comma after the value, if any
    value: _Object | None  # when the value is an object


@dataclass
class _Object:
    start: int  # its "{"
    end: int  # its "}"
    members: list[_Member] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def take(self) -> _Token:
        if self.i >= len(self.tokens):
            raise JsoncError("unexpected end of text")
        self.i += 1
        return self.tokens[self.i - 1]

    def peek(self) -> str:
        return self.tokens[self.i].text if self.i < len(self.tokens) else ""

    def value(self) -> tuple[int, int, _Object | None]:
        first = self.take()
        if first.text == "{":
            obj = self.object(first)
            return first.start, obj.end + 1, obj
        if first.text == "[":
            while self.peek() != "]":
                self.value()
                if self.peek() == ",":
                    self.take()
            return first.start, self.take().end, None
        if first.kind == "punct":
            raise JsoncError(f"unexpected {first.text!r} at offset {first.start}")
        return first.start, first.end, None

    def object(self, opening: _Token) -> _Object:
        obj = _Object(opening.start, -1)
        while self.peek() != "}":
            key = self.take()
            if key.kind != "string" or self.take().text != ":":
                raise JsoncError(f"expected a member at offset {key.start}")
            start, end, inner = self.value()
            comma = self.take().start if self.peek() == "," else None
            obj.members.append(_Member(json.loads(key.text), key.start, start, end, comma,
                                       inner))
            if comma is None and self.peek() != "}":
                raise JsoncError(f"expected ',' or '}}' after offset {end}")
        obj.end = self.take().start
        return obj


def _top(text: str) -> _Object:
    parser = _Parser(text)
    first = parser.take()
    if first.text != "{":
        raise JsoncError("the text is not an object")
    obj = parser.object(first)
    if parser.i != len(parser.tokens):
        raise JsoncError("text after the object")
    return obj


def _find(obj: _Object, keys: tuple[str, ...]) -> _Object | None:
    for key in keys:
        member = next((m for m in obj.members if m.key == key), None)
        if member is None or member.value is None:
            return None
        obj = member.value
    return obj


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _indent_of(text: str, pos: int) -> str:
    """The whitespace that starts the line holding `pos`."""
    start = _line_start(text, pos)
    return text[start:pos][: len(text[start:pos]) - len(text[start:pos].lstrip())]


def _dumped(value: Any, indent: str, unit: str) -> str:
    """`value` as JSON laid out for a member whose line starts with `indent`."""
    lines = json.dumps(value, indent=unit, ensure_ascii=False).split("\n")
    return "\n".join([lines[0], *(indent + line for line in lines[1:])])


def set_member(text: str, keys: tuple[str, ...], name: str, value: Any,
               unit: str = "  ") -> str:
    """`text` with member `name` of the object at `keys` (from the top) set to `value`.
    Raises JsoncError when that object is not there."""
    obj = _find(_top(text), keys)
    if obj is None:
        raise JsoncError(f"no object at {'.'.join(keys) or 'the top'}")
    member = next((m for m in obj.members if m.key == name), None)
    if member is not None:
        new = _dumped(value, _indent_of(text, member.start), unit)
        return text[: member.value_start] + new + text[member.value_end:]
    if obj.members:
        last = obj.members[-1]
        indent = _indent_of(text, last.start)
        same_line = _line_start(text, last.start) == _line_start(text, obj.start)
        entry = f"{json.dumps(name)}: {_dumped(value, indent, unit)}"
        if same_line:  # {"a": 1} on one line: stays on one line
            at = last.comma + 1 if last.comma is not None else last.value_end
            sep = "" if last.comma is not None else ","
            return text[:at] + f"{sep} {entry}" + text[at:]
        # After the last member's line (and any comment that ends it).
        at = last.comma + 1 if last.comma is not None else last.value_end
        eol = text.find("\n", at)
        eol = eol if 0 <= eol < obj.end else at
        trailing = "," if last.comma is not None else ""  # the file's own style
        head = text[:at] + ("" if last.comma is not None else ",") + text[at:eol]
        return head + f"\n{indent}{entry}{trailing}" + text[eol:]
    outer = _indent_of(text, obj.start)
    indent = outer + unit
    entry = f"{json.dumps(name)}: {_dumped(value, indent, unit)}"
    return text[: obj.start + 1] + f"\n{indent}{entry}" + (
        f"\n{outer}" if "\n" not in text[obj.start:obj.end] else "") + text[obj.start + 1:]


def remove_member(text: str, keys: tuple[str, ...], name: str) -> str:
    """`text` without member `name` of the object at `keys`; unchanged when absent."""
    obj = _find(_top(text), keys)
    members = obj.members if obj is not None else []
    index = next((i for i, m in enumerate(members) if m.key == name), None)
    if index is None:
        return text
    member = members[index]
    start, end = member.start, member.value_end
    cuts = []
    if member.comma is not None:
        end = member.comma + 1
    elif index > 0:  # the last member: the comma before it goes (not what follows it)
        comma = members[index - 1].comma
        assert comma is not None
        cuts.append((comma, comma + 1))
    # The member's whole line goes when nothing else is on it.
    line = _line_start(text, start)
    eol = text.find("\n", end)
    if not text[line:start].strip() and eol >= 0 and not text[end:eol].strip():
        start, end = line, eol + 1
    cuts.append((start, end))
    for a, b in reversed(cuts):
        text = text[:a] + text[b:]
    return text
