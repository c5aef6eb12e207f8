"""Everything the server may see is produced here: keyed names, sealed metadata, vectors.

Formats. Integers are big-endian; strings are UTF-8 (paths with surrogateescape, so every
name a POSIX file system allows round-trips); k_* are sub-keys from sync.crypto.keys::

    node key    HMAC-SHA256(k_path, path)[:16]                         root: path ""
    node value  HMAC-SHA256(k_tree, u32 len(path) || path || digest)[:16]
    page value  HMAC-SHA256(k_tree, 0xFFFFFFFF || "page" || page key)[:16]
                (a page's leaf, sync.crypto.pages; no path is 2^32 - 1 bytes long)
    chunk id    HMAC-SHA256(k_chunk, u32 len(path) || path
                                     || u16 len(chunk hash) || chunk hash || u32 ordinal)[:16]

    metadata envelope   version (1 byte, 0x01) || nonce (12) || ciphertext || tag (16)
        AES-256-GCM under k_meta with a random nonce
        associated data  version || u16 len(workspace id) || workspace id || chunk id
        plaintext        chunk hash (16) || u32 start line || u32 end line
                         || u16 len(path) || u16 len(symbol) || u16 len(language)
                         || path || symbol || language || zero bytes to a multiple of 32

    encrypted vector    c = s * R v + lambda     float32, shape (dim,)

Length prefixes make every encoding injective: ("ab", "c") and ("a", "bc") never meet.
The associated data binds an envelope to its chunk and workspace, so a server that moves a
blob to another chunk or workspace makes it fail to open. Random 96-bit nonces are safe
up to 2^32 seals per key (NIST SP 800-38D); a workspace seals once per uploaded chunk.
The padding leaves the server the combined length of path, symbol and language only to
within 32 bytes. Readers refuse a version byte they do not know.

Vectors: approximate distance-comparison-preserving encryption, scale-and-perturb
(Fuchsbauer, Ghosal, Hauke, O'Neill, SCN 2022), with a secret rotation in front:

    R       dim x dim orthogonal: Q of the QR decomposition of a Gaussian matrix, columns
            sign-fixed so that the triangular factor has a positive diagonal (this makes Q
            a function of the matrix alone). Matrix from the stream under
            HMAC(k_vector, 0x01 || u32 dim).
    s       10 ** (3 + u), u = HMAC(k_vector, 0x02)[:8] / 2^64: s in [1e3, 1e4).
    lambda  uniform in the ball of radius s * beta / 4: Gaussian direction, normalised,
            times s * beta / 4 * U ** (1 / dim). A stored vector's randomness is
            AES-256(HMAC(k_vector, 0x03), seed || u32 block index), seed =
            HMAC(k_vector, 0x04 || chunk id)[:12]: the same chunk always gets the same
            ciphertext, so re-uploads give the server no fresh noise to average away. A
            query's randomness comes from os.urandom, so equal queries do not repeat.
    stream  16-byte AES blocks read as little-endian u32 words w; uniforms (w + 0.5) / 2^32
            in (0, 1); Gaussians by Box-Muller.

The randomness is not numpy's Generator: numpy promises the same stream only on the same
build and machine, and R must be identical for every teammate and every later numpy, or
queries silently miss. AES and the transforms above are fixed; only floating-point
rounding (libm, BLAS) can differ between machines, around 1e-7 of s in the float32
output, far below the perturbation.

What the vectors leak: approximate distance comparisons, by design. For unit inputs the
ciphertext norm is about s, so s hides little; secrecy rests on R and lambda. A server
holding dim or more (plaintext, ciphertext) pairs, e.g. embeddings of files it can guess,
can fit R and recover the other embeddings to within the perturbation, a relative error
of about beta / 4: beta is the privacy/recall trade-off. Equal queries differ bit for bit
but land within s * beta / 2 of each other, so the server can still tell alike searches.
"""

from __future__ import annotations

import functools
import hmac
import math
import os
import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from indexer.location import ChunkLocation
from sync.crypto.keys import WorkspaceKey
from sync.errors import MetadataAuthError, MetadataFormatError
from sync.records import KEY_BYTES

__all__ = [
    "DEFAULT_BETA",
    "ENVELOPE_VERSION",
    "ChunkMeta",
    "VectorCipher",
    "chunk_id",
    "node_key",
    "node_value",
    "open_meta",
    "seal_meta",
]

ENVELOPE_VERSION = 1
NONCE_SIZE = 12
TAG_SIZE = 16
HASH_SIZE = 16  # xxh3-128 chunk hash
PAD_TO = 32

# Perturbation bound, in units of plaintext L2 distance between unit vectors (which lies
# in [0, 2]): every vector, stored or query, moves by at most beta / 4. Only server-search
# workspaces use it. The curve bench/privacy.py measures (requests + a private module, a
# server that knows the public code): with 100 known (plain, stored) pairs a Procrustes
# fit labels 99% of the rows at 1, 95% at 2, 68% at 4, 11% at 8, while the client's
# re-ranked top-10 keeps 100%, 100%, 97% and 65% of the plain one; an alignment with no
# known pair works up to 1 (99.7%) and fails from 2. A server that knows some of the code
# has known pairs, so below 8 no beta changes the verdict, and 8 costs a third of the
# recall: the protection against this server is sealed mode, not beta. So beta stays at
# the value the ranking was tuned for (the IVF probes of
# sync.store.embedded.vector_index, measured at 1: at 2 their recall against exact search
# falls below 0.95 in tests/test_store_index),
# where the encrypted top-10 holds 88% of the plain top-10 and the re-ranked top-50
# 99.98% (2,000 CoSQA functions, 500 queries).
DEFAULT_BETA = 1.0

_VERSION_BYTE = bytes([ENVELOPE_VERSION])
_META_HEADER = struct.Struct(">16sIIHHH")
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF

_TAG_ROTATION = b"\x01"
_TAG_SCALE = b"\x02"
_TAG_NOISE_KEY = b"\x03"
_TAG_NOISE_SEED = b"\x04"
_SEED_SIZE = 12
_BATCH_ROWS = 4096  # bounds the keystream buffer at about 6 MB for dim 384


# -- keyed names -----------------------------------------------------------------------


class _KeyState:
    """Pre-keyed HMACs and the AEAD of one key: keying once saves half of each call."""

    __slots__ = ("aead", "chunk", "path", "tree")

    def __init__(self, key: WorkspaceKey) -> None:
        self.path = hmac.new(key.path_key, digestmod="sha256")
        self.tree = hmac.new(key.tree_key, digestmod="sha256")
        self.chunk = hmac.new(key.chunk_key, digestmod="sha256")
        self.aead = AESGCM(key.meta_key)


# By id(key), a plain dict lookup: a WeakKeyDictionary costs more than the HMAC itself. The
# finalizer drops an entry when its key is collected, before the id can be reused.
_states: dict[int, _KeyState] = {}


def _state(key: WorkspaceKey) -> _KeyState:
    state = _states.get(id(key))
    if state is None:
        state = _states[id(key)] = _KeyState(key)
        weakref.finalize(key, _states.pop, id(key), None)
    return state


def _path_bytes(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def node_key(key: WorkspaceKey, path: str) -> bytes:
    """The server's name for the Merkle node of `path` (a file or directory; root is "")."""
    h = _state(key).path.copy()
    h.update(_path_bytes(path))
    return h.digest()[:KEY_BYTES]


def node_value(key: WorkspaceKey, path: str, digest: bytes) -> bytes:
    """The server's value for the Merkle node of `path` whose local digest is `digest`.

    Bound to the path: two files (or folders) with equal content get unrelated values,
    so a private copy of a public file does not show as a repeated value."""
    raw = _path_bytes(path)
    h = _state(key).tree.copy()
    h.update(len(raw).to_bytes(4, "big") + raw + digest)
    return h.digest()[:KEY_BYTES]


def page_value(key: WorkspaceKey, page_key: bytes) -> bytes:
    """The leaf value of the page whose (random) key is `page_key` (sync.crypto.pages): only
    the key's holder can compute it, so a client tells its workspace's pages among the
    leaves it does not know, and a page's value never changes (a page is never
    rewritten: a new one is made)."""
    h = _state(key).tree.copy()
    h.update(b"\xff\xff\xff\xffpage" + page_key)
    return h.digest()[:KEY_BYTES]


def chunk_id(key: WorkspaceKey, path: str, chunk_hash: bytes, ordinal: int) -> bytes:
    """The server's name for the `ordinal`-th chunk with hash `chunk_hash` in `path`."""
    raw = _path_bytes(path)
    if not 0 <= ordinal <= _U32_MAX:
        raise ValueError(f"chunk ordinal {ordinal} is out of range")
    h = _state(key).chunk.copy()
    h.update(
        len(raw).to_bytes(4, "big")
        + raw
        + len(chunk_hash).to_bytes(2, "big")
        + chunk_hash
        + ordinal.to_bytes(4, "big")
    )
    return h.digest()[:KEY_BYTES]


# -- metadata --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkMeta(ChunkLocation):
    """Where a chunk lives (indexer.location), as sealed for the server: what the client
    needs to show it. Its hash is required (16 bytes) and its lines fit the envelope."""

    def __post_init__(self) -> None:
        if len(self.chunk_hash) != HASH_SIZE:
            raise ValueError(f"chunk_hash is {len(self.chunk_hash)} bytes, not {HASH_SIZE}")
        for name in ("start_line", "end_line"):
            if not 0 <= getattr(self, name) <= _U32_MAX:
                raise ValueError(f"{name} {getattr(self, name)} is out of range")


def _aad(workspace_id: str, chunk: bytes) -> bytes:
    ws = workspace_id.encode("utf-8")
    return _VERSION_BYTE + len(ws).to_bytes(2, "big") + ws + chunk


def encode_meta(meta: ChunkMeta) -> bytes:
    path = _path_bytes(meta.path)
    symbol = meta.symbol.encode("utf-8", "surrogateescape")
    language = meta.language.encode("utf-8")
    for name, raw in (("path", path), ("symbol", symbol), ("language", language)):
        if len(raw) > _U16_MAX:
            raise ValueError(f"{name} of {meta.path!r} is {len(raw)} bytes, the limit is 65535")
    body = (
        _META_HEADER.pack(
            meta.chunk_hash,
            meta.start_line,
            meta.end_line,
            len(path),
            len(symbol),
            len(language),
        )
        + path
        + symbol
        + language
    )
    return body + bytes(-len(body) % PAD_TO)


def decode_meta(plain: bytes) -> ChunkMeta:
    if len(plain) < _META_HEADER.size:
        raise ValueError("shorter than its header")
    chunk_hash, start, end, n_path, n_symbol, n_language = _META_HEADER.unpack_from(plain)
    end_of_fields = _META_HEADER.size + n_path + n_symbol + n_language
    padding = plain[end_of_fields:]
    if end_of_fields > len(plain) or len(padding) >= PAD_TO or any(padding):
        raise ValueError("lengths do not match the plaintext")
    at = _META_HEADER.size
    path = plain[at : at + n_path].decode("utf-8", "surrogateescape")
    at += n_path
    symbol = plain[at : at + n_symbol].decode("utf-8", "surrogateescape")
    at += n_symbol
    language = plain[at : at + n_language].decode("utf-8")
    return ChunkMeta(path, start, end, symbol, language, chunk_hash)


def seal_meta(key: WorkspaceKey, workspace_id: str, chunk_id: bytes, meta: ChunkMeta) -> bytes:
    """Encrypt `meta` for the chunk `chunk_id` of `workspace_id` (format: module docstring)."""
    nonce = os.urandom(NONCE_SIZE)
    sealed = _state(key).aead.encrypt(nonce, encode_meta(meta), _aad(workspace_id, chunk_id))
    return _VERSION_BYTE + nonce + sealed


def open_meta(key: WorkspaceKey, workspace_id: str, chunk_id: bytes, blob: bytes) -> ChunkMeta:
    """Decrypt and check an envelope from `seal_meta` for the same workspace and chunk."""
    where = f"chunk {chunk_id.hex()} of workspace {workspace_id}"
    if len(blob) < 1 + NONCE_SIZE + TAG_SIZE:
        raise MetadataAuthError(f"the metadata of {where} is truncated ({len(blob)} bytes)")
    if blob[0] != ENVELOPE_VERSION:
        raise MetadataFormatError(
            f"the metadata of {where} has envelope version {blob[0]}; this codeveil reads "
            f"version {ENVELOPE_VERSION}: upgrade codeveil, or re-index if it was altered"
        )
    nonce = blob[1 : 1 + NONCE_SIZE]
    try:
        aad = _aad(workspace_id, chunk_id)
        plain = _state(key).aead.decrypt(nonce, blob[1 + NONCE_SIZE :], aad)
    except InvalidTag:
        raise MetadataAuthError(
            f"the metadata of {where} does not authenticate: the workspace key is wrong, or "
            "the store returned a record that was altered or belongs to another chunk"
        ) from None
    try:
        return decode_meta(plain)
    except (ValueError, struct.error) as exc:
        raise MetadataFormatError(f"the metadata of {where} is malformed ({exc})") from None


# -- vectors ---------------------------------------------------------------------------


def _stream_words(aes_key: bytes, seeds: Sequence[bytes], count: int) -> np.ndarray:
    """(len(seeds), count) u32 words; row i is AES(aes_key, seed_i || u32 j), j = 0, 1, ..."""
    n = len(seeds)
    blocks_per_row = -(-count // 4)  # four u32 words per 16-byte block
    blocks = np.empty((n, blocks_per_row, 16), dtype=np.uint8)
    blocks[:, :, :_SEED_SIZE] = np.frombuffer(b"".join(seeds), dtype=np.uint8).reshape(
        n, 1, _SEED_SIZE
    )
    counters = np.arange(blocks_per_row, dtype=">u4").view(np.uint8).reshape(blocks_per_row, 4)
    blocks[:, :, _SEED_SIZE:] = counters
    # ECB over distinct counter blocks is CTR mode with our own counter layout, which lets
    # one call serve every row, each row its own stream.
    encryptor = Cipher(algorithms.AES(aes_key), modes.ECB()).encryptor()
    stream = encryptor.update(blocks.tobytes()) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").reshape(n, blocks_per_row * 4)[:, :count]


def _uniforms64(words: np.ndarray) -> np.ndarray:
    return (words + 0.5) * 2.0**-32


def _uniforms32(words: np.ndarray) -> np.ndarray:
    # 24 bits, so every value is exact in float32 and lies strictly inside (0, 1).
    return ((words >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-24)


def _gaussians(u: np.ndarray) -> np.ndarray:
    """Box-Muller: an even number of uniform columns -> as many standard normal columns."""
    half = u.shape[1] // 2
    radius = np.sqrt(-2 * np.log(u[:, :half]))
    angle = u[:, half:] * (2 * np.pi)
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)


def _ball(aes_key: bytes, seeds: Sequence[bytes], dim: int, radius: float) -> np.ndarray:
    """(len(seeds), dim) float32: one point uniform in the dim-ball of `radius` per seed.

    float32 throughout: its vectorised log, cos and sin run about five times faster than
    float64's, and the noise needs no more precision than the float32 ciphertext has.
    """
    even = dim + (dim & 1)
    u = _uniforms32(_stream_words(aes_key, seeds, even + 1))
    direction = _gaussians(u[:, :even])[:, :dim]
    length = np.float32(radius) * u[:, even] ** np.float32(1.0 / dim)
    direction *= (length / np.linalg.norm(direction, axis=1))[:, None]
    return direction


def _orthogonal(gauss: np.ndarray) -> np.ndarray:
    """Q of the QR decomposition of a square matrix, signed so that R's diagonal is positive.

    Householder reflections in plain numpy rather than np.linalg.qr: LAPACK's blocked QR
    makes hundreds of calls into a threaded BLAS, whose threads spin against each other on
    a busy machine (5 s for dim 384 on two loaded cores, 0.03 s on idle ones); this loop
    takes about 0.1 s of CPU either way and agrees with LAPACK to 1e-14.
    """
    a = gauss.copy()
    d = a.shape[0]
    reflectors = []
    for j in range(d):
        v = a[j:, j].copy()
        v[0] += math.copysign(math.sqrt(np.einsum("i,i->", v, v)), v[0])
        v /= math.sqrt(np.einsum("i,i->", v, v))
        a[j:, j:] -= np.multiply.outer(2 * v, np.einsum("i,ij->j", v, a[j:, j:]))
        reflectors.append(v)
    q = np.eye(d)
    for j in range(d - 1, -1, -1):
        v = reflectors[j]
        q[j:, j:] -= np.multiply.outer(2 * v, np.einsum("i,ij->j", v, q[j:, j:]))
    return q * np.where(np.diag(a) < 0, -1.0, 1.0)


@functools.lru_cache(maxsize=8)
def _rotation(vector_key: bytes, dim: int) -> np.ndarray:
    """The secret dim x dim orthogonal matrix, float64, the same on every machine.

    Cached per key: building it costs ~0.2 s of CPU at dim 384, far more than a query,
    and every search and sync of a workspace needs the same matrix. Read-only, since the
    cached array is shared.
    """
    aes_key = hmac.digest(vector_key, _TAG_ROTATION + dim.to_bytes(4, "big"), "sha256")
    even = dim * dim + (dim * dim & 1)
    u = _uniforms64(_stream_words(aes_key, [bytes(_SEED_SIZE)], even))
    rotation = _orthogonal(_gaussians(u)[0, : dim * dim].reshape(dim, dim))
    rotation.setflags(write=False)
    return rotation


class VectorCipher:
    """Scale-and-perturb encryption of embedding vectors (format: module docstring).

    L2 distances between ciphertexts rank like distances between the plaintexts, up to
    the perturbation bound `beta`; the server ranks by L2 in encrypted space.
    """

    def __init__(self, key: WorkspaceKey, dim: int, beta: float = DEFAULT_BETA) -> None:
        if dim < 1:
            raise ValueError(f"dim must be positive, not {dim}")
        if not (beta >= 0 and math.isfinite(beta)):
            raise ValueError(f"beta must be finite and non-negative, not {beta}")
        self.dim = dim
        self.beta = float(beta)
        k_vector = key.vector_key
        u = int.from_bytes(hmac.digest(k_vector, _TAG_SCALE, "sha256")[:8], "big") / 2.0**64
        self.scale = 10.0 ** (3.0 + u)
        self.radius = self.scale * self.beta / 4.0
        self._k_vector = k_vector
        self._noise_key = hmac.digest(k_vector, _TAG_NOISE_KEY, "sha256")
        self._seed_mac = hmac.new(k_vector, _TAG_NOISE_SEED, digestmod="sha256")

    @functools.cached_property
    def _matrix(self) -> np.ndarray:
        # Made on first use: drawing the rotation takes 0.1 s, which a sync that sends
        # nothing need not pay. Rows are vectors, so c = v @ (s R)^T. float32: the
        # product's rounding (about 1e-6 relative) is far below any useful perturbation,
        # and it halves the time.
        return (self.scale * _rotation(self._k_vector, self.dim)).T.astype(np.float32)

    def _check(self, vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {vectors.shape}")
        return vectors.astype(np.float32, copy=False)

    def _seed(self, chunk: bytes) -> bytes:
        h = self._seed_mac.copy()
        h.update(chunk)
        return h.digest()[:_SEED_SIZE]

    def encrypt(self, vectors: np.ndarray, ids: Sequence[bytes]) -> np.ndarray:
        """Encrypt rows of `vectors` (n, dim); row i's perturbation is fixed by `ids[i]`."""
        plain = self._check(vectors)
        if len(ids) != len(plain):
            raise ValueError(f"{len(plain)} vectors but {len(ids)} chunk ids")
        out = np.empty((len(plain), self.dim), dtype=np.float32)
        for start in range(0, len(plain), _BATCH_ROWS):
            rows = slice(start, start + _BATCH_ROWS)
            seeds = [self._seed(c) for c in ids[rows]]
            noise = _ball(self._noise_key, seeds, self.dim, self.radius)
            out[rows] = plain[rows] @ self._matrix + noise
        return out

    def encrypt_query(self, vector: np.ndarray) -> np.ndarray:
        """Encrypt one query vector (dim,) with fresh randomness: equal queries differ."""
        plain = self._check(np.asarray(vector).reshape(1, -1))
        noise = _ball(os.urandom(32), [os.urandom(_SEED_SIZE)], self.dim, self.radius)
        return (plain @ self._matrix + noise)[0]

    def distance_to_cosine(self, d: float) -> float:
        """Estimate the cosine similarity of two unit vectors from their ciphertexts' L2 distance.

        E[d^2] = s^2 |x - y|^2 + 2 E|lambda|^2 with E|lambda|^2 = r^2 dim / (dim + 2) for
        r = s beta / 4, and cos = 1 - |x - y|^2 / 2.
        """
        noise_sq = 2.0 * self.radius**2 * self.dim / (self.dim + 2)
        plain_sq = max(0.0, (float(d) ** 2 - noise_sq) / self.scale**2)
        return max(-1.0, min(1.0, 1.0 - plain_sq / 2.0))
