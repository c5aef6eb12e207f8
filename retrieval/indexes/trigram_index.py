"""The grep index: which files hold which trigrams, under `.codeveil/trigrams/`, kept in
step with the chunk table.

Postings are (trigram, file) pairs sorted by trigram, so the files of one trigram are
one slice found by binary search. Like the lexical index (retrieval.indexes.lexical.store), the
index is a large *base* (`base-ID.codes.npy`, `base-ID.files.npy`, memory-mapped) and a
small *delta* for the files that changed since the base was built, with a mask of the
base's files that are gone or changed (`state.npz`, which also holds the base's ID, the
xxh3-64 of each base file's data, the file list, each file's content digest and the
chunk table's change stamp it was built at). A new base is written under a new ID before
the state that names it, and the old one removed after: a crash between leaves the old
state with its own base. A refresh
(`retrieval.indexes.derived.store`) reads only the chunks of the files whose digest changed;
when the delta outgrows MERGE_SHARE of the base the two are merged with numpy, without
reading chunks again. Both, and a rebuild, run in bounded memory
(`retrieval.indexes.trigram_postings`): a rebuild keeps trigram sets, not texts, and sorts them
in runs; a merge goes a code range at a time; large arrays live in spill files.

The index checks itself when a process first opens it: the base files' data against
the checksums the state holds (plain reads, which leave no page mapped: 200 MB in 0.075 s
from the page cache here, so ~0.25 s for the ~85M postings of 1M chunks), the state's
members by their zip CRCs, and the delta's file ids against the file list. A damaged,
truncated, missing or swapped file (another checkout's base under this one's name) is
rebuilt from the chunk table with one warning, never used: a base with other valid ids
in it would give other grep lines without a word, a garbled one an IndexError.
`TrigramStore.problem` tells `codeveil doctor` the same.

It holds trigrams of code, so, like the chunk table it is built from, it never leaves
this machine.
"""

from __future__ import annotations

import itertools
import logging
import operator
import re
import sqlite3
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

from indexer.private_files import write_atomic
from indexer.trigrams import text_trigrams
from retrieval.indexes.derived.columns import digest_rows, pack, unpack
from retrieval.indexes.derived.npz import read_npy_checked, write_npy
from retrieval.indexes.derived.store import (
    UNREADABLE,
    DerivedStore,
    FileDiff,
    Saved,
    Stamp,
    chunk_rows,
    read_stamp,
)
from retrieval.indexes.trigram_postings import PostingsWriter, merge_runs

log = logging.getLogger(__name__)

FORMAT_VERSION: Final = 2  # 2: the base files' checksums in the state
MERGE_SHARE: Final = 0.25
"""The delta is merged into the base once it holds this share of the base's postings."""
REBUILD_SHARE: Final = 0.5
"""A refresh that would read more than this share of the files rebuilds from scratch."""

_STATE: Final = "state.npz"
_BASE_NAME = re.compile(r"^base-([0-9a-f]{16})\.(codes|files)\.npy$")


@dataclass
class _Read:
    """What a refresh reads: the files (in the order of their ids, from 0), their
    trigram postings, and every covered file's digest."""

    paths: list[str]
    postings: tuple[np.ndarray, np.ndarray]
    files: dict[str, bytes]


def _base_files(directory: Path, base_id: bytes) -> tuple[Path, Path]:
    return (directory / f"base-{base_id.hex()}.codes.npy",
            directory / f"base-{base_id.hex()}.files.npy")


@dataclass
class TrigramIndex:
    """Postings of base and delta, and the files they name (file id = position)."""

    paths: list[str]
    digests: list[bytes]
    alive: np.ndarray  # bool per file id: False for a file gone or superseded
    base_codes: np.ndarray  # uint32, sorted
    base_files: np.ndarray  # uint32 file ids, aligned with base_codes
    delta_codes: np.ndarray
    delta_files: np.ndarray
    stamp: Stamp
    base_id: bytes
    _live: dict[str, int] | None = field(default=None, repr=False, compare=False)
    #: Where a merge builds a large base (retrieval.indexes.trigram_postings); None: in memory.
    spill: Path | None = field(default=None, repr=False, compare=False)
    #: xxh3-64 of the saved base's codes and files; None until the base is written.
    base_sums: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    def files_with(self, code: int) -> np.ndarray:
        """Sorted ids of the live files holding trigram `code`."""
        parts = []
        # Bounds of the array's own dtype: a Python int list would make numpy cast the
        # whole (memory-mapped) array to int64 for every lookup.
        bounds = np.array([code, code + 1], dtype=np.uint32)
        for codes, files in ((self.base_codes, self.base_files),
                             (self.delta_codes, self.delta_files)):
            lo, hi = np.searchsorted(codes, bounds)
            if hi > lo:
                parts.append(np.asarray(files[lo:hi]))
        if not parts:
            return np.zeros(0, dtype=np.uint32)
        ids = np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0]
        return ids[self.alive[ids]]

    def live_paths(self) -> dict[str, int]:
        """path -> file id of every file the index holds (computed once; the index is
        never changed in place)."""
        if self._live is None:
            self._live = {p: i for i, p in enumerate(self.paths) if self.alive[i]}
        return self._live

    @property
    def postings(self) -> int:
        return int(len(self.base_codes) + len(self.delta_codes))

    def size_bytes(self) -> int:
        return int(self.base_codes.nbytes + self.base_files.nbytes + self.delta_codes.nbytes
                   + self.delta_files.nbytes)

    def needs_merge(self) -> bool:
        return len(self.delta_codes) > MERGE_SHARE * max(len(self.base_codes), 1)

    def merged(self) -> TrigramIndex:
        """Base and delta as one base, dead files dropped and ids renumbered."""
        live = np.flatnonzero(self.alive)
        renumber = np.full(len(self.alive), -1, dtype=np.int64)
        renumber[live] = np.arange(len(live))
        codes, owners = merge_runs([(self.base_codes, self.base_files),
                                    (self.delta_codes, self.delta_files)],
                                   alive=self.alive, renumber=renumber, spill=self.spill)
        return TrigramIndex([self.paths[i] for i in live], [self.digests[i] for i in live],
                            np.ones(len(live), dtype=bool), codes, owners,
                            np.zeros(0, np.uint32), np.zeros(0, np.uint32), self.stamp,
                            self.base_id, spill=self.spill)


class TrigramStore(DerivedStore[TrigramIndex, _Read]):
    """The grep index of one repo, under `directory`, kept current with the chunk table:
    `current(db)` as `retrieval.indexes.lexical.LexicalStore.current`. Thread-safe."""

    label = "grep index"
    log = log

    def current(self, db: sqlite3.Connection) -> TrigramIndex:
        return self._current(db)

    # -- what the refresh reads and builds ------------------------------------------

    def read_stamp(self, db: sqlite3.Connection) -> Stamp:
        return read_stamp(db)

    def _rebuilds(self, reader: sqlite3.Connection, changed: list[str],
                  files: dict[str, bytes]) -> bool:
        return len(changed) > REBUILD_SHARE * max(len(files), 1)

    def _read_rows(self, reader: sqlite3.Connection, diff: FileDiff,
                   key: Hashable) -> tuple[_Read, dict[str, int]]:
        # A file of blank lines has no chunk, and is still a file of the index.
        paths = sorted(diff.files if diff.to_read is None else diff.to_read)
        ids = {p: i for i, p in enumerate(paths)}
        writer = PostingsWriter(self.directory)
        # One file's texts at a time (rows come grouped by path): only its trigram set
        # is kept (retrieval.indexes.trigram_postings).
        for path, rows in itertools.groupby(
                chunk_rows(reader, "path, text", diff.to_read, order="path, ordinal"),
                key=operator.itemgetter(0)):
            if path in ids:
                writer.add(ids[path], text_trigrams(text for _, text in rows))
        return _Read(paths, writer.finish(), diff.files), {}

    def _build(self, rows: _Read, key: Hashable, missing: int) -> TrigramIndex:
        codes, owners = rows.postings
        return TrigramIndex(rows.paths, [rows.files[p] for p in rows.paths],
                            np.ones(len(rows.paths), dtype=bool), codes, owners,
                            np.zeros(0, np.uint32), np.zeros(0, np.uint32), (0, 0, b""), b"",
                            spill=self.directory)

    def _update(self, index: TrigramIndex, drop: set[str], rows: _Read, key: Hashable,
                missing: int) -> TrigramIndex:
        """`index` with the changed files' postings in the delta, and files gone or
        changed masked."""
        alive = index.alive.copy()
        for path, fid in index.live_paths().items():
            if path in drop:
                alive[fid] = False
        first = len(index.paths)
        paths = [*index.paths, *rows.paths]
        digests = [*index.digests, *(rows.files[p] for p in rows.paths)]
        alive = np.concatenate([alive, np.ones(len(rows.paths), dtype=bool)])
        codes, owners = rows.postings
        delta_codes, delta_files = merge_runs([
            (index.delta_codes, index.delta_files),
            (np.asarray(codes), (np.asarray(owners) + first).astype(np.uint32))])
        return TrigramIndex(paths, digests, alive, index.base_codes, index.base_files,
                            delta_codes, delta_files, index.stamp, index.base_id,
                            spill=self.directory, base_sums=index.base_sums)

    def _saved_of(self, index: TrigramIndex, stamp: Hashable, files: dict[str, bytes],
                  base_id: bytes, key: Hashable, incomplete: dict[str, int],
                  ) -> Saved[TrigramIndex]:
        # The index carries its stamp and base id itself (the state file holds them).
        index = replace(index, stamp=stamp, base_id=base_id,  # type: ignore[arg-type]
                        _live=None)
        return Saved(index, stamp, files, base_id, key, incomplete)

    def _report(self, saved: Saved[TrigramIndex], mode: str, rows: _Read) -> dict[str, Any]:
        return {"mode": mode, "files": len(saved.files), "read": len(rows.paths)}

    # -- disk -----------------------------------------------------------------------

    def problem(self) -> str | None:
        """What is wrong with the saved index, if its files exist but cannot be used
        (`codeveil doctor`); None when they are fine, absent (the next grep builds it)
        or of an older format (replaced as a matter of course)."""
        if not (self.directory / _STATE).exists():
            return None
        try:
            self._read_saved(None)
        except FileNotFoundError as exc:
            return f"its base is missing ({exc.filename or exc})"
        except UNREADABLE as exc:
            return str(exc) or type(exc).__name__
        return None

    def _read_saved(self, key: Hashable) -> Saved[TrigramIndex] | None:
        with np.load(self.directory / _STATE, allow_pickle=False) as z:
            state = {k: z[k] for k in z.files}  # each member read whole: its CRC checked
        if int(state["version"][0]) != FORMAT_VERSION:
            return None
        base_id = state["base_id"].tobytes()
        sums = (int(state["base_xxh3"][0]), int(state["base_xxh3"][1]))
        codes_file, files_file = _base_files(self.directory, base_id)
        codes = read_npy_checked(codes_file, np.dtype(np.uint32), sums[0])
        files = read_npy_checked(files_file, np.dtype(np.uint32), sums[1])
        paths = unpack(state["paths"])
        digests = [row.tobytes() for row in state["digests"]]
        alive = state["alive"].astype(bool)
        delta_codes, delta_files = state["delta_codes"], state["delta_files"]
        if not len(codes) == len(files) == int(state["base_len"][0]):
            raise ValueError(f"{codes_file.name} and {files_file.name} are not of the"
                             " length the grep index's state gives")
        if not len(paths) == len(digests) == len(alive) \
                or len(delta_codes) != len(delta_files) \
                or (len(delta_files) and int(delta_files.max()) >= len(paths)):
            raise ValueError(f"{self.directory / _STATE} is inconsistent")
        stamp = (int(state["stamp"][0]), int(state["stamp"][1]), state["epoch"].tobytes())
        index = TrigramIndex(paths, digests, alive, codes, files, delta_codes, delta_files,
                             stamp, base_id, spill=self.directory, base_sums=sums)
        held = {p: digests[i] for p, i in index.live_paths().items()}
        return Saved(index, stamp, held, index.base_id)

    def _write(self, saved: Saved[TrigramIndex], old: Saved[TrigramIndex] | None, *,
               base_changed: bool) -> None:
        index = saved.index
        self.directory.mkdir(parents=True, exist_ok=True)
        # A base never saved (its first save failed: a full disk) is written now.
        if base_changed or index.base_sums is None:
            current = _base_files(self.directory, index.base_id)
            sums = []
            for name, array in zip(current, (index.base_codes, index.base_files), strict=True):
                write = _NpyWriter(array)
                write_atomic(name, write)
                sums.append(write.checksum)
            index.base_sums = (sums[0], sums[1])
            if isinstance(index.base_codes, np.memmap):
                # Built in a spill file: read from the saved one instead, so that the
                # base is on disk once for as long as this process holds it.
                index.base_codes, index.base_files = (
                    np.load(f, mmap_mode="r", allow_pickle=False) for f in current)
        assert index.base_sums is not None  # written above
        arrays = {
            "version": np.array([FORMAT_VERSION]),
            "base_id": np.frombuffer(index.base_id, dtype=np.uint8),
            "base_xxh3": np.array(index.base_sums, dtype=np.uint64),
            "base_len": np.array([len(index.base_codes)], dtype=np.int64),
            "paths": pack(index.paths),
            "digests": digest_rows(index.digests),
            "alive": index.alive,
            "delta_codes": index.delta_codes,
            "delta_files": index.delta_files,
            "stamp": np.array(index.stamp[:2], dtype=np.int64),
            "epoch": np.frombuffer(index.stamp[2], dtype=np.uint8),
        }
        write_atomic(self.directory / _STATE, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
        if base_changed:
            self.remove_old_bases(_BASE_NAME, index.base_id,
                                  old.base_id if old is not None else None)


class _NpyWriter:
    """Writes `array` as an .npy file a slice at a time (a mapped base is not read
    whole), keeping the checksum of its data."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.checksum = 0

    def __call__(self, f: IO[bytes]) -> None:
        self.checksum = write_npy(f, self.array)

