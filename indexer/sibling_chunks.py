"""Chunks of another checkout of the same repository, reused instead of chunking again.

A `git worktree add` of an indexed repository holds mostly the same files at the same
paths. Where another worktree's chunk table holds a file of the same path and content,
and the same chunker wrote that table (indexer.chunker_stamp; a table written by any
other is never read), its chunks and definitions are this file's: copied, not parsed.
The embedding cache already spares the vectors; this spares the parse. Other worktrees
are the ones `git worktree list` names; clones elsewhere are not searched for.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
from pathlib import Path
from typing import Final

from indexer.chunk import Chunk
from indexer.chunker_stamp import chunker_stamp
from indexer.definitions import Definition
from indexer.local_chunks import LocalChunks

log = logging.getLogger(__name__)

STATE: Final = Path(".codeveil") / "state.sqlite"
GIT_TIMEOUT_S: Final = 5.0


def other_worktrees(root: Path) -> list[Path]:
    """The other worktrees of `root`'s git repository ([] outside git, or if git fails)."""
    try:
        done = subprocess.run(["git", "-C", str(root), "worktree", "list", "--porcelain"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    here = root.resolve()
    out = []
    for line in done.stdout.splitlines():
        if line.startswith("worktree "):
            path = Path(line[len("worktree "):])
            if path.resolve() != here:
                out.append(path)
    return out


class SiblingChunks:
    """Read-only lookups in the chunk tables of a repository's other worktrees."""

    def __init__(self, states: list[Path]) -> None:
        self._dbs: list[tuple[sqlite3.Connection, LocalChunks]] = []
        ours = chunker_stamp()
        for state in states:
            db = None
            try:
                db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=1.0,
                                     check_same_thread=False)
                row = db.execute("SELECT value FROM state_meta WHERE key = 'chunker'").fetchone()
                if row is not None and bytes(row[0]) == ours:
                    # Its schema is current (stamped by this chunker): LocalChunks only reads.
                    self._dbs.append((db, LocalChunks(db)))
                    continue
            except sqlite3.Error as e:  # unreadable, or written before stamps: not ours
                log.debug("not reusing chunks of %s: %s", state, e)
            if db is not None:
                db.close()

    @classmethod
    def for_root(cls, root: Path) -> SiblingChunks:
        return cls([p / STATE for p in other_worktrees(root) if (p / STATE).is_file()])

    def __bool__(self) -> bool:
        return bool(self._dbs)

    def lookup(self, path: str, digest: bytes) -> tuple[list[Chunk], list[Definition]] | None:
        """The chunks and definitions of `path` at content `digest`, if a sibling holds
        both for exactly that content; None otherwise (chunk it)."""
        for db, local in self._dbs:
            try:
                got = _read(db, local, path, digest)
            except sqlite3.Error as e:  # being written, or damaged: chunk it here
                log.debug("sibling chunk table unreadable: %s", e)
                continue
            if got is not None:
                return got
        return None

    def close(self) -> None:
        for db, _local in self._dbs:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._dbs.clear()


def _read(db: sqlite3.Connection, local: LocalChunks, path: str, digest: bytes
          ) -> tuple[list[Chunk], list[Definition]] | None:
    # One read transaction: the chunks, their file's digest and its definitions agree.
    with db:
        db.execute("BEGIN")
        row = db.execute("SELECT f.digest, d.digest FROM chunk_files f JOIN definition_files d"
                         " USING (path) WHERE path = ?", (path,)).fetchone()
        if row is None or bytes(row[0]) != digest or bytes(row[1]) != digest:
            return None
        return local.for_file(path), local.definitions_for(path)
