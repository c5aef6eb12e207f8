"""The grep index's postings built and merged in bounded memory.

Postings are (trigram code, file id) pairs sorted by code, then file. A rebuild used to
read every chunk's text into memory and sort all postings at once, and a merge sorted
base and delta together: at 1M chunks (~170k files, ~85M postings) that is GBs of text
and ~40 bytes of sort copies per posting. Here:

- `PostingsWriter` takes each file's trigram set as its chunks are read (the texts go as
  soon as the set is taken) and keeps sorted runs of at most `RUN_POSTINGS`, spilled to
  a file beside the index when large (`retrieval.indexes.derived.spill`);
- `merge_runs` merges runs a code range at a time (ranges cut at quantiles of a sample
  of the codes, which are far from uniform: ASCII), dropping dead files and renumbering
  the rest on the way, into arrays mapped from a spill file when large, their pages
  handed back after each part.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np

from retrieval.indexes.derived.spill import release, spill_array

#: Postings held in memory before they are sorted into a run (8 bytes each).
RUN_POSTINGS: Final = 4 << 20
#: Postings a merge handles at once (~30 bytes each of transient memory).
PART_POSTINGS: Final = 2 << 20
#: Arrays at least this large are built in a spill file, not in memory.
SPILL_MIN_BYTES: Final = 8 << 20
TEMP_PREFIX: Final = ".tri-spill-"

Run = tuple[np.ndarray, np.ndarray]  # (codes uint32, file ids uint32), sorted by both


def postings(per_file: Sequence[np.ndarray], ids: Sequence[int] | np.ndarray) -> Run:
    """The run of files' trigram sets (`per_file[i]` of file `ids[i]`)."""
    if not len(per_file):
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32)
    codes = np.concatenate(per_file).astype(np.uint32)
    owners = np.repeat(np.asarray(ids, dtype=np.uint32), [len(c) for c in per_file])
    order = np.lexsort((owners, codes))
    return codes[order], owners[order]


class PostingsWriter:
    """Files' trigram sets in (`add`), the merged postings out (`finish`)."""

    def __init__(self, spill: Path | None = None) -> None:
        self.spill = spill
        self._runs: list[Run] = []
        self._sets: list[np.ndarray] = []
        self._ids: list[int] = []
        self._held = 0

    def add(self, file_id: int, trigrams: np.ndarray) -> None:
        self._sets.append(trigrams)
        self._ids.append(file_id)
        self._held += len(trigrams)
        if self._held >= RUN_POSTINGS:
            self._flush()

    def finish(self) -> Run:
        """Every file's postings, as one sorted run."""
        self._flush()
        if len(self._runs) == 1:
            return self._runs[0]
        return merge_runs(self._runs, spill=self.spill)

    def _flush(self) -> None:
        if not self._sets:
            return
        run = postings(self._sets, self._ids)
        self._sets, self._ids, self._held = [], [], 0
        spilled = (_alloc(self.spill, len(run[0])), _alloc(self.spill, len(run[0])))
        if isinstance(spilled[0], np.memmap):  # large: held in a spill file, not memory
            for a, b in zip(spilled, run, strict=True):
                a[:] = b
                release(a)
            run = spilled
        self._runs.append(run)


def merge_runs(runs: Sequence[Run], *, alive: np.ndarray | None = None,
               renumber: np.ndarray | None = None, spill: Path | None = None) -> Run:
    """One sorted run of `runs`' postings; with `alive` (per file id) only those of live
    files, their ids mapped through `renumber`."""
    if not runs:  # no file holds a trigram
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32)
    total = sum(_kept(owners, alive) for _, owners in runs)
    out_codes, out_files = _alloc(spill, total), _alloc(spill, total)
    cuts = _cuts(runs, max(1, -(-sum(len(c) for c, _ in runs) // PART_POSTINGS)))
    at = 0
    for lo, hi in itertools.pairwise(cuts):
        cs, fs = [], []
        for codes, owners in runs:
            # Bounds of the array's own dtype (an int64 one would make numpy cast the
            # whole mapped array); the last range runs to the end.
            a = int(np.searchsorted(codes, np.uint32(lo)))
            b = len(codes) if hi >= 1 << 32 else int(np.searchsorted(codes, np.uint32(hi)))
            c, f = np.asarray(codes[a:b]), np.asarray(owners[a:b])
            release(codes)
            release(owners)
            if alive is not None:
                keep = alive[f]
                c, f = c[keep], f[keep]
            if renumber is not None:
                f = renumber[f].astype(np.uint32)
            cs.append(c)
            fs.append(f)
        c, f = np.concatenate(cs), np.concatenate(fs)
        order = np.lexsort((f, c))
        out_codes[at : at + len(c)] = c[order]
        out_files[at : at + len(c)] = f[order]
        release(out_codes)
        release(out_files)
        at += len(c)
    assert at == total, (at, total)
    return out_codes, out_files


def _alloc(spill: Path | None, n: int) -> np.ndarray:
    return spill_array(spill, (n,), np.uint32, min_bytes=SPILL_MIN_BYTES, prefix=TEMP_PREFIX)


def _kept(owners: np.ndarray, alive: np.ndarray | None) -> int:
    if alive is None:
        return len(owners)
    total = 0
    for at in range(0, len(owners), PART_POSTINGS):
        total += int(np.count_nonzero(alive[owners[at : at + PART_POSTINGS]]))
        release(owners)
    return total


def _cuts(runs: Sequence[Run], parts: int) -> list[int]:
    """Code boundaries [0, ..., 2**32) cutting the postings into about `parts` parts."""
    if parts <= 1:
        return [0, 1 << 32]
    sample = np.concatenate([np.asarray(codes[:: max(1, len(codes) // 4096)])
                             for codes, _ in runs if len(codes)])
    inner = np.unique(np.quantile(sample, np.linspace(0, 1, parts + 1)[1:-1])
                      .astype(np.int64)) + 1
    return [0, *inner.tolist(), 1 << 32]
