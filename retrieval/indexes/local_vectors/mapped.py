"""Keeping a memory-mapped base's pages out of the search process's resident memory.

A page of the mapped base that a search reads stays mapped into the process, and counts
in its RSS, until the kernel wants the memory back: clean file pages, reclaimable, but a
1M-chunk base (3 GB, two planes) shows as that much resident after one pass over it.
Exact search reads every page on every query, so there that is the price of the scan.
The approximate index reads sparsely (a few hundred rows a query, re-ranked) and its
background build reads each page once: those pages are handed back (`madvise` with
MADV_DONTNEED), the re-rank's every `GATHER_ROWS` rows (`gather_rows`), the build's
every `RELEASE_ROWS`. They stay in the page cache, so
the next read of one is a minor fault, not a disk read; the process's RSS stays at what
the IVF codes and the chunk metadata need (measured by `bench/approx_vectors.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import xxhash

from retrieval.indexes.derived.spill import release

__all__ = ["GATHER_ROWS", "RELEASE_ROWS", "file_checksum", "gather_rows", "release"]

#: Rows read through the map between two releases. A fault on a file mapping maps the
#: pages around it too (Linux's fault-around, 64 KB), so a row read at random leaves up
#: to 64 KB resident: 1,024 rows, at most ~64 MB. Measured at 1M chunks, 16,384 rows let
#: 1.7 GB of the base pile up between releases.
RELEASE_ROWS: Final = 1024
_READ_BYTES: Final = 1 << 24


#: Rows gathered between two hand-backs within one read (`gather_rows`). The page cache
#: may hold a file in large folios, and a fault maps the whole folio, far more than
#: fault-around's 64 KB: measured at 1M, one re-rank of 1,000 header rows read in one go
#: left 200-450 MB mapped, and the searcher peaked at 1.2 GB; 128 rows at a time, 373 MB.
GATHER_ROWS: Final = 128


def gather_rows(plane: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`plane[rows]` (float32 [len(rows), dim]); from a mapped plane a few rows at a
    time, its pages handed back after each, so that one read never piles them up."""
    if getattr(plane, "_mmap", None) is None or len(rows) <= GATHER_ROWS:
        out = np.asarray(plane[rows], dtype=np.float32)
        release(plane)
        return out
    out = np.empty((len(rows), plane.shape[1]), dtype=np.float32)
    for at in range(0, len(rows), GATHER_ROWS):
        out[at:at + GATHER_ROWS] = plane[rows[at:at + GATHER_ROWS]]
        release(plane)
    return out


def file_checksum(path: Path, offset: int) -> int:
    """xxh3-64 of the bytes of `path` from `offset` on, read with plain reads: checking a
    mapped base this way leaves none of its pages mapped into the process (it equals
    `xxh3_64_intdigest` of those bytes in one piece)."""
    digest = xxhash.xxh3_64()
    buf = bytearray(_READ_BYTES)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        f.seek(offset)
        while got := f.readinto(buf):
            digest.update(view[:got])
    return digest.intdigest()

