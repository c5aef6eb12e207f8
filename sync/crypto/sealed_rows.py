"""Sealed chunk rows: the one thing a sealed workspace's server stores per chunk.

A sealed row is an AES-256-GCM envelope holding the chunk's vector and its metadata. The
server cannot compare two rows, rank them, or tell what either holds; it keeps them so
that a teammate or a new machine can pull the vectors instead of embedding again::

    row id      16 random bytes, fresh every time a file is sent: ids carry no order and
                do not survive an edit, so the server learns which file changed, never
                which of its chunks.
    envelope    version (1 byte, 0x03) || nonce (12) || ciphertext || tag (16)
        AES-256-GCM under k_row with a random nonce
        associated data  version || u16 len(workspace id) || workspace id || row id
                         || file key (16)
        plaintext        u16 dim || vector as little-endian float16 (2 * dim bytes)
                         || u32 n || the metadata encoding of sync.crypto.ciphers (n bytes)
                         || zeros up to the next of META_BUCKETS
        padding row      u16 0 || zeros, as long as the smallest bucket's plaintext
    page row    version 0x04, sealed by `seal_in_page` (sync.crypto.pages): the same, bound to
                the page's key instead of the file's, and the plaintext holds the leaf
                value (16 bytes) of the file version after the vector; padding rows of
                a page are as long as its smallest rows

Lengths. The metadata (path, symbol, language) and its length prefix are padded to the
first of META_BUCKETS they fit, so every row of an ordinary chunk has one length, and a
rare long path or symbol one of a few others: the length no longer bounds a path's.
Padding rows. A store that groups rows by file learns how many each file has: rows of
version 3 were padded per file up to the next of ROW_BUCKETS (`padded_row_count`). Rows
now travel in pages of a fixed row count (sync.crypto.pages), padded to it, so no row count
belongs to a file. Padding rows cannot be told from chunk rows (same length, same key,
random ids); the client drops them when it opens rows (`RowSealer.open` returns None).
Rows of versions 2 (no length prefix, no padding) and 3 still open.

The associated data binds a row to its workspace, its id and the file it was sent with,
so a server that moves a row to another file, chunk or workspace makes it fail to open.
A puller also checks that the opened path is the file it asked for.

float16 halves the row. Measured on 20,000 real all-MiniLM-L6-v2 embeddings of code
(components below 0.3 in size): the cosine between a vector and its float16 copy is at
least 0.9999998, and for 500 of them as queries against the other 19,500, the top-10
neighbours are 99.98% the same (98.6% of lists in the very same order).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sync.crypto.ciphers import NONCE_SIZE, TAG_SIZE, ChunkMeta, decode_meta, encode_meta
from sync.crypto.keys import WorkspaceKey
from sync.errors import MetadataAuthError, MetadataFormatError
from sync.records import KEY_BYTES

ROW_VERSION = 3  # 1 is sync.crypto.ciphers's metadata envelope: the two never pass for each other
UNPADDED_VERSION = 2  # rows written before padding: still opened
#: A row of a page (sync.crypto.pages): it also names the file version it belongs to, since
#: the page it travels in names none.
PAGE_ROW_VERSION = 4
_OWNER = KEY_BYTES
_DIM = struct.Struct("<H")
_META_LEN = struct.Struct("<I")

#: Sizes the length prefix and metadata of a row are padded to. The first holds a path,
#: symbol and language of up to ~130 bytes together: 1,240 of the requests repo's 1,241
#: chunks; at dim 384 its rows are 967 bytes, four to a 4 KiB SQLite page (at 256 only
#: three fit, and the data dir grew 1.5x where the rows grew 1.4x). The others keep long
#: names apart from the rest in a few wide steps.
META_BUCKETS = (168, 512, 2048, 8192, 49152)
#: Rows per file: a file of n chunks is stored as the first of these at least n (and at
#: least 1, so an empty file looks like a small one). Steps of at most 1.5x: 17% more
#: rows on the requests repo; past the last, multiples of half of it.
ROW_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def padded_row_count(chunks: int) -> int:
    """How many rows a file of `chunks` chunks is stored as (see the module docstring)."""
    for size in ROW_BUCKETS:
        if chunks <= size:
            return size
    step = ROW_BUCKETS[-1] // 2
    return -(-chunks // step) * step


def _meta_bucket(n: int) -> int:
    for size in META_BUCKETS:
        if n <= size:
            return size
    raise ValueError(f"a chunk's metadata of {n} bytes is past the largest row bucket"
                     f" ({META_BUCKETS[-1]}): its path or symbol is too long")


@dataclass(frozen=True, slots=True)
class OpenRow:
    """A sealed row, opened: where the chunk lives and its plain vector (float32)."""

    meta: ChunkMeta
    vector: np.ndarray
    #: A page row's file version: the leaf value of the file it was cut from (None for
    #: a row stored under its file, whose leaf says it).
    value: bytes | None = None


def new_row_id() -> bytes:
    return os.urandom(KEY_BYTES)


def _aad_of(version: int, workspace_id: str, row_id: bytes, file_key: bytes) -> bytes:
    ws = workspace_id.encode("utf-8")
    return bytes([version]) + len(ws).to_bytes(2, "big") + ws + row_id + file_key


class RowSealer:
    """Seals and opens the rows of one workspace (the AEAD is keyed once)."""

    def __init__(self, key: WorkspaceKey, workspace_id: str, dim: int) -> None:
        if not 1 <= dim <= 0xFFFF:
            raise ValueError(f"dim must be in 1..65535, not {dim}")
        self._aead = AESGCM(key.row_key)
        self.workspace_id = workspace_id
        self.dim = dim

    def seal(self, row_id: bytes, file_key: bytes, meta: ChunkMeta,
             vector: np.ndarray) -> bytes:
        head, tail = self._plain(meta, vector)
        return self._seal(row_id, file_key, head + tail)

    def _plain(self, meta: ChunkMeta, vector: np.ndarray) -> tuple[bytes, bytes]:
        """A row's plaintext: (dim and vector, the metadata padded to its bucket)."""
        vec = np.asarray(vector, dtype="<f2").reshape(-1)
        if vec.shape[0] != self.dim:
            raise ValueError(f"expected a vector of {self.dim} values, got {vec.shape[0]}")
        encoded = encode_meta(meta)
        tail = _META_LEN.pack(len(encoded)) + encoded
        return _DIM.pack(self.dim) + vec.tobytes(), tail + bytes(_meta_bucket(len(tail))
                                                                 - len(tail))

    def seal_padding(self, row_id: bytes, file_key: bytes) -> bytes:
        """A padding row of the file: as long as a chunk row of the smallest bucket."""
        return self._seal(row_id, file_key, bytes(_DIM.size + 2 * self.dim + META_BUCKETS[0]))

    def seal_in_page(self, row_id: bytes, page_key: bytes, value: bytes, meta: ChunkMeta,
                     vector: np.ndarray) -> bytes:
        """A row of a page (sync.crypto.pages): as `seal`, bound to the page it is stored in,
        and naming inside the envelope the leaf `value` of the file version it holds a
        chunk of."""
        if len(value) != _OWNER:
            raise ValueError(f"a leaf value is {_OWNER} bytes, not {len(value)}")
        head, tail = self._plain(meta, vector)
        return self._seal(row_id, page_key, head + value + tail, PAGE_ROW_VERSION)

    def seal_page_padding(self, row_id: bytes, page_key: bytes) -> bytes:
        """A padding row of a page: as long as a page row of the smallest bucket."""
        plain = bytes(_DIM.size + 2 * self.dim + _OWNER + META_BUCKETS[0])
        return self._seal(row_id, page_key, plain, PAGE_ROW_VERSION)

    def _seal(self, row_id: bytes, file_key: bytes, plain: bytes,
              version: int = ROW_VERSION) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        sealed = self._aead.encrypt(nonce, plain,
                                    _aad_of(version, self.workspace_id, row_id, file_key))
        return bytes([version]) + nonce + sealed

    def open(self, row_id: bytes, file_key: bytes, blob: bytes) -> OpenRow | None:
        """Decrypt and check a row sealed by `seal` for the same workspace, id and file;
        None for a padding row (`seal_padding`), which holds no chunk."""
        where = f"row {row_id.hex()} of workspace {self.workspace_id}"
        if len(blob) < 1 + NONCE_SIZE + TAG_SIZE:
            raise MetadataAuthError(f"{where} is truncated ({len(blob)} bytes)")
        if blob[0] not in (ROW_VERSION, UNPADDED_VERSION, PAGE_ROW_VERSION):
            raise MetadataFormatError(
                f"{where} has envelope version {blob[0]}, not a sealed row ({ROW_VERSION}):"
                " the workspace is not sealed, or this codeveil is older than the one that"
                " wrote it"
            )
        try:
            plain = self._aead.decrypt(blob[1 : 1 + NONCE_SIZE], blob[1 + NONCE_SIZE :],
                                       _aad_of(blob[0], self.workspace_id, row_id, file_key))
        except InvalidTag:
            raise MetadataAuthError(
                f"{where} does not authenticate: the workspace key is wrong, or the store"
                " returned a row that was altered or belongs to another file or chunk"
            ) from None
        try:
            return self._decode(plain, padded=blob[0] != UNPADDED_VERSION,
                                owned=blob[0] == PAGE_ROW_VERSION)
        except (ValueError, struct.error) as exc:
            raise MetadataFormatError(f"{where} is malformed ({exc})") from None

    def _decode(self, plain: bytes, *, padded: bool, owned: bool) -> OpenRow | None:
        (dim,) = _DIM.unpack_from(plain)
        if padded and dim == 0:
            if any(plain):
                raise ValueError("a padding row holds something")
            return None
        if dim != self.dim:
            raise ValueError(f"it holds a vector of {dim} values, the workspace's are {self.dim}")
        end = _DIM.size + 2 * dim
        vector = np.frombuffer(plain[_DIM.size : end], dtype="<f2").astype(np.float32)
        if not np.all(np.isfinite(vector)):
            raise ValueError("its vector is not finite")
        value = None
        if owned:
            value, end = plain[end : end + _OWNER], end + _OWNER
            if len(value) != _OWNER:
                raise ValueError("it is too short to name its file")
        meta = plain[end:]
        if padded:
            (n,) = _META_LEN.unpack_from(meta)
            if _META_LEN.size + n > len(meta) or any(meta[_META_LEN.size + n :]):
                raise ValueError("its metadata length does not match the plaintext")
            meta = meta[_META_LEN.size : _META_LEN.size + n]
        return OpenRow(decode_meta(meta), vector, value)
