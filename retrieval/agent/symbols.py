"""Where a symbol is defined, and what a file defines: lookups in the definition table.

`indexer.definitions` lists each file's definitions at index time, from the syntax tree
the chunker parsed, and `indexer.local_chunks` keeps them beside the chunks. A lookup
is one indexed query; nothing is parsed unless a file's list is missing (written by an
older codeveil: read once from its chunks, then kept) or the file changed on disk since
it was indexed (`outline` then parses the file as it is now, and says so).

Names. A query `Session.send`, `Sinatra::Base`, `pkg.Func`, `a/b#c` or `Session > send`
is split at any of `.`, `::`, `:` (Lua), `/`, `#` and `>`; it matches a definition whose symbol
path ends with those names, or whose file's module path (folders, then the file's stem)
followed by its symbol path ends with them (`pkg.Func` for `Func` in `pkg/func.go`,
`sessions.Session` for `sessions.py`). Ranking: the whole symbol path spelled out
first, then a tail of it, then a match through the module path; source before tests
before docs and examples; type and function definitions before impl blocks; shorter
symbol paths, then shorter file paths.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import xxhash

from indexer.chunk import Chunk
from indexer.definitions import Definition, definitions_of
from indexer.errors import CodeveilError
from indexer.languages import GRAMMAR_LANGUAGES, language_for_path
from indexer.local_chunks import LocalChunks
from indexer.priority import category

__all__ = [
    "DefinitionHit",
    "Outline",
    "OutlineEntry",
    "ToolInputError",
    "backfill_definitions",
    "find_definitions",
    "outline_of",
    "split_name",
]

_SEPARATORS: Final = re.compile(r"\s*(?:::|>|[.#/\\:])\s*")  # `:`: Lua's `Job:pid`
# Kinds that are not the definition a reader means when several share the name.
_SECONDARY_KINDS: Final = {"impl": 1, "variable": 1, "field": 1}


class ToolInputError(CodeveilError):
    """An agent tool (definition, outline, references, grep) was given a name, file or
    pattern it cannot look up."""


@dataclass(frozen=True, slots=True)
class DefinitionHit:
    """Where a symbol is defined. `stale`: the file changed on disk and the definition
    could not be found again (then the lines are the indexed ones)."""

    path: str
    start_line: int
    end_line: int
    symbol: str  # `Session > send`
    kind: str
    language: str
    signature: str
    match: str  # "exact", "tail" or "module": how the name matched
    stale: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class OutlineEntry:
    """One symbol of a file: `depth` counts the definitions around it."""

    symbol: str
    name: str
    kind: str
    start_line: int
    end_line: int
    signature: str
    depth: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Outline:
    """The symbols of one file, in file order. `reparsed`: the file changed on disk since
    it was indexed (or is not indexed), so it was parsed as it is now."""

    path: str
    language: str
    reparsed: bool
    symbols: list[OutlineEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "language": self.language, "reparsed": self.reparsed,
                "symbols": [s.to_dict() for s in self.symbols]}


def split_name(name: str) -> tuple[str, ...]:
    """`Session.send`, `Sinatra::Base`, `a/b#c` -> their names; ToolInputError if none."""
    parts = tuple(p for p in _SEPARATORS.split(name.strip()) if p)
    if not parts:
        raise ToolInputError(f"no symbol name in {name!r}; give one like `send` or `Session.send`")
    return parts


# -- the table, complete -------------------------------------------------------------------


def backfill_definitions(db: sqlite3.Connection) -> int:
    """Read the definitions of every file whose chunks have no list yet (an index made
    by an older codeveil) from its chunks, and keep them. How many files were read."""
    missing = [(p, bytes(d)) for p, d in db.execute(
        "SELECT c.path, c.digest FROM chunk_files c LEFT JOIN definition_files d"
        " ON d.path = c.path WHERE d.digest IS NULL OR d.digest != c.digest")]
    local = LocalChunks(db)
    for path, digest in missing:
        chunks = local.for_file(path)
        language = chunks[0].language if chunks else (language_for_path(path) or "text")
        local.set_definitions(path, digest, definitions_of(text_of_chunks(chunks), language))
    return len(missing)


def text_of_chunks(chunks: Sequence[Chunk]) -> str:
    """A file's text as its chunks hold it: every non-blank line at its own line number,
    the blank lines between chunks empty (which changes no syntax tree's lines)."""
    out: list[str] = []
    line = 1
    for chunk in chunks:
        out.append("\n" * max(chunk.start_line - line, 0))
        out.append(chunk.text if chunk.text.endswith("\n") else chunk.text + "\n")
        line = chunk.end_line + 1
    return "".join(out)


# -- definition ------------------------------------------------------------------------------


def find_definitions(db: sqlite3.Connection, root: Path, name: str,
                     limit: int = 10) -> list[DefinitionHit]:
    """Where `name` is defined, best first (see the module docstring for the ranking)."""
    parts = split_name(name)
    backfill_definitions(db)
    rows = db.execute("SELECT path, names, kind, start_line, end_line, signature"
                      " FROM definitions WHERE name = ?", (parts[-1],)).fetchall()
    folded = False
    if not rows:  # the name as the agent remembered it, in another case
        rows = db.execute("SELECT path, names, kind, start_line, end_line, signature"
                          " FROM definitions WHERE name = ? COLLATE NOCASE",
                          (parts[-1],)).fetchall()
        folded = True
    wanted = tuple(p.lower() for p in parts) if folded else parts
    ranked: list[tuple[tuple[Any, ...], DefinitionHit]] = []
    for path, joined, kind, start, end, signature in rows:
        names = tuple(joined.split("\n"))
        level = _match_level(tuple(n.lower() for n in names) if folded else names,
                             _module_parts(path, folded), wanted)
        if level is None:
            continue
        hit = DefinitionHit(path, start, end, " > ".join(names), kind,
                            _language_of(db, path), signature, _LEVELS[level])
        key = (level, category(path), _SECONDARY_KINDS.get(kind, 0), len(names),
               len(path), path, start)
        ranked.append((key, hit))
    ranked.sort(key=lambda pair: pair[0])
    return [_relocate(root, hit) for _, hit in ranked[:limit]]


_LEVELS: Final = ("exact", "tail", "module")


def _match_level(names: tuple[str, ...], module: tuple[str, ...],
                 parts: tuple[str, ...]) -> int | None:
    if names == parts:
        return 0
    if len(parts) <= len(names) and names[-len(parts):] == parts:
        return 1
    for prefix in (module, module[:-1]):  # with the file's stem, or its folders alone
        qualified = prefix + names
        if len(parts) <= len(qualified) and qualified[-len(parts):] == parts:
            return 2
    return None


def _module_parts(path: str, folded: bool) -> tuple[str, ...]:
    pure = PurePosixPath(path)
    parts = (*pure.parent.parts, pure.stem.split(".")[0])
    return tuple(p.lower() for p in parts) if folded else tuple(parts)


def _language_of(db: sqlite3.Connection, path: str) -> str:
    row = db.execute("SELECT language FROM chunks WHERE path = ? LIMIT 1", (path,)).fetchone()
    return row[0] if row else (language_for_path(path) or "text")


def _relocate(root: Path, hit: DefinitionHit) -> DefinitionHit:
    """The hit at its line in the file as it is now: a definition whose file was edited
    above it has moved; one whose signature is gone is marked stale."""
    lines = _read_lines(root / hit.path)
    if lines is None:
        return DefinitionHit(**{**hit.to_dict(), "stale": True})
    wanted = hit.signature
    at = hit.start_line - 1
    if 0 <= at < len(lines) and _line_has(lines[at], wanted):
        return hit
    found = [i for i, line in enumerate(lines) if _line_has(line, wanted)]
    if not found:
        return DefinitionHit(**{**hit.to_dict(), "stale": True})
    new = min(found, key=lambda i: abs(i - at))
    shift = new - at
    return DefinitionHit(**{**hit.to_dict(), "start_line": hit.start_line + shift,
                            "end_line": hit.end_line + shift})


def _line_has(line: str, signature: str) -> bool:
    text = " ".join(line.split())
    return text == signature or (signature.endswith("…") and text.startswith(signature[:-1]))


def _read_lines(path: Path) -> list[str] | None:
    try:
        return path.read_bytes().decode("utf-8", "replace").split("\n")
    except OSError:
        return None


# -- outline ---------------------------------------------------------------------------------


def outline_of(db: sqlite3.Connection, root: Path, path: str) -> Outline:
    """The symbols of the repo-relative `path` with their lines and signatures."""
    try:
        data = (root / path).read_bytes()
    except FileNotFoundError:
        raise ToolInputError(f"no file {path} under {root}") from None
    except OSError as exc:
        raise ToolInputError(f"cannot read {root / path}: {exc.strerror or exc}") from None
    row = db.execute("SELECT digest FROM chunk_files WHERE path = ?", (path,)).fetchone()
    local = LocalChunks(db)
    chunks = local.for_file(path) if row is not None else []
    language = chunks[0].language if chunks else (language_for_path(path) or "text")
    fresh = row is not None and bytes(row[0]) == xxhash.xxh3_128_digest(data)
    if not fresh:
        text = data.decode("utf-8", "replace")
        defined = (definitions_of(text, language) if language in GRAMMAR_LANGUAGES
                   else _sections(text, language))
        return Outline(path, language, True, _entries(defined))
    if language not in GRAMMAR_LANGUAGES:
        return Outline(path, language, False,
                       _entries(_sections(text_of_chunks(chunks), language)))
    backfill_definitions(db)
    return Outline(path, language, False, _entries(local.definitions_for(path)))


def _entries(defined: Sequence[Definition]) -> list[OutlineEntry]:
    return [OutlineEntry(d.symbol, d.names[-1], d.kind, d.start_line, d.end_line,
                         d.signature, len(d.names) - 1) for d in defined if d.names]


def _sections(text: str, language: str) -> list[Definition]:
    """Prose and configuration: their headings (or top-level keys), each up to the next
    one of its level or above, as the line splitter finds them."""
    from indexer.chunker import split_lines
    from indexer.textsplit import text_pieces

    lines = split_lines(text)
    pieces = text_pieces(lines, language)
    starts: list[tuple[int, tuple[str, ...]]] = []
    previous: tuple[str, ...] = ()
    for line, defined in zip(pieces.starts, pieces.defined, strict=True):
        section = defined[0] if defined else ()
        if section and section != previous:
            starts.append((line, section))
        previous = section
    last = len(lines)
    while last > 0 and not lines[last - 1].strip():
        last -= 1
    out = []
    for i, (line, section) in enumerate(starts):
        end = next((later - 1 for later, inner in starts[i + 1:] if len(inner) <= len(section)),
                   last)
        out.append(Definition(section, "section", line + 1, max(end, line + 1),
                              " ".join(lines[line].split())))
    return out
