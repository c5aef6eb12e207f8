"""The client side of the blob pool (sync.store.embedded.pool) in a sync: which changed files
the workspace already holds under some ref, the links that point this ref's tree at
them, and the pull of a file's rows by its content (sync.syncer.syncer uses these)."""

from __future__ import annotations

from collections.abc import Iterable

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import bucket_path
from sync.records import FileRows, FileUpdate

PRESENCE_FILES = 2048  # files per look-up of the pool (keys only, no rows)


def blob_of(key: WorkspaceKey, path: str, digest: bytes) -> tuple[bytes, bytes]:
    """(file key, value): a file version's blob in the pool, which is its leaf."""
    return ciphers.node_key(key, path), ciphers.node_value(key, path, digest)


def pooled(client: StoreClient, key: WorkspaceKey, files: dict[str, bytes],
           paths: Iterable[str]) -> set[str]:
    """Those of `paths` (at their digests in `files`) whose blob the pool holds: sent by
    any ref before, so this ref's tree only has to point at it."""
    by_key = {ciphers.node_key(key, p): p for p in paths}
    items = [(k, ciphers.node_value(key, p, files[p])) for k, p in by_key.items()]
    held: set[str] = set()
    for start in range(0, len(items), PRESENCE_FILES):
        answer = client.blob_rows(items[start : start + PRESENCE_FILES], rows=False)
        held.update(by_key[k] for k in answer.rows)
    return held


def leaf_update(key: WorkspaceKey, path: str, digest: bytes, *,
                link: bool = False) -> FileUpdate:
    """The update that sets `path`'s leaf and carries no rows: a leaf whose rows are in
    pages (sync.crypto.pages), or, with `link`, one pointing at its blob in the pool."""
    file_key, value = blob_of(key, path, digest)
    return FileUpdate(file_key=file_key,
                      ancestors=tuple(ciphers.node_key(key, a) for a in bucket_path(key, path)),
                      value=value, link=link)


def link_update(key: WorkspaceKey, path: str, digest: bytes) -> FileUpdate:
    """The update that points `path`'s leaf at its blob in the pool: no rows travel."""
    return leaf_update(key, path, digest, link=True)


def pull_rows(client: StoreClient, key: WorkspaceKey,
              wanted: dict[bytes, tuple[str, bytes]]) -> FileRows:
    """The rows of each file of `wanted` (file key -> (path, digest)) from the pool, by
    its content: whichever ref sent that version. A file the pool lacks is left out."""
    items = [(k, ciphers.node_value(key, path, digest)) for k, (path, digest) in wanted.items()]
    return client.blob_rows(items).rows
