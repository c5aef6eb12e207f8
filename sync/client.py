"""The one interface the sync and search code talks to, whoever holds the store.

`LocalClient` runs the store in-process (the embedded default, under `.codeveil/store/`);
`HttpClient` talks to `codeveil serve`. Both implement `StoreClient`, and every sync
test runs against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sync.records import (
    BlobRows,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)


@dataclass
class TransferStats:
    """What crossed the wire (zero bytes in-process, where nothing does)."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class StoreClient(Protocol):
    """Operations on one workspace. Every argument and result is ciphertext or a keyed hash.

    A client works on the tree of one ref (`ref`, 16 bytes; the default ref, 16 zero
    bytes, unless it was given one): root, children, apply, set_dir_values and
    file_rows read and write that tree; the pool and the refs are the workspace's."""

    stats: TransferStats
    ref: bytes

    def info(self) -> WorkspaceInfo:
        """The workspace's record (dim, model id, key check, counts)."""
        ...

    def root(self) -> NodeInfo | None:
        """The root of the Merkle tree, or None for an empty workspace."""
        ...

    def children(self, keys: list[bytes]) -> dict[bytes, list[NodeInfo]]:
        """Children of each directory key, in one round trip. Unknown keys map to []."""
        ...

    def apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> list[bytes]:
        """Replace the chunks and leaves of `updates`; remove the subtrees of `deletes`.

        Write order (see docs/architecture.md): first every touched leaf and all of its
        ancestors are set pending (value None), then chunk rows are replaced, then leaf
        values are set. A crash at any point leaves pending nodes that the next diff
        descends into, never a value claiming chunks that are not stored. Returns the
        keys of links (`FileUpdate.link`) whose blob the pool lacks: their leaves stay
        pending, and the caller sends those files.
        """
        ...

    def set_dir_values(self, values: list[DirValue]) -> NodeInfo | None:
        """Set directory values (bottom-up order) once every file below them is applied;
        each only if the store's children of it are the ones it was computed from.
        Returns the root as it stands after, in the same request (None for an empty
        tree, or a server that does not say): a root other than the one the values end
        with means a value was refused, or another writer of the ref came after."""
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

    def blob_rows(self, blobs: list[tuple[bytes, bytes]], *, rows: bool = True) -> BlobRows:
        """The rows of each (file key, value) the workspace's pool holds, from any ref,
        and the keys of those it lacks; sent in several calls when long. With `rows`
        false, only which it holds (each with [])."""
        ...

    def refs(self) -> list[RefInfo]:
        """Every ref of the workspace with a tree."""
        ...

    def drop_ref(self, ref: bytes) -> None:
        """Delete a ref's tree (RefNotFound if it has none)."""
        ...

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        """Drop stale refs and delete blobs no ref names (`WorkspaceBackend`)."""
        ...

    def verify(self) -> None:
        """Raise StoreCorrupt if the store plainly cannot read what it holds (a cheap
        check, run before an index reports success). A server checks its own files and
        answers 503 when they are damaged, so over HTTP this asks nothing."""
        ...

    def close(self) -> None: ...
