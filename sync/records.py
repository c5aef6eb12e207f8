"""Records that cross the client/server boundary. Every field is ciphertext or a keyed hash.

Keys and values are raw bytes here; the HTTP layer carries them as base64 and vectors
as little-endian float32.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

KEY_BYTES = 16  # node keys, node values, chunk ids: HMAC-SHA256 truncated to 16 bytes
# The ref (one tree of a workspace, sync.store.embedded.pool) of a client that names none, and of
# every workspace's one tree before refs: 16 zero bytes, never an HMAC's output.
DEFAULT_REF = bytes(KEY_BYTES)

# What a workspace's rows hold. "sealed": each row is a chunk id and one envelope (vector
# and metadata sealed together); the server stores and returns rows and ranks nothing, the
# client searches. "server-search": each row also holds a distance-preserving encrypted
# vector that the server ranks. Workspaces created before modes existed are server-search.
MODE_SEALED = "sealed"
MODE_SERVER_SEARCH = "server-search"
MODES = (MODE_SEALED, MODE_SERVER_SEARCH)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One encrypted chunk: keyed id, encrypted vector (server-search workspaces only),
    sealed metadata (in a sealed workspace, the envelope of vector and metadata)."""

    chunk_id: bytes  # 16 bytes
    # float32, shape (dim,): distance-comparison-preserving ciphertext; None when sealed
    vector: np.ndarray | None
    meta: bytes  # AES-256-GCM envelope (see sync.crypto.ciphers)


@dataclass(frozen=True, slots=True)
class FileUpdate:
    """Replace everything the store holds for one file, and its Merkle leaf.

    `ancestors` are the node keys of the directories above the file, root first;
    the server creates the ones it lacks. `value` is the new leaf value (in a sealed
    workspace it also names the file's blob in the pool: HMAC(k_tree, path, digest)).
    """

    file_key: bytes
    ancestors: tuple[bytes, ...]
    value: bytes
    chunks: tuple[ChunkRecord, ...] = ()
    # Sealed: the leaf names a blob the workspace's pool already holds (the rows of
    # this file at this value, sent by any ref); no chunks travel. A link to a blob the
    # pool lacks leaves the leaf pending (`apply` returns its key).
    link: bool = False


class DirValue(NamedTuple):
    """A directory value, and the children it was computed from.

    `children` is `children_digest` of the (key, value) pairs of the directory's children
    as the client computed them. The store sets `value` only if its own children of `key`
    digest to the same bytes (a compare-and-set): a value computed over a tree that
    another writer changed since is refused, so the tree never claims rows it lacks.
    """

    key: bytes
    value: bytes
    children: bytes


def children_digest(children: Iterable[tuple[bytes, bytes]]) -> bytes:
    """SHA-256 of a directory's (child key, child value) pairs in key order, 16 bytes.

    Computed alike by the client (from its tree) and the store (from its nodes)."""
    h = hashlib.sha256(b"codeveil-children-v1")
    for key, value in sorted(children):
        h.update(key)
        h.update(value)
    return h.digest()[:KEY_BYTES]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A Merkle node as the server knows it. `value` is None while a commit touching
    the node's subtree has not finished: it never matches a client value."""

    key: bytes
    value: bytes | None
    is_dir: bool


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A nearest encrypted chunk: its id, its encrypted-space distance, its sealed metadata."""

    chunk_id: bytes
    distance: float
    meta: bytes


# file key -> [(chunk id, meta)] of its rows, in the order they were sent (`file_rows`)
FileRows = dict[bytes, list[tuple[bytes, bytes]]]


class BlobRows(NamedTuple):
    """The answer of `blob_rows`: the rows of each blob the pool holds, by file key, and
    the file keys whose blob it lacks; a key in neither was left out of a bounded answer
    (ask again)."""

    rows: FileRows
    missing: list[bytes]


@dataclass(frozen=True, slots=True)
class WorkspaceInfo:
    workspace_id: str
    dim: int
    model_id: str
    key_check: bytes  # keyed fingerprint of the workspace key, lets a client detect a wrong key
    chunks: int = 0
    nodes: int = 0
    extra: dict = field(default_factory=dict)
    mode: str = MODE_SERVER_SEARCH  # one of MODES


@dataclass(frozen=True, slots=True)
class RefInfo:
    """One ref of a workspace as its store knows it: the opaque id, when it last wrote
    (seconds since the epoch), and what its tree holds (files; rows of their blobs)."""

    ref: bytes
    synced_at: float
    files: int
    rows: int


# Invitee tokens (sync.store.core.invitees keeps their rules): what a client reads of
# them and the limits it is told.
#: The longest an invitee token may be made for, in seconds (one year): a longer-lived
#: credential is the workspace's own token.
MAX_EXPIRES_IN = 366 * 86_400

OWNER_ONLY = ("only the token the workspace was created with manages invitee tokens; ask"
              " the workspace's owner (who ran `codeveil init --server`)")


@dataclass(frozen=True, slots=True)
class Invitee:
    """One invitee token as a store lists it (never the token)."""

    token_id: str
    created_at: float
    expires_at: float | None

    def to_json(self) -> dict[str, object]:
        return {"token_id": self.token_id, "created_at": self.created_at,
                "expires_at": self.expires_at}
