"""Turn decrypted chunk metadata into lines from the user's own disk, never wrong ones.

A hit names a file, a line range and the xxh3-128 of the lines it was built from. If the
lines on disk still hash the same, they are shown. If the file was edited since, the
chunk's text (kept in the local chunk table) is looked for in the current file and the hit
moves to where it now is; if it is gone, the hit is marked stale and shows nothing.
"""

from __future__ import annotations

from pathlib import Path

import xxhash

from indexer.local_chunks import LocalChunks


class FileLines:
    """Reads each file once per search and keeps its lines (with line endings)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, list[str] | None] = {}

    def get(self, path: str) -> list[str] | None:
        if path not in self._cache:
            try:
                data = (self.root / path).read_bytes()
                self._cache[path] = data.decode("utf-8").splitlines(keepends=True)
            except (OSError, UnicodeDecodeError):
                self._cache[path] = None
        return self._cache[path]


def locate(
    lines_of: FileLines, local: LocalChunks, path: str, start: int, end: int, chunk_hash: bytes
) -> tuple[int, int, str] | None:
    """(start, end, text) of the chunk as it is on disk now, or None if it is gone."""
    lines = lines_of.get(path)
    if lines is None:
        return None
    text = "".join(lines[start - 1 : end])
    if 1 <= start <= end <= len(lines) and xxhash.xxh3_128_digest(text.encode()) == chunk_hash:
        return start, end, text
    for old in local.by_hash(chunk_hash):
        if old.path != path:
            continue
        whole = "".join(lines)
        at = whole.find(old.text)
        # Only a match at a line start is the same chunk (not a fragment of a longer line).
        while at > 0 and whole[at - 1] != "\n":
            at = whole.find(old.text, at + 1)
        if at >= 0:
            new_start = whole.count("\n", 0, at) + 1
            new_end = new_start + (end - start)
            return new_start, new_end, old.text
    return None
