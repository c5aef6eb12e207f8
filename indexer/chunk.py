"""The unit of indexing: a contiguous run of whole lines of one file."""

from __future__ import annotations

from dataclasses import dataclass

import xxhash


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
        """What the model sees: a short location header, then the code."""
        return f"{self.header}\n{self.text}"


def chunk_header(path: str, symbol: str) -> str:
    """`path > symbol` (the path alone at module level): a chunk's location as text."""
    return f"{path} > {symbol}" if symbol else path
