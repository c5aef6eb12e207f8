"""The unit of indexing: a contiguous run of whole lines of one file."""

from __future__ import annotations

import os
from dataclasses import dataclass

import xxhash

#: What the model reads of a chunk's text, in characters (0: all of it): its first lines,
#: cut at a line end. The cache key is of the text embedded, so vectors of other cuts
#: stay valid for what they hold. Set by CODEVEIL_EMBED_CHARS; bench/word_pieces.py
#: measures what a cut saves.
EMBED_CHARS = int(os.environ.get("CODEVEIL_EMBED_CHARS") or 0)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of whole lines of one file, with where it sits in the code.

    `text` is exactly the file's lines `start_line..end_line` (1-based, inclusive),
    newlines included, so `chunk_hash` can be re-checked against the file on disk.
    """

    path: str  # repo-relative, POSIX separators
    start_line: int
    end_line: int
    language: str  # e.g. "python", or "text" for the line/paragraph fallback
    symbol: str  # e.g. "Session > send"; "" at module level
    text: str

    @property
    def chunk_hash(self) -> bytes:
        """xxh3-128 of the chunk's raw text: identifies the lines on disk."""
        return xxhash.xxh3_128_digest(self.text.encode("utf-8"))

    @property
    def header(self) -> str:
        """The first line of the embedded text: where the chunk lives. Embedded on its
        own too, as the chunk's second vector."""
        return chunk_header(self.path, self.symbol)

    @property
    def embed_text(self) -> str:
        """What the model sees: a short location header, then the code (its first
        `EMBED_CHARS` characters, when set)."""
        return f"{self.header}\n{embed_head(self.text)}"


def chunk_header(path: str, symbol: str) -> str:
    """`path > symbol` (the path alone at module level): a chunk's location as text."""
    return f"{path} > {symbol}" if symbol else path


def embed_head(text: str, limit: int = EMBED_CHARS) -> str:
    """The first `limit` characters of `text` (all of it when `limit` is 0), cut at the
    last line end within them unless that would keep less than half."""
    if limit <= 0 or len(text) <= limit:
        return text
    end = text.rfind("\n", 0, limit)
    return text[: end + 1] if end + 1 >= limit // 2 else text[:limit]
