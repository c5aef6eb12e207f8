"""Who uses a name: the chunks holding whole-word occurrences of an identifier.

The files are found by grep (the trigram index narrows them to the ones holding the
name), read as they are on disk now. In a language with a grammar the file is parsed and
only identifier nodes spelling the name count: a word in a comment or a string does
not (`approximate` is False). Elsewhere (prose, configuration, languages without a
grammar here) every whole-word occurrence counts, and the hit says `approximate`.

The definition of the name is not a use of it: an occurrence on the line a definition
of that name starts on is left out, and a chunk left with none is not returned. A
qualified name (`Session.send`) looks for its last name (`send`); chunks that also
mention the qualifiers (`Session`) rank first. Then the chunks of files that bind the
name to a file defining it (`resolved`: they import it from there, or define it;
retrieval.agent.imports) before mere same-name occurrences, then source before tests before
docs, more occurrences first, then path and line.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import xxhash

from indexer.chunk import Chunk
from indexer.definitions import definitions_of, identifier_lines
from indexer.languages import language_for_path
from indexer.local_chunks import LocalChunks
from indexer.priority import category
from retrieval.agent.grep import Freshness, grep_files
from retrieval.agent.imports import binds_to_definition
from retrieval.agent.symbols import ToolInputError, backfill_definitions, split_name
from retrieval.indexes.trigram_index import TrigramIndex

__all__ = ["ReferenceHit", "find_references"]

MAX_LINES_SHOWN: Final = 3
"""Occurrence lines a hit shows; the rest are counted (`lines` lists them all)."""

_IDENTIFIER: Final = re.compile(r"[\w$]+[!?]?")


@dataclass(frozen=True, slots=True)
class ReferenceHit:
    """One chunk that uses the name: its lines, the lines of the occurrences, and up to
    MAX_LINES_SHOWN of them as text (`truncated` when there are more)."""

    path: str
    start_line: int
    end_line: int
    symbol: str  # the chunk's symbol path
    language: str
    lines: list[int]
    text: str
    approximate: bool
    truncated: bool
    resolved: bool = False  # the file binds the name to a file defining it (imports)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_references(root: Path, db: sqlite3.Connection, index: TrigramIndex, name: str, *,
                    path: str | None = None, limit: int = 20,
                    freshness: Freshness | None = None) -> list[ReferenceHit]:
    """The chunks using `name`, best first (see the module docstring)."""
    parts = split_name(name)
    ident = parts[-1]
    if not _IDENTIFIER.fullmatch(ident):
        raise ToolInputError(f"{ident!r} is not an identifier; give a name like `send`")
    word = re.escape(ident)
    pattern = rf"\b{word}\b" if re.fullmatch(r"\w+", ident) else rf"(?<![\w$]){word}(?![\w$!?])"
    found = grep_files(root, db, index, pattern, path=path, freshness=freshness)
    by_file: dict[str, list[int]] = {}
    for match in found.matches:
        by_file.setdefault(match.path, []).append(match.line)
    backfill_definitions(db)
    local = LocalChunks(db)
    defining = {p for (p,) in db.execute(
        "SELECT DISTINCT path FROM definitions WHERE name = ?", (ident,))}
    ranked: list[tuple[tuple[Any, ...], ReferenceHit]] = []
    for rel, lines in by_file.items():
        for hit in _file_hits(root, db, local, rel, lines, parts, defining):
            mentions = all(q in hit.text or _chunk_mentions(root, hit, q) for q in parts[:-1])
            key = (not mentions, not hit.resolved, category(rel), -len(hit.lines), rel,
                   hit.start_line)
            ranked.append((key, hit))
    ranked.sort(key=lambda pair: pair[0])
    return [hit for _, hit in ranked[:limit]]


def _file_hits(root: Path, db: sqlite3.Connection, local: LocalChunks, rel: str,
               grep_lines: list[int], parts: tuple[str, ...],
               defining: set[str]) -> list[ReferenceHit]:
    try:
        data = (root / rel).read_bytes()
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    row = db.execute("SELECT digest FROM chunk_files WHERE path = ?", (rel,)).fetchone()
    fresh = row is not None and bytes(row[0]) == xxhash.xxh3_128_digest(data)
    chunks = local.for_file(rel) if fresh else []
    language = chunks[0].language if chunks else (language_for_path(rel) or "text")
    ident = parts[-1]
    exact = identifier_lines(text, language, ident)
    lines = sorted(set(grep_lines) & set(exact)) if exact is not None else grep_lines
    defined = _definition_lines(db, rel, text, language, parts, fresh)
    lines = [n for n in lines if n not in defined]
    if not lines:
        return []
    if not fresh:
        from indexer.chunker import chunk_file

        chunks = chunk_file(rel, text, language=language)
    file_lines = text.split("\n")
    resolved = binds_to_definition(rel, text, language, ident, defining)
    out = []
    for chunk in _chunks_holding(chunks, lines):
        held = [n for n in lines if chunk.start_line <= n <= chunk.end_line]
        shown = held[:MAX_LINES_SHOWN]
        out.append(ReferenceHit(
            rel, chunk.start_line, chunk.end_line, chunk.symbol, language, held,
            "\n".join(f"{n}: {file_lines[n - 1]}" for n in shown), exact is None,
            len(held) > len(shown), resolved))
    return out


def _definition_lines(db: sqlite3.Connection, rel: str, text: str, language: str,
                      parts: tuple[str, ...], fresh: bool) -> set[int]:
    """Lines on which a definition of the name (its last part) starts."""
    ident = parts[-1]
    if fresh:
        return {start for (start,) in db.execute(
            "SELECT start_line FROM definitions WHERE path = ? AND name = ?", (rel, ident))}
    return {d.start_line for d in definitions_of(text, language) if d.names[-1] == ident}


def _chunks_holding(chunks: Sequence[Chunk], lines: Sequence[int]) -> list[Chunk]:
    wanted = set(lines)
    return [c for c in chunks if any(c.start_line <= n <= c.end_line for n in wanted)]


def _chunk_mentions(root: Path, hit: ReferenceHit, word: str) -> bool:
    """Whether the hit's chunk, as on disk, holds `word` (a qualifier of the name)."""
    try:
        lines = (root / hit.path).read_text(errors="replace").split("\n")
    except OSError:
        return False
    return word in "\n".join(lines[hit.start_line - 1 : hit.end_line])
