"""Large arrays a derived index builds, kept out of the process's resident memory.

A derived index of a large repository (the vector base at 1M chunks is 3 GB; the BM25
postings there are ~800 MB) is built into file-backed maps instead of anonymous memory
(`spill_array`), and the pages a pass writes or reads are handed back to the kernel as
it goes (`release`): the process's resident memory stays at a slice's worth, whatever
the index's size.

The spill file lives beside the index (never in /tmp, often a RAM disk) and is unlinked
the moment it is mapped: the map keeps its data until the array is dropped, and a crash
leaves no file behind. Blocks are reserved up front (posix_fallocate), so a full disk is
an OSError here, answered by building in memory, never a SIGBUS on a write through the
map. Arrays under the caller's threshold stay in memory: a map costs a file and faults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("retrieval.indexes.derived")


def release(array: np.ndarray) -> bool:
    """Unmap the resident pages of the file `array` is mapped from (a `np.memmap`, or a
    view of one); whether it is mapped and the platform can. Its data is unchanged: the
    next read faults the page in again from the page cache."""
    # numpy keeps the mmap object a memmap (and each view of it) reads through here.
    mm = getattr(array, "_mmap", None)
    if not isinstance(mm, mmap.mmap) or not hasattr(mm, "madvise") \
            or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    try:
        mm.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):  # a closed map, or a kernel that refuses: only memory
        return False
    return True


def spill_array(directory: Path | None, shape: tuple[int, ...], dtype: np.dtype | type,
                *, min_bytes: int, prefix: str) -> np.ndarray:
    """An uninitialised array of `shape`: in memory when under `min_bytes` or when there
    is no `directory`, else mapped (read-write) from an unlinked file in `directory`
    whose name starts with `prefix`."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if directory is None or nbytes == 0 or nbytes < min_bytes:
        return np.empty(shape, dtype=dt)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    except OSError as exc:  # a read-only or odd folder: the build still answers
        log.info("building %d MB in memory: %s", nbytes >> 20, exc)
        return np.empty(shape, dtype=dt)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, nbytes)
        else:
            os.ftruncate(fd, nbytes)
        return np.memmap(name, dtype=dt, mode="r+", shape=shape)
    except OSError as exc:
        log.info("building %d MB in memory: %s", nbytes >> 20, exc)
        return np.empty(shape, dtype=dt)
    finally:
        os.close(fd)
        os.unlink(name)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's `malloc_trim`), where
    there is one: a refresh's transient arrays are freed to the heap, which glibc keeps
    mapped, so a long-lived process (the daemon, a join) would hold its peak for good
    (measured on a 30k-chunk join: 30-60 MB after each refresh). A no-op elsewhere."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim: Any = None
