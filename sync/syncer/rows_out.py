"""One sync's rows as one member, chosen when the workspace opens.

A workspace is sealed or server-search (sync.records.MODES). A sealed workspace's rows
travel in pages that name no file, search runs on this machine, and a file the store
holds but this machine has no vectors for is pulled (sync.syncer.paged_sync.PagedSync);
a server-search workspace's rows each carry an encrypted vector the server ranks, and
nothing comes back (sync.syncer.search_rows.SearchRows). Every difference the mode makes
to a sync is a hook of this member, so that the Syncer (sync.syncer.syncer) does not
branch on the mode: it calls the hooks at each step of one sync (plan, read, embed,
send, compact, set the directories), the same steps in every mode.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from indexer.chunk import Chunk
from indexer.local_chunks import LocalChunks
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.merkle import LocalTree
from sync.crypto.pages import PageRow
from sync.records import FileUpdate, NodeInfo
from sync.syncer.diff import Diff

#: The vectors this machine's embedding cache holds for rows (None where it lacks one).
CachedVectors = Callable[[list[PageRow]], list[np.ndarray | None]]
#: Per file key: (its path, the (cache key, chunk) pairs whose vectors are lacking).
Lacking = dict[bytes, tuple[str, list[tuple[bytes, Chunk]]]]


def chunk_meta(path: str, c: Chunk) -> ciphers.ChunkMeta:
    """What a row says (sealed) of where chunk `c` of `path` lives."""
    return ciphers.ChunkMeta(path=path, start_line=c.start_line, end_line=c.end_line,
                             symbol=c.symbol, language=c.language, chunk_hash=c.chunk_hash)


@dataclass
class SyncPlan:
    """What a sync's diff found: the tree, the diff, the changed files whose rows the
    store holds already (only their leaf is sent), the files whose leaf matches but
    whose rows are sent again, and this machine's chunk digests as they stand after it."""

    tree: LocalTree
    diff: Diff
    linked: set[str]
    resend: set[str]
    local_digests: dict[str, bytes]


class RowsOut(Protocol):
    """The rows of one sync, as the workspace's mode sends them and reads them back."""

    #: Rows are sent batch by batch as they are embedded (a server that searches them, or
    #: teammates who pull them); otherwise only once every file is embedded, in a random
    #: order.
    streams: bool
    #: Search runs on this machine: it keeps every chunk's vectors, headers included.
    searched_here: bool

    def attach(self, db: sqlite3.Connection, vectors: CachedVectors) -> None:
        """The sync's state db and this machine's cached vectors, once per Syncer."""
        ...

    # -- what this machine keeps of the files it reads -------------------------------

    def waits(self, uploaded: bool) -> bool:
        """Whether a file read here stays pending (`LocalChunks`) until its batch is
        done; `uploaded`: the store lacks it."""
        ...

    def pulls(self, uploaded: bool, relayout: bool) -> bool:
        """Whether a file read here has its rows read back from the store to fill this
        machine's embedding cache before anything is embedded."""
        ...

    def headers(self, chunks: Iterable[Chunk]) -> list[str]:
        """The header texts of `chunks` to embed on this machine (none where the server
        searches)."""
        ...

    def order(self, todo: set[str], upload: set[str], root: Path, *,
              relayout: bool) -> list[str]:
        """The order files are read, pulled and embedded in. What the store sees of it
        never follows the priority (the order rows arrive in would tell a server which
        files are source, tests or docs)."""
        ...

    def left_pending(self, pending: set[str], upload: set[str]) -> tuple[set[str], set[str]]:
        """Of the files an earlier sync left pending (a crash): (those done again, those
        the store holds all the same)."""
        ...

    def embedded_here(self, paths: list[str]) -> list[str]:
        """Of files whose vectors this machine has just embedded without the store
        (`Syncer.run_local`), those no longer pending."""
        ...

    # -- the sync ----------------------------------------------------------------------

    def plan(self, client: StoreClient, files: dict[str, bytes], local: LocalChunks,
             local_digests: dict[str, bytes], *, fresh: bool, keep: bool,
             meanwhile: Callable[[], contextlib.AbstractContextManager[None]]) -> SyncPlan:
        """Diff `files` (path -> digest) against the store's tree; `meanwhile` may run
        while the diff reads the store. `fresh` (a re-upload): nothing the store holds
        is trusted. `keep` (a pass after another writer of this ref was met): delete
        nothing another checkout's tree may name."""
        ...

    def complete(self, path: str, digest: bytes, chunks: Sequence[Chunk]) -> bool:
        """Whether the store holds a row of every one of `chunks` of a linked file."""
        ...

    def pull(self, wanted: Lacking, digests: dict[bytes, tuple[str, bytes]]
             ) -> list[tuple[bytes, np.ndarray]]:
        """(cache key, vector) of each lacking chunk of `wanted` that the store's rows
        hold, for the versions being read (`digests`: file key -> (path, digest))."""
        ...

    def consumed(self, versions: Iterable[tuple[str, bytes]]) -> None:
        """The cache holds the vectors of these (path, digest) versions now."""
        ...

    def leaf(self, path: str, digest: bytes) -> FileUpdate:
        """The leaf of a linked file: its rows are in the store already."""
        ...

    def updates(self, sending: Sequence[tuple[str, bytes, list[Chunk]]],
                vectors: np.ndarray) -> list[FileUpdate]:
        """What sends the rows of `sending` ((path, digest, chunks), the chunks' vectors
        in order); the next `deletes` and `applied` belong to the apply that sends it."""
        ...

    def compact(self) -> list[FileUpdate]:
        """Once every file is sent: what compacts the store's rows ([] for nothing)."""
        ...

    def deletes(self, deletes: list[bytes]) -> list[bytes]:
        """The node keys an apply deletes: `deletes` and what the pending write empties."""
        ...

    def applied(self) -> None:
        """The store took the pending write."""
        ...

    def final_tree(self, tree: LocalTree, files: dict[str, bytes], dirs: list[str]
                   ) -> tuple[LocalTree, list[str]]:
        """The tree as the sync left it, and the directories whose values to set."""
        ...

    def settled(self, root: NodeInfo | None, tree: LocalTree) -> bool:
        """Whether the store's root, as the last directory values left it, is this
        tree's (False: another writer of the ref synced meanwhile; pass again)."""
        ...
