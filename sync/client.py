"""The one interface the sync and search code talks to, whoever holds the store.

`LocalClient` runs the store in-process (the embedded default, under `.codeveil/store/`);
`HttpClient` talks to `codeveil serve`. Both implement `StoreClient`, and every sync
test runs against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sync.records import DirValue, FileRows, FileUpdate, NodeInfo, SearchHit, WorkspaceInfo


@dataclass
class TransferStats:
    """What crossed the wire (zero bytes in-process, where nothing does)."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class StoreClient(Protocol):
    """Operations on one workspace. Every argument and result is ciphertext or a keyed hash."""

    stats: TransferStats

    def info(self) -> WorkspaceInfo:
        """The workspace's record (dim, model id, key check, counts)."""
        ...

    def root(self) -> NodeInfo | None:
        """The root of the Merkle tree, or None for an empty workspace."""
        ...

    def children(self, keys: list[bytes]) -> dict[bytes, list[NodeInfo]]:
        """Children of each directory key, in one round trip. Unknown keys map to []."""
        ...

    def apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> None:
        """Replace the chunks and leaves of `updates`; remove the subtrees of `deletes`.

        Write order (see docs/architecture.md): first every touched leaf and all of its
        ancestors are set pending (value None), then chunk rows are replaced, then leaf
        values are set. A crash at any point leaves pending nodes that the next diff
        descends into, never a value claiming chunks that are not stored.
        """
        ...

    def set_dir_values(self, values: list[DirValue]) -> None:
        """Set directory values (bottom-up order) once every file below them is applied;
        each only if the store's children of it are the ones it was computed from."""
        ...

    def search(self, vector: np.ndarray, k: int) -> list[SearchHit]:
        """The k stored chunks nearest to an encrypted query vector. SealedWorkspaceError
        (sync.wire) in a sealed workspace: there, search runs on the client."""
        ...

    def file_rows(self, file_keys: list[bytes]) -> FileRows:
        """(chunk id, meta) of each row of each file, in the order the rows were sent,
        for every key that is a committed leaf of the tree; [] for a key that is unknown,
        pending or a directory. Works in both modes; a long list is sent in several
        calls (`Limits.max_row_files`, `Limits.max_row_bytes`)."""
        ...

    def verify(self) -> None:
        """Raise StoreCorrupt if the store plainly cannot read what it holds (a cheap
        check, run before an index reports success). A server checks its own files and
        answers 503 when they are damaged, so over HTTP this asks nothing."""
        ...

    def close(self) -> None: ...
