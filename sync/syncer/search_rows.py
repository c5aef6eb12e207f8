"""A server-search workspace's rows in a sync (sync.syncer.rows_out.RowsOut): each row a
fresh random id, the chunk's metadata sealed, and a distance-preserving encrypted vector
the server ranks (sync.crypto.ciphers.VectorCipher). The server searches, so nothing is
kept or pulled on this machine beyond the chunks, and every file goes in a random order,
each batch sent as it is embedded (the server answers from what it has so far)."""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from indexer.chunk import Chunk
from indexer.local_chunks import LocalChunks
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import LocalTree, bucket_path
from sync.crypto.sealed_rows import new_row_id
from sync.records import ChunkRecord, FileUpdate, NodeInfo
from sync.syncer.diff import diff
from sync.syncer.rows_out import CachedVectors, Lacking, SyncPlan, chunk_meta

_random = random.SystemRandom()


class SearchRows:
    """The rows of a sync of a server-search workspace."""

    streams = True
    searched_here = False

    def __init__(self, key: WorkspaceKey, workspace_id: str,
                 cipher: ciphers.VectorCipher) -> None:
        self.key = key
        self.workspace_id = workspace_id
        self.cipher = cipher

    def attach(self, db: sqlite3.Connection, vectors: CachedVectors) -> None:
        pass  # nothing of the state db is its own

    # -- what this machine keeps: the chunks, pending until the store holds them ---

    def waits(self, uploaded: bool) -> bool:
        return uploaded

    def pulls(self, uploaded: bool, relayout: bool) -> bool:
        return False

    def headers(self, chunks: Iterable[Chunk]) -> list[str]:
        return []

    def order(self, todo: set[str], upload: set[str], root: Path, *,
              relayout: bool) -> list[str]:
        # Its rows are searched as they land: every file in a random order.
        return _random.sample(sorted(todo), len(todo))

    def left_pending(self, pending: set[str], upload: set[str]) -> tuple[set[str], set[str]]:
        # Those the store holds all the same: a crash hit between its commit and ours.
        # (Those it lacks are in `upload` and are sent again.)
        return set(), pending - upload

    def embedded_here(self, paths: list[str]) -> list[str]:
        return []  # pending until the store holds their vectors

    # -- the sync ----------------------------------------------------------------------

    def plan(self, client: StoreClient, files: dict[str, bytes], local: LocalChunks,
             local_digests: dict[str, bytes], *, fresh: bool, keep: bool,
             meanwhile: Callable[[], contextlib.AbstractContextManager[None]]) -> SyncPlan:
        tree = LocalTree.build(files, self.key)
        return SyncPlan(tree, diff(tree, client, self.key), set(), set(), local_digests)

    def complete(self, path: str, digest: bytes, chunks: Sequence[Chunk]) -> bool:
        return False  # no file is linked: its rows are sent

    def pull(self, wanted: Lacking, digests: dict[bytes, tuple[str, bytes]]
             ) -> list[tuple[bytes, np.ndarray]]:
        return []

    def consumed(self, versions: Iterable[tuple[str, bytes]]) -> None:
        pass

    def leaf(self, path: str, digest: bytes) -> FileUpdate:
        raise RuntimeError("a server-search workspace links no file: its rows are sent")

    def updates(self, sending: Sequence[tuple[str, bytes, list[Chunk]]],
                vectors: np.ndarray) -> list[FileUpdate]:
        updates: list[FileUpdate] = []
        row = 0
        for path, digest, chunks in sending:
            n = len(chunks)
            file_key = ciphers.node_key(self.key, path)
            updates.append(FileUpdate(
                file_key=file_key,
                ancestors=tuple(ciphers.node_key(self.key, a)
                                for a in bucket_path(self.key, path)),
                value=ciphers.node_value(self.key, path, digest),
                chunks=self._records(path, chunks, vectors[row : row + n]),
            ))
            row += n
        return updates

    def _records(self, path: str, chunks: list[Chunk], vectors: np.ndarray
                 ) -> tuple[ChunkRecord, ...]:
        if not chunks:
            return ()
        row_ids = [new_row_id() for _ in chunks]
        # A vector's noise stays a function of the chunk: a re-sent chunk under fresh
        # noise would let the server average the noise away.
        noise_ids = []
        seen: dict[bytes, int] = {}
        for c in chunks:
            ordinal = seen.get(c.chunk_hash, 0)
            seen[c.chunk_hash] = ordinal + 1
            noise_ids.append(ciphers.chunk_id(self.key, path, c.chunk_hash, ordinal))
        enc = self.cipher.encrypt(vectors, noise_ids)
        records = [ChunkRecord(rid, enc[i], ciphers.seal_meta(self.key, self.workspace_id,
                                                               rid, chunk_meta(path, c)))
                   for i, (rid, c) in enumerate(zip(row_ids, chunks, strict=True))]
        # In a random order: the store numbers rows as they come, and rows in chunk order
        # would tell it which row is which chunk of the file.
        _random.shuffle(records)
        return tuple(records)

    def compact(self) -> list[FileUpdate]:
        return []

    def deletes(self, deletes: list[bytes]) -> list[bytes]:
        return deletes

    def applied(self) -> None:
        pass

    def final_tree(self, tree: LocalTree, files: dict[str, bytes], dirs: list[str]
                   ) -> tuple[LocalTree, list[str]]:
        return tree, dirs

    def settled(self, root: NodeInfo | None, tree: LocalTree) -> bool:
        return True  # one writer's tree: nothing to pass again for
