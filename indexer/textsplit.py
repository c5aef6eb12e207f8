"""Line-level chunking shared by every file: break costs, packing and symbol paths.

A file is first cut into *pieces*: runs of whole lines that should stay together,
each with the cost of a chunk boundary just before it (0 is the best place to cut).
The syntax-tree chunker makes pieces from syntax nodes; this module makes them from
lines for prose, configuration and code without a grammar, preferring Markdown and
reStructuredText headings, top-level keys and blank lines. `pack` then merges
neighbouring pieces up to the token budget, cutting at the cheapest boundary.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Final

Path = tuple[str, ...]
"""Names of the enclosing definitions or headings, outermost first."""

GLUE: Final = 1000
"""Boundary cost that keeps a comment with the definition right below it."""

MIN_FILL: Final = 1 / 3
"""A cheaper boundary is preferred only if the chunk before it is at least this full."""

MAX_SYMBOL_NAMES: Final = 3
MAX_NAME_CHARS: Final = 60

_TOP_LEVEL: Final[tuple[Path, ...]] = ((),)


@dataclass(slots=True)
class Pieces:
    """Consecutive runs of lines; piece k spans starts[k] up to starts[k+1] (exclusive).

    `defined` holds the paths of the definitions (or headed sections) a piece holds;
    `within` the paths of the scopes its other lines sit in.
    """

    starts: list[int] = field(default_factory=list)
    costs: list[int] = field(default_factory=list)
    defined: list[tuple[Path, ...]] = field(default_factory=list)
    within: list[tuple[Path, ...]] = field(default_factory=list)

    def add(
        self,
        start: int,
        cost: int,
        defined: tuple[Path, ...] = (),
        within: tuple[Path, ...] = _TOP_LEVEL,
    ) -> None:
        """Start a new piece at line `start` (0-based)."""
        self.starts.append(start)
        self.costs.append(cost)
        self.defined.append(defined)
        self.within.append(within)


def pack(
    starts: Sequence[int], costs: Sequence[int], end: int, prefix: Sequence[int], budget: int
) -> list[tuple[int, int]]:
    """Group consecutive pieces into runs of at most `budget` tokens.

    `prefix[i]` is the token count of lines before line i and `end` the line after
    the last piece. Returns (first piece, last piece) of each run, in order, covering
    every piece once. A piece larger than the budget (a single over-long line) forms
    a run by itself. When a run must end, it ends at the cheapest boundary among
    those that leave it at least MIN_FILL full, the latest one on ties.
    """
    count = len(starts)
    filled = [prefix[s] for s in starts[1:]]
    filled.append(prefix[end])
    runs: list[tuple[int, int]] = []
    first = 0
    while first < count:
        base = prefix[starts[first]]
        last = max(first, bisect_right(filled, base + budget, first) - 1)
        if last >= count - 1:
            runs.append((first, count - 1))
            break
        cut = _best_cut(costs, filled, first, last, base + max(1, int(budget * MIN_FILL)))
        runs.append((first, cut - 1))
        first = cut
    return runs


def _best_cut(
    costs: Sequence[int], filled: Sequence[int], first: int, last: int, floor: int
) -> int:
    """The piece to start the next run with, somewhere in first+1..last+1."""
    best, best_cost = last + 1, costs[last + 1]
    latest_unglued = last + 1 if best_cost < GLUE else None
    for k in range(last, first, -1):
        if filled[k - 1] >= floor and costs[k] < best_cost:
            best, best_cost = k, costs[k]
        if latest_unglued is None and costs[k] < GLUE:
            latest_unglued = k
    # Splitting a comment or header from what follows is worse than a small chunk,
    # but the small chunk should still be as full as it can be.
    if best_cost >= GLUE and latest_unglued is not None:
        return latest_unglued
    return best


def symbol_parts(
    defined: Sequence[tuple[Path, ...]],
    within: Sequence[tuple[Path, ...]],
    sizes: Sequence[int],
) -> tuple[Path, tuple[str, ...]]:
    """Common enclosing path of a chunk's pieces, and the names held right below it.

    `defined` and `within` are the pieces' fields of the same names and `sizes`
    their token counts, in order. A chunk inside `send` of class `Session` gives
    ((Session, send), ()); one with the class header and two methods gives
    ((Session,), (send, close)). A scope that merely encloses another path of the
    chunk (the module around a commented Go method) adds nothing, so `Cache > Get`
    does not shrink to `Cache`. Of many names, the ones holding most tokens stay.
    """
    weights: dict[Path, int] = {}
    for held, scopes, size in zip(defined, within, sizes, strict=True):
        for path in (*held, *scopes):
            weights[path] = weights.get(path, 0) + size
    definitions = set(chain.from_iterable(defined))
    for scope in list(weights):
        if scope not in definitions and any(
            len(scope) < len(p) and p[: len(scope)] == scope for p in weights
        ):
            del weights[scope]
    if not weights:
        return (), ()
    paths = list(weights)
    common = paths[0]
    for path in paths[1:]:
        size = 0
        for a, b in zip(common, path, strict=False):
            if a != b:
                break
            size += 1
        common = common[:size]
    depth = len(common)
    held_by: dict[str, int] = {}
    for path, weight in weights.items():
        if len(path) > depth:
            held_by[path[depth]] = held_by.get(path[depth], 0) + weight
    heaviest = sorted(held_by, key=held_by.__getitem__, reverse=True)[:MAX_SYMBOL_NAMES]
    return common, tuple(name for name in held_by if name in heaviest)


def format_symbol(common: Path, names: Sequence[str]) -> str:
    """`Session > send, close`-style text of a symbol path."""
    parts = list(common)
    if names:
        parts.append(", ".join(names))
    return " > ".join(parts)


def clean_name(raw: str) -> str:
    """A name fit for a one-line header: single spaces, bounded length."""
    name = " ".join(raw.split())
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 1] + "…"


# --- break costs for lines ----------------------------------------------------------

_COMMENT_PREFIXES: Final = ("#", "//", "--", ";", "/*", "*", "<!--", "%")
_CLOSER: Final = re.compile(r"[}\])]|</|(?:end|fi|done|esac)\b")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def line_cost(line: str, previous: str | None, depth: int = 0) -> int:
    """Cost of a boundary before `line`: low after blank lines and at column 0."""
    stripped = line.strip()
    if not stripped:
        return 40  # cut after the blank line instead, so it trails the chunk
    cost = 10 + 2 * depth + min(_indent(line) // 2, 8)
    if previous is None or not previous.strip():
        cost -= 4
    elif previous.lstrip().startswith(_COMMENT_PREFIXES):
        cost += 10  # a comment describes what follows it
    if _CLOSER.match(stripped):
        cost += 6  # the end of a block belongs with its body
    return cost


def line_costs(lines: Sequence[str], start: int, stop: int, depth: int = 0) -> list[int]:
    """`line_cost` of each line in start..stop-1."""
    return [line_cost(lines[i], lines[i - 1] if i > 0 else None, depth) for i in range(start, stop)]


# --- headings and keys ----------------------------------------------------------------

_ATX: Final = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT: Final = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_FENCE: Final = re.compile(r" {0,3}(`{3,}|~{3,})")
_ADORNMENT: Final = re.compile(r"([=\-`:'\"~^_*+#<>.])\1{2,}[ \t]*$")
_YAML_KEY: Final = re.compile(r"""(?:"([^"]+)"|'([^']+)'|([^\s#:\-'"][^:#]*?))[ \t]*:(?:\s|$)""")
_JSON_KEY: Final = re.compile(r'([ \t]*)"((?:[^"\\]|\\.)*)"[ \t]*:')
_TOML_TABLE: Final = re.compile(r"[ \t]*\[\[?[ \t]*([^\]\n]+?)[ \t]*\]\]?[ \t]*(?:#.*)?$")


@dataclass(slots=True)
class _Outline:
    """Heading stack while reading a document top to bottom."""

    levels: list[tuple[object, str]] = field(default_factory=list)
    styles: list[object] = field(default_factory=list)

    def enter(self, style: object, title: str) -> Path:
        """Open a heading of `style`; styles rank in order of first use, like RST."""
        if style not in self.styles:
            self.styles.append(style)
        rank = self.styles.index(style)
        while self.levels and self.styles.index(self.levels[-1][0]) >= rank:
            self.levels.pop()
        self.levels.append((style, clean_name(title.replace("`", ""))))
        return tuple(t for _, t in self.levels)


def _markdown_marks(lines: Sequence[str]) -> dict[int, tuple[int, Path]]:
    """Heading lines of a Markdown file: line -> (boundary cost, heading path)."""
    marks: dict[int, tuple[int, Path]] = {}
    outline = _Outline(styles=list(range(1, 7)))
    fence = ""
    index = _skip_front_matter(lines)
    while index < len(lines):
        line = lines[index]
        fence_match = _FENCE.match(line)
        if fence:
            if fence_match and fence_match.group(1).startswith(fence):
                fence = ""
        elif fence_match:
            fence = fence_match.group(1)
        elif (atx := _ATX.match(line)) is not None:
            level = len(atx.group(1))
            marks[index] = (level - 1, outline.enter(level, atx.group(2) or ""))
        elif _is_setext_title(lines, index):
            level = 1 if lines[index + 1].strip().startswith("=") else 2
            marks[index] = (level - 1, outline.enter(level, line.strip()))
            index += 1
        index += 1
    return marks


def _skip_front_matter(lines: Sequence[str]) -> int:
    """Index of the first line after a leading `---` ... `---` block, else 0."""
    if not lines or lines[0].strip() != "---":
        return 0
    for index in range(1, len(lines)):
        if lines[index].strip() in ("---", "..."):
            return index + 1
    return 0


def _is_setext_title(lines: Sequence[str], index: int) -> bool:
    line = lines[index]
    if index + 1 >= len(lines) or not line.strip() or _indent(line) > 3:
        return False
    if line.lstrip().startswith(("-", "*", "+", ">", "|")) or _SETEXT.match(line):
        return False
    previous_blank = index == 0 or not lines[index - 1].strip()
    return previous_blank and _SETEXT.match(lines[index + 1]) is not None


def _rst_marks(lines: Sequence[str]) -> dict[int, tuple[int, Path]]:
    """Underlined (and optionally overlined) titles: line -> (cost, heading path)."""
    marks: dict[int, tuple[int, Path]] = {}
    outline = _Outline()
    index = 0
    while index + 1 < len(lines):
        line, below = lines[index], lines[index + 1]
        over = _ADORNMENT.match(line)
        if over and index + 2 < len(lines) and _ADORNMENT.match(lines[index + 2]):
            title = below.strip()
            if title and lines[index + 2].strip() == line.strip():
                path = outline.enter((line.strip()[0], True), title)
                marks[index] = (min(len(outline.levels) - 1, 5), path)
                index += 3
                continue
        title = line.strip()
        under = _ADORNMENT.match(below)
        if title and not over and under and len(below.strip()) >= len(title) and not _indent(line):
            path = outline.enter((below.strip()[0], False), title)
            marks[index] = (min(len(outline.levels) - 1, 5), path)
            index += 2
            continue
        index += 1
    return marks


def _yaml_marks(lines: Sequence[str]) -> dict[int, tuple[int, Path]]:
    """Top-level keys and document separators of a YAML file."""
    marks: dict[int, tuple[int, Path]] = {}
    for index, line in enumerate(lines):
        if line.startswith("---"):
            marks[index] = (0, ())
        elif line[:1] not in ("", " ", "\t", "#", "-", "\n", "\r"):
            key = _YAML_KEY.match(line)
            if key is not None:
                name = next(g for g in key.groups() if g is not None)
                marks[index] = (2, (clean_name(name),))
    return marks


def _toml_marks(lines: Sequence[str]) -> dict[int, tuple[int, Path]]:
    """[table] and [[array]] headers of a TOML file; dotted names nest."""
    marks: dict[int, tuple[int, Path]] = {}
    for index, line in enumerate(lines):
        if line.lstrip().startswith("["):
            table = _TOML_TABLE.match(line)
            if table is not None:
                path = tuple(clean_name(p.strip("\"' ")) for p in table.group(1).split("."))
                marks[index] = (min(len(path), 4), path)
    return marks


def _json_marks(lines: Sequence[str]) -> dict[int, tuple[int, Path]]:
    """Keys of the outermost object of a pretty-printed JSON file."""
    marks: dict[int, tuple[int, Path]] = {}
    indent = None
    for index, line in enumerate(lines):
        key = _JSON_KEY.match(line)
        if key is None:
            continue
        if indent is None:
            indent = key.group(1)
        if key.group(1) == indent:
            marks[index] = (2, (clean_name(key.group(2)),))
    return marks


_MARKERS: Final[dict[str, Callable[[Sequence[str]], dict[int, tuple[int, Path]]]]] = {
    "markdown": _markdown_marks,
    "rst": _rst_marks,
    "text": _rst_marks,
    "yaml": _yaml_marks,
    "toml": _toml_marks,
    "json": _json_marks,
}


def text_pieces(lines: Sequence[str], language: str) -> Pieces:
    """One piece per line, with heading or key boundaries made cheapest."""
    marker = _MARKERS.get(language)
    marks = marker(lines) if marker is not None else {}
    pieces = Pieces()
    section: tuple[Path, ...] = ()
    costs = line_costs(lines, 0, len(lines))
    for index, cost in enumerate(costs):
        mark = marks.get(index)
        if mark is not None:
            section = (mark[1],) if mark[1] else ()
            cost = min(cost, mark[0])
        pieces.add(index, cost, section)
    if language in ("yaml", "toml"):
        _glue_leading_comments(lines, pieces, marks)
    return pieces


def _glue_leading_comments(
    lines: Sequence[str], pieces: Pieces, marks: dict[int, tuple[int, Path]]
) -> None:
    """Keep the comment lines right above a key or table header with it."""
    for index in marks:
        above = index - 1
        while above >= 0 and lines[above].lstrip().startswith("#"):
            pieces.costs[above], pieces.costs[above + 1] = pieces.costs[above + 1], GLUE
            pieces.defined[above] = pieces.defined[index]
            above -= 1
