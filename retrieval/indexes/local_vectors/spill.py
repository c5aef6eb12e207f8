"""Building and saving a large base without holding it in memory.

A base of 1M chunks is 3 GB of float32 (two planes of 384 dims); gathered in parts and
concatenated, a build held it twice, and saving it through `np.ascontiguousarray` could
copy it once more. Here a new base is written into a file-backed map (`spill_planes`)
whose pages are handed back to the kernel as they fill (`retrieval.indexes.local_vectors.mapped`),
and a base is saved in slices (`save_planes`), its checksum taken on the way: the
process's resident memory stays at a slice's worth, whatever the base's size.

The spill file (`retrieval.indexes.derived.spill`, which the lexical and grep indexes use too)
lives beside the index and is unlinked the moment it is mapped: a crash leaves no file
behind. Small bases (under `SPILL_MIN_BYTES`) stay in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Final

import numpy as np
import xxhash

from retrieval.indexes.derived.spill import release, spill_array

#: Bases smaller than this are built in memory: a map costs a file and page faults.
SPILL_MIN_BYTES: Final = 64 << 20
#: Rows copied (and pages released) at a time: 16k rows of 384 float32 are 24 MB.
SLICE_ROWS: Final = 16_384
TEMP_PREFIX: Final = ".vec-spill-"


def spill_planes(directory: Path | None, rows: int, dim: int) -> np.ndarray:
    """An uninitialised float32 [2, rows, dim] array: in memory when small or when there
    is no `directory`, else mapped from an unlinked file in `directory`
    (`retrieval.indexes.derived.spill`)."""
    return spill_array(directory, (2, rows, dim), np.float32, min_bytes=SPILL_MIN_BYTES,
                       prefix=TEMP_PREFIX)


def copy_rows(out: np.ndarray, plane: int, at: int, rows: np.ndarray) -> None:
    """`out[plane, at:at + len(rows)] = rows`, handing the written pages back when `out`
    is mapped (they stay in the file)."""
    out[plane, at:at + len(rows)] = rows
    release(out)


def take_rows(out: np.ndarray, source: np.ndarray, picked: np.ndarray, at: int = 0) -> None:
    """`out[:, at:at + len(picked)] = source[:, picked]`, a slice at a time, so that
    neither a mapped source nor a mapped `out` piles up in memory."""
    for start in range(0, len(picked), SLICE_ROWS):
        part = picked[start:start + SLICE_ROWS]
        for plane in range(2):
            out[plane, at + start:at + start + len(part)] = source[plane, part]
        release(source)
        release(out)


def save_planes(f: IO[bytes], planes: np.ndarray) -> int:
    """Write float32 [2, rows, dim] `planes` to `f` as an .npy file, a slice at a time;
    returns the xxh3-64 of the array's bytes (the checksum a loaded base is held to)."""
    shape = tuple(int(s) for s in planes.shape)
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
            "fortran_order": False, "shape": shape})
    digest = xxhash.xxh3_64()
    for plane in range(shape[0]):
        for start in range(0, shape[1], SLICE_ROWS):
            part = np.ascontiguousarray(planes[plane, start:start + SLICE_ROWS],
                                        dtype=np.float32)
            data = part.reshape(-1).view(np.uint8).data
            digest.update(data)
            f.write(data)
            release(planes)
    return digest.intdigest()
