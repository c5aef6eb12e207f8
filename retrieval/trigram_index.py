"""The grep index: which files hold which trigrams, under `.codeveil/trigrams/`, kept in
step with the chunk table.

Postings are (trigram, file) pairs sorted by trigram, so the files of one trigram are
one slice found by binary search. Like the lexical index (retrieval.lexical.store), the
index is a large *base* (`base-ID.codes.npy`, `base-ID.files.npy`, memory-mapped) and a
small *delta* for the files that changed since the base was built, with a mask of the
base's files that are gone or changed (`state.npz`, which also holds the base's ID, the
file list, each file's content digest and the chunk table's change stamp it was built
at). A new base is written under a new ID before the state that names it, and the old
one removed after: a crash between leaves the old state with its own base. A refresh reads
only the chunks of the files whose digest changed; when the delta outgrows
MERGE_SHARE of the base the two are merged with numpy, without reading chunks again.

It holds trigrams of code, so, like the chunk table it is built from, it never leaves
this machine.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import numpy as np

from indexer.local_chunks import SQL_BATCH, snapshot_reader
from indexer.private_files import write_atomic
from indexer.trigrams import text_trigrams
from retrieval.lexical.store import Stamp, read_stamp

log = logging.getLogger(__name__)

FORMAT_VERSION: Final = 1
MERGE_SHARE: Final = 0.25
"""The delta is merged into the base once it holds this share of the base's postings."""
REBUILD_SHARE: Final = 0.5
"""A refresh that would read more than this share of the files rebuilds from scratch."""

_STATE: Final = "state.npz"


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


class TrigramStore:
    """The grep index of one repo, under `directory`, kept current with the chunk table:
    `current(db)` as `retrieval.lexical.LexicalStore.current`. Thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._index: TrigramIndex | None = None
        self._lock = threading.Lock()
        self.last_refresh: dict[str, float | int | str] = {}

    def current(self, db: sqlite3.Connection) -> TrigramIndex:
        with self._lock:
            stamp = read_stamp(db)
            if self._index is not None and self._index.stamp == stamp:
                return self._index
            if self._index is None:
                self._index = self._load()
                if self._index is not None and self._index.stamp == stamp:
                    return self._index
            self._index = self._refresh(db, self._index)
            return self._index

    # -- disk -----------------------------------------------------------------------

    def _load(self) -> TrigramIndex | None:
        try:
            with np.load(self.directory / _STATE, allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
            codes_file, files_file = _base_files(self.directory, state["base_id"].tobytes())
            codes = np.load(codes_file, mmap_mode="r", allow_pickle=False)
            files = np.load(files_file, mmap_mode="r", allow_pickle=False)
        except (FileNotFoundError, KeyError):
            return None
        except (OSError, ValueError, EOFError) as exc:
            log.warning("the grep index in %s is damaged (%s); rebuilding it",
                        self.directory, exc)
            return None
        try:
            if int(state["version"][0]) != FORMAT_VERSION or len(codes) != len(files):
                return None
            paths = _unpack(state["paths"])
            digests = [row.tobytes() for row in state["digests"]]
            alive = state["alive"].astype(bool)
            if not len(paths) == len(digests) == len(alive):
                return None
            stamp = (int(state["stamp"][0]), int(state["stamp"][1]), state["epoch"].tobytes())
            return TrigramIndex(paths, digests, alive, codes, files, state["delta_codes"],
                                state["delta_files"], stamp, state["base_id"].tobytes())
        except (KeyError, ValueError, IndexError, UnicodeDecodeError) as exc:
            log.warning("the grep index in %s is unreadable (%s); rebuilding it",
                        self.directory, exc)
            return None

    def _save(self, index: TrigramIndex, base_changed: bool) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        base_id = np.frombuffer(index.base_id, dtype=np.uint8)
        current = _base_files(self.directory, index.base_id)
        if base_changed:
            for name, array in zip(current, (index.base_codes, index.base_files), strict=True):
                write_atomic(name, _npy_writer(array))
        arrays = {
            "version": np.array([FORMAT_VERSION]),
            "base_id": base_id,
            "paths": _pack(index.paths),
            "digests": np.frombuffer(b"".join(d.ljust(16, b"\0")[:16] for d in index.digests),
                                     dtype=np.uint8).reshape(-1, 16),
            "alive": index.alive,
            "delta_codes": index.delta_codes,
            "delta_files": index.delta_files,
            "stamp": np.array(index.stamp[:2], dtype=np.int64),
            "epoch": np.frombuffer(index.stamp[2], dtype=np.uint8),
        }
        write_atomic(self.directory / _STATE, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
        if base_changed:
            for stale in self.directory.glob("base-*.npy"):
                if stale not in current:
                    stale.unlink(missing_ok=True)

    # -- refresh --------------------------------------------------------------------

    def _refresh(self, db: sqlite3.Connection, old: TrigramIndex | None) -> TrigramIndex:
        t0 = time.perf_counter()
        reader = snapshot_reader(db)
        try:
            reader.execute("BEGIN")  # one WAL snapshot: stamp, file list and chunks agree
            stamp = read_stamp(reader)
            files = {p: bytes(d) for p, d in reader.execute("SELECT path, digest FROM chunk_files")}
            held = old.live_paths() if old is not None else {}
            changed = [p for p, d in files.items()
                       if p not in held or old is None or old.digests[held[p]] != d]
            rebuild = old is None or len(changed) > REBUILD_SHARE * max(len(files), 1)
            texts = _chunk_texts(reader, None if rebuild else changed)
            reader.execute("COMMIT")
        finally:
            reader.close()
        if rebuild or old is None:
            paths = sorted(texts)
            codes, owners = _postings([text_trigrams(texts[p]) for p in paths])
            index = TrigramIndex(paths, [files[p] for p in paths],
                                 np.ones(len(paths), dtype=bool), codes, owners,
                                 np.zeros(0, np.uint32), np.zeros(0, np.uint32), stamp,
                                 secrets.token_bytes(8))
            mode, base_changed = "rebuild", True
        else:
            index, base_changed = _updated(old, files, changed, texts, stamp)
            mode = "merge" if base_changed else "update"
        t1 = time.perf_counter()
        try:
            self._save(index, base_changed)
        except OSError as exc:
            log.warning("could not save the grep index in %s: %s", self.directory, exc)
        self.last_refresh = {"mode": mode, "files": len(files), "read": len(texts),
                             "seconds_build": round(t1 - t0, 4),
                             "seconds_save": round(time.perf_counter() - t1, 4)}
        log.debug("grep index refresh: %s", self.last_refresh)
        return index


def _npy_writer(array: np.ndarray) -> Callable[[IO[bytes]], None]:
    def write(f: IO[bytes]) -> None:
        np.save(f, array, allow_pickle=False)

    return write


def _updated(old: TrigramIndex, files: dict[str, bytes], changed: Sequence[str],
             texts: dict[str, list[str]], stamp: Stamp) -> tuple[TrigramIndex, bool]:
    """`old` with the changed files' postings in the delta (merged into the base when
    the delta grew large), and files gone or changed masked."""
    held = old.live_paths()
    alive = old.alive.copy()
    for path, fid in held.items():
        if path not in files or path in texts:
            alive[fid] = False
    paths, digests = list(old.paths), list(old.digests)
    new_ids = []
    for path in changed:
        new_ids.append(len(paths))
        paths.append(path)
        digests.append(files[path])
    alive = np.concatenate([alive, np.ones(len(new_ids), dtype=bool)])
    codes, owners = _postings([text_trigrams(texts.get(p, [])) for p in changed], new_ids)
    delta_codes = np.concatenate([old.delta_codes, codes])
    delta_files = np.concatenate([old.delta_files, owners])
    order = np.argsort(delta_codes, kind="stable")
    delta_codes, delta_files = delta_codes[order], delta_files[order]
    index = TrigramIndex(paths, digests, alive, old.base_codes, old.base_files, delta_codes,
                         delta_files, stamp, old.base_id)
    if len(delta_codes) <= MERGE_SHARE * max(len(old.base_codes), 1):
        return index, False
    return _merged(index), True


def _merged(index: TrigramIndex) -> TrigramIndex:
    """Base and delta as one base, dead files dropped and ids renumbered."""
    codes = np.concatenate([np.asarray(index.base_codes), index.delta_codes])
    owners = np.concatenate([np.asarray(index.base_files), index.delta_files])
    keep = index.alive[owners]
    codes, owners = codes[keep], owners[keep]
    live = np.flatnonzero(index.alive)
    renumber = np.full(len(index.alive), -1, dtype=np.int64)
    renumber[live] = np.arange(len(live))
    owners = renumber[owners].astype(np.uint32)
    order = np.lexsort((owners, codes))
    return TrigramIndex([index.paths[i] for i in live], [index.digests[i] for i in live],
                        np.ones(len(live), dtype=bool), codes[order], owners[order],
                        np.zeros(0, np.uint32), np.zeros(0, np.uint32), index.stamp,
                        secrets.token_bytes(8))


def _postings(per_file: Sequence[np.ndarray],
              ids: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(codes, file ids) of files' trigram sets, sorted by code."""
    if not per_file:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32)
    file_ids = np.arange(len(per_file)) if ids is None else np.asarray(ids)
    codes = np.concatenate(per_file).astype(np.uint32)
    owners = np.repeat(file_ids, [len(c) for c in per_file]).astype(np.uint32)
    order = np.argsort(codes, kind="stable")  # files stay in id order within a code
    return codes[order], owners[order]


def _chunk_texts(db: sqlite3.Connection, paths: Sequence[str] | None) -> dict[str, list[str]]:
    """path -> the texts of its chunks (every file of the table if `paths` is None)."""
    out: dict[str, list[str]] = {}
    if paths is None:
        for path, text in db.execute("SELECT path, text FROM chunks ORDER BY path, ordinal"):
            out.setdefault(path, []).append(text)
        for (path,) in db.execute("SELECT path FROM chunk_files"):
            out.setdefault(path, [])  # a file of blank lines has no chunk
        return out
    for start in range(0, len(paths), SQL_BATCH):
        part = list(paths[start : start + SQL_BATCH])
        marks = ",".join("?" * len(part))
        for path in part:
            out.setdefault(path, [])
        for path, text in db.execute(
                f"SELECT path, text FROM chunks WHERE path IN ({marks}) ORDER BY path, ordinal",
                part):
            out[path].append(text)
    return out


def _pack(items: Sequence[str]) -> np.ndarray:
    # NUL never occurs in a path.
    return np.frombuffer("\0".join(items).encode("utf-8"), dtype=np.uint8).copy()


def _unpack(raw: np.ndarray) -> list[str]:
    text = raw.tobytes().decode("utf-8")
    return text.split("\0") if text else []
