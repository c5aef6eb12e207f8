"""The client side of the blob pool (sync.store.embedded.pool) in a sync of a sealed
workspace: a file's leaf, which holds no row (its rows are in pages), and the pull of a
file's rows by its content (sync.syncer.paged_sync uses these)."""

from __future__ import annotations

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import bucket_path
from sync.records import FileRows, FileUpdate


def leaf_update(key: WorkspaceKey, path: str, digest: bytes) -> FileUpdate:
    """The update that sets `path`'s leaf and carries no rows: a leaf whose rows are in
    pages (sync.crypto.pages)."""
    return FileUpdate(file_key=ciphers.node_key(key, path),
                      ancestors=tuple(ciphers.node_key(key, a) for a in bucket_path(key, path)),
                      value=ciphers.node_value(key, path, digest))


def pull_rows(client: StoreClient, key: WorkspaceKey,
              wanted: dict[bytes, tuple[str, bytes]]) -> FileRows:
    """The rows of each file of `wanted` (file key -> (path, digest)) from the pool, by
    its content: whichever ref sent that version. A file the pool lacks is left out."""
    items = [(k, ciphers.node_value(key, path, digest)) for k, (path, digest) in wanted.items()]
    return client.blob_rows(items).rows
