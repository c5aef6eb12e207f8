"""Sealed rows: what a sealed workspace's server stores per chunk, and what it cannot do
with them (open, move, alter)."""

from __future__ import annotations

import numpy as np
import pytest

from sync.crypto.ciphers import ChunkMeta, seal_meta
from sync.crypto.keys import WorkspaceKey
from sync.crypto.sealed_rows import (
    META_BUCKETS,
    ROW_BUCKETS,
    RowSealer,
    new_row_id,
    padded_row_count,
)
from sync.errors import MetadataAuthError, MetadataFormatError

KEY = WorkspaceKey(bytes(range(32)))
OTHER = WorkspaceKey(bytes(range(1, 33)))
DIM = 384
META = ChunkMeta("src/payments/ledger.py", 10, 42, "class Ledger > def post", "python",
                 bytes(range(16)))
FILE = bytes(16)


def _vector(seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def test_a_row_opens_to_its_metadata_and_vector() -> None:
    sealer, rid, vec = RowSealer(KEY, "ws", DIM), new_row_id(), _vector()
    opened = sealer.open(rid, FILE, sealer.seal(rid, FILE, META, vec))
    assert opened.meta == META
    assert opened.vector.dtype == np.float32
    assert float(opened.vector @ vec) > 0.99999
    assert np.max(np.abs(opened.vector - vec)) < 1e-3  # float16


def test_row_ids_are_random_and_sealing_twice_differs() -> None:
    sealer = RowSealer(KEY, "ws", DIM)
    assert len({new_row_id() for _ in range(1000)}) == 1000
    rid = new_row_id()
    assert sealer.seal(rid, FILE, META, _vector()) != sealer.seal(rid, FILE, META, _vector())


def test_the_plaintext_is_nowhere_in_the_row() -> None:
    sealer, rid, vec = RowSealer(KEY, "ws", DIM), new_row_id(), _vector()
    blob = sealer.seal(rid, FILE, META, vec)
    for plain in (b"ledger", b"Ledger", vec.astype("<f2").tobytes()[:8], META.chunk_hash):
        assert plain not in blob


@pytest.mark.parametrize("where", ["row id", "file", "workspace", "key"])
def test_a_row_moved_or_opened_elsewhere_fails(where: str) -> None:
    rid = new_row_id()
    blob = RowSealer(KEY, "ws", DIM).seal(rid, FILE, META, _vector())
    sealer, row, file = RowSealer(KEY, "ws", DIM), rid, FILE
    if where == "row id":
        row = new_row_id()
    elif where == "file":
        file = bytes([1]) * 16
    elif where == "workspace":
        sealer = RowSealer(KEY, "ws2", DIM)
    else:
        sealer = RowSealer(OTHER, "ws", DIM)
    with pytest.raises(MetadataAuthError):
        sealer.open(row, file, blob)


def test_an_altered_or_truncated_row_fails() -> None:
    sealer, rid = RowSealer(KEY, "ws", DIM), new_row_id()
    blob = bytearray(sealer.seal(rid, FILE, META, _vector()))
    blob[40] ^= 1
    with pytest.raises(MetadataAuthError):
        sealer.open(rid, FILE, bytes(blob))
    with pytest.raises(MetadataAuthError):
        sealer.open(rid, FILE, bytes(blob[:20]))


def test_a_metadata_envelope_is_not_taken_for_a_row() -> None:
    rid = new_row_id()
    with pytest.raises(MetadataFormatError, match="not a sealed row"):
        RowSealer(KEY, "ws", DIM).open(rid, FILE, seal_meta(KEY, "ws", rid, META))


def test_a_row_of_another_dimension_is_refused() -> None:
    rid = new_row_id()
    blob = RowSealer(KEY, "ws", 8).seal(rid, FILE, META, np.ones(8, np.float32) / 8**0.5)
    with pytest.raises(MetadataFormatError, match="8 values"):
        RowSealer(KEY, "ws", DIM).open(rid, FILE, blob)
    with pytest.raises(ValueError, match="384"):
        RowSealer(KEY, "ws", DIM).seal(rid, FILE, META, np.ones(8, np.float32))


# -- padding: lengths and rows per file --------------------------------------------------

_ENVELOPE = 1 + 12 + 16 + 2 + 2 * DIM  # version, nonce, tag, dim, float16 vector


def _meta(path: str, symbol: str = "def f") -> ChunkMeta:
    return ChunkMeta(path, 1, 2, symbol, "python", bytes(16))


def test_envelopes_fall_in_a_few_wide_buckets() -> None:
    sealer = RowSealer(KEY, "ws", DIM)
    lengths = {len(sealer.seal(new_row_id(), FILE, _meta("a" * n, "s" * (n // 2)), _vector()))
               for n in range(1, 80, 3)}
    # Paths of 1 to 80 bytes: one length (it moved every 32 bytes before).
    assert lengths == {_ENVELOPE + META_BUCKETS[0]}
    long_one = sealer.seal(new_row_id(), FILE, _meta("p/" * 300), _vector())
    assert len(long_one) - _ENVELOPE in META_BUCKETS[1:]


def test_a_padding_row_looks_like_a_chunk_row_and_opens_to_nothing() -> None:
    sealer, rid = RowSealer(KEY, "ws", DIM), new_row_id()
    padding = sealer.seal_padding(rid, FILE)
    assert len(padding) == len(sealer.seal(new_row_id(), FILE, META, _vector()))
    assert sealer.open(rid, FILE, padding) is None
    with pytest.raises(MetadataAuthError):  # bound to its file like any row
        sealer.open(rid, bytes([1]) * 16, padding)


def test_rows_per_file_are_padded_to_buckets_of_at_most_one_and_a_half() -> None:
    counts = [padded_row_count(n) for n in range(0, 2000)]
    assert counts[0] == 1 and counts == sorted(counts)
    assert all(c >= max(n, 1) for n, c in enumerate(counts))
    assert all(c <= 1.5 * n for n, c in enumerate(counts) if n >= 2)
    assert set(counts[:513]) == set(ROW_BUCKETS)


def test_a_row_from_before_padding_still_opens() -> None:
    # Version 2: u16 dim || float16 vector || metadata, no length prefix, no padding.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from sync.crypto.ciphers import encode_meta

    rid, vec, nonce = new_row_id(), _vector(), bytes(12)
    plain = DIM.to_bytes(2, "little") + vec.astype("<f2").tobytes() + encode_meta(META)
    aad = b"\x02" + (2).to_bytes(2, "big") + b"ws" + rid + FILE
    blob = b"\x02" + nonce + AESGCM(KEY.row_key).encrypt(nonce, plain, aad)
    opened = RowSealer(KEY, "ws", DIM).open(rid, FILE, blob)
    assert opened is not None and opened.meta == META
