"""Turn decrypted chunk metadata into lines from the user's own disk, never wrong ones.

A hit names a file, a line range and the xxh3-128 of the lines it was built from. If the
lines on disk still hash the same, they are shown. If the file was edited since, the
chunk's text (kept in the local chunk table) is looked for in the current file and the hit
moves to where it now is; if it is gone, the hit is marked stale and shows nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

from indexer.local_chunks import LocalChunks


class FileText:
    """One file as read for a search: its text and where each line ends. Lines end at
    "\n" only, as the chunker counts them; a span is cut from the bytes and hashed as
    they are, so no list of every line is built for a file of which a hit shows ten."""

    def __init__(self, data: bytes, text: str) -> None:
        self.data = data
        self.text = text
        self._ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A)

    @property
    def line_count(self) -> int:
        return len(self._ends) + (1 if self.data and not self.data.endswith(b"\n") else 0)

    def span(self, start: int, end: int) -> bytes:
        """Lines `start..end` (1-based, inclusive), line endings kept."""
        first = 0 if start == 1 else int(self._ends[start - 2]) + 1
        last = int(self._ends[end - 1]) + 1 if end <= len(self._ends) else len(self.data)
        return self.data[first:last]


class FileLines:
    """Reads each file once per search (None: gone, unreadable or not UTF-8)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, FileText | None] = {}

    def get(self, path: str) -> FileText | None:
        if path not in self._cache:
            try:
                data = (self.root / path).read_bytes()
                self._cache[path] = FileText(data, data.decode("utf-8"))
            except (OSError, UnicodeDecodeError):
                self._cache[path] = None
        return self._cache[path]


def locate(
    lines_of: FileLines, local: LocalChunks, path: str, start: int, end: int, chunk_hash: bytes
) -> tuple[int, int, str] | None:
    """(start, end, text) of the chunk as it is on disk now, or None if it is gone."""
    file = lines_of.get(path)
    if file is None:
        return None
    if 1 <= start <= end <= file.line_count:
        raw = file.span(start, end)
        if xxhash.xxh3_128_digest(raw) == chunk_hash:
            return start, end, raw.decode("utf-8")
    for old in local.by_hash(chunk_hash):
        if old.path != path:
            continue
        whole = file.text
        at = whole.find(old.text)
        # Only a match at a line start is the same chunk (not a fragment of a longer line).
        while at > 0 and whole[at - 1] != "\n":
            at = whole.find(old.text, at + 1)
        if at >= 0:
            new_start = whole.count("\n", 0, at) + 1
            new_end = new_start + (end - start)
            return new_start, new_end, old.text
    return None
