"""Where one chunk sits in a repo: the record the lexical index's documents
(`retrieval.indexes.lexical.ChunkLocation`), the sealed metadata
(`sync.crypto.ciphers.ChunkMeta`) and the fusion of both share, so that a hit from
either side is the same value, not a copy."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChunkLocation"]


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    """A chunk's file, lines, symbol path and language, and the hash of its text.

    Two locations are the same chunk when file and lines agree (`key`): the hash says
    which text was indexed there (to find it again after an edit), not where it is."""

    path: str
    start_line: int
    end_line: int
    symbol: str
    language: str
    chunk_hash: bytes = field(default=b"", compare=False)  # xxh3-128 of the chunk's text

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.path, self.start_line, self.end_line)
