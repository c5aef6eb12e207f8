"""Sealed rows: what a sealed workspace's server stores per chunk, and what it cannot do
with them (open, move, alter)."""

from __future__ import annotations

import numpy as np
import pytest

from sync.crypto import ChunkMeta, seal_meta
from sync.errors import MetadataAuthError, MetadataFormatError
from sync.keys import WorkspaceKey
from sync.sealed_rows import RowSealer, new_row_id

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
