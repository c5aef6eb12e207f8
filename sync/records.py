"""Records that cross the client/server boundary. Every field is ciphertext or a keyed hash.

Keys and values are raw bytes here; the HTTP layer carries them as base64 and vectors
as little-endian float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KEY_BYTES = 16  # node keys, node values, chunk ids: HMAC-SHA256 truncated to 16 bytes


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One encrypted chunk: keyed id, encrypted vector, sealed metadata."""

    chunk_id: bytes  # 16 bytes
    vector: np.ndarray  # float32, shape (dim,): distance-comparison-preserving ciphertext
    meta: bytes  # AES-256-GCM envelope (see sync.crypto)


@dataclass(frozen=True, slots=True)
class FileUpdate:
    """Replace everything the store holds for one file, and its Merkle leaf.

    `ancestors` are the node keys of the directories above the file, root first;
    the server creates the ones it lacks. `value` is the new leaf value.
    """

    file_key: bytes
    ancestors: tuple[bytes, ...]
    value: bytes
    chunks: tuple[ChunkRecord, ...] = ()


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


@dataclass(frozen=True, slots=True)
class WorkspaceInfo:
    workspace_id: str
    dim: int
    model_id: str
    key_check: bytes  # keyed fingerprint of the workspace key, lets a client detect a wrong key
    chunks: int = 0
    nodes: int = 0
    extra: dict = field(default_factory=dict)
