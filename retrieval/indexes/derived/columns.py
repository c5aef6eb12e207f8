"""Where each row's chunk sits, as numpy columns: the metadata every derived index keeps
beside its own data (BM25 postings, vectors) and saves as a handful of arrays.

A row's chunk is a `ChunkLocation`; here its path and language are ids into small name
tables, its lines a pair of int32, its symbol a slice of one UTF-8 blob and its chunk
hash 16 bytes. `concat` joins chosen rows of several column sets without a Python loop
over rows (a merge of 100k rows), naming only the paths and languages those rows use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from indexer.location import ChunkLocation

#: The column arrays, under the names they are saved as.
COLUMN_KEYS = ("path_id", "lines", "lang_id", "sym_ptr", "sym_blob", "hashes")


@dataclass
class ChunkColumns:
    """The location of each row's chunk, as columns."""

    path_id: np.ndarray  # int32 [n]
    lines: np.ndarray  # int32 [n, 2]
    lang_id: np.ndarray  # int16 [n]
    sym_ptr: np.ndarray  # int64 [n + 1]
    sym_blob: np.ndarray  # uint8, utf-8 symbols back to back
    hashes: np.ndarray  # uint8 [n, 16], chunk hashes
    paths: list[str]
    languages: list[str]

    def __len__(self) -> int:
        return len(self.path_id)

    @classmethod
    def of(cls, docs: Sequence[ChunkLocation]) -> ChunkColumns:
        path_ids: dict[str, int] = {}
        lang_ids: dict[str, int] = {}
        syms = [d.symbol.encode("utf-8") for d in docs]
        sym_ptr = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in syms], out=sym_ptr[1:])
        return cls(
            np.fromiter((path_ids.setdefault(d.path, len(path_ids)) for d in docs),
                        dtype=np.int32, count=len(docs)),
            np.array([(d.start_line, d.end_line) for d in docs], dtype=np.int32).reshape(-1, 2),
            np.fromiter((lang_ids.setdefault(d.language, len(lang_ids)) for d in docs),
                        dtype=np.int16, count=len(docs)),
            sym_ptr,
            np.frombuffer(b"".join(syms), dtype=np.uint8).copy(),
            digest_rows([d.chunk_hash for d in docs]),
            list(path_ids), list(lang_ids),
        )

    @classmethod
    def empty(cls) -> ChunkColumns:
        return cls.of([])

    # -- reading --------------------------------------------------------------------

    def symbol(self, i: int) -> str:
        return self.sym_blob[self.sym_ptr[i] : self.sym_ptr[i + 1]].tobytes().decode("utf-8")

    def doc(self, i: int) -> ChunkLocation:
        return ChunkLocation(self.paths[self.path_id[i]], int(self.lines[i, 0]),
                             int(self.lines[i, 1]), self.symbol(i),
                             self.languages[self.lang_id[i]], self.hashes[i].tobytes())

    def docs(self, rows: np.ndarray) -> list[ChunkLocation]:
        """`doc(i)` of each of `rows`, with the columns read once (a filtered search
        looks at thousands)."""
        blob = self.sym_blob.tobytes()
        starts, ends = self.sym_ptr[rows].tolist(), self.sym_ptr[rows + 1].tolist()
        hashes = self.hashes[rows].tobytes()
        paths, langs = self.paths, self.languages
        return [ChunkLocation(paths[p], s, e, blob[a:b].decode("utf-8"), langs[lg],
                              hashes[16 * j : 16 * j + 16])
                for j, (p, (s, e), lg, a, b) in enumerate(zip(
                    self.path_id[rows].tolist(), self.lines[rows].tolist(),
                    self.lang_id[rows].tolist(), starts, ends, strict=True))]

    def rows_of(self, paths: set[str]) -> np.ndarray:
        """bool [n]: the rows of chunks of `paths`."""
        if not paths or not len(self):
            return np.zeros(len(self), dtype=bool)
        hit = np.array([p in paths for p in self.paths])
        return hit[self.path_id]

    # -- saving ---------------------------------------------------------------------

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """The columns as named arrays, the name tables packed (`pack`)."""
        return {**{f"{prefix}{k}": getattr(self, k) for k in COLUMN_KEYS},
                f"{prefix}paths": pack(self.paths),
                f"{prefix}languages": pack(self.languages)}

    @classmethod
    def load(cls, z: dict[str, np.ndarray], prefix: str = "") -> ChunkColumns:
        """The columns `arrays(prefix)` saved; raises ValueError for garbage that still
        parses, so that it never indexes out of range at search time."""
        path_id, lines, lang_id, sym_ptr, sym_blob, hashes = (
            z[f"{prefix}{k}"] for k in COLUMN_KEYS)
        cols = ChunkColumns(path_id, lines, lang_id, sym_ptr, sym_blob, hashes,
                            unpack(z[f"{prefix}paths"]), unpack(z[f"{prefix}languages"]))
        n = len(cols)
        if (cols.lines.shape != (n, 2) or cols.hashes.shape != (n, 16)
                or len(cols.lang_id) != n or len(cols.sym_ptr) != n + 1
                or (n and (int(cols.path_id.max()) >= len(cols.paths)
                           or int(cols.lang_id.max()) >= len(cols.languages)
                           or int(cols.sym_ptr[-1]) > len(cols.sym_blob)))):
            raise ValueError("chunk metadata of inconsistent sizes")
        return cols

    # -- joining --------------------------------------------------------------------

    def take(self, rows: np.ndarray) -> ChunkColumns:
        return ChunkColumns.concat([(self, rows)])

    @classmethod
    def concat(cls, parts: Sequence[tuple[ChunkColumns, np.ndarray]]) -> ChunkColumns:
        """The rows `rows` of each part, in order, as one; naming only the paths and
        languages those rows use."""
        if not parts:
            return cls.empty()
        paths: dict[str, int] = {}
        langs: dict[str, int] = {}
        pid, lid, lines, hashes, sym_lens, blobs = [], [], [], [], [], []
        for cols, rows in parts:
            pid.append(_remap(cols.path_id[rows], cols.paths, paths, np.int32))
            lid.append(_remap(cols.lang_id[rows], cols.languages, langs, np.int16))
            lines.append(cols.lines[rows])
            hashes.append(cols.hashes[rows])
            starts, ends = cols.sym_ptr[rows], cols.sym_ptr[rows + 1]
            sym_lens.append(ends - starts)
            blobs.append(gather(cols.sym_blob, starts, ends))
        sym_len = np.concatenate(sym_lens)
        sym_ptr = np.zeros(len(sym_len) + 1, dtype=np.int64)
        np.cumsum(sym_len, out=sym_ptr[1:])
        return cls(np.concatenate(pid), np.concatenate(lines).reshape(-1, 2),
                   np.concatenate(lid), sym_ptr, np.concatenate(blobs).astype(np.uint8),
                   np.concatenate(hashes).reshape(-1, 16), list(paths), list(langs))


def _remap(ids: np.ndarray, names: list[str], into: dict[str, int],
           dtype: type[np.signedinteger]) -> np.ndarray:
    """`ids` (into `names`) as ids into the growing name table `into`."""
    if not len(ids):
        return np.zeros(0, dtype=dtype)
    used = np.unique(ids)
    table = np.zeros(int(used[-1]) + 1, dtype=dtype)
    table[used] = [into.setdefault(names[i], len(into)) for i in used.tolist()]
    return table[ids]


#: Slices gathered at once by `gather`: its index arrays cost 16 bytes a byte gathered,
#: so a merge of 1M symbols (~20 MB) in one go held 320 MB of them.
GATHER_SLICES: Final = 1 << 16


def gather(blob: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """blob[starts[0]:ends[0]] + blob[starts[1]:ends[1]] + ... without a Python loop over
    slices (a numpy pass per `GATHER_SLICES` of them)."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=blob.dtype)
    out = np.empty(total, dtype=blob.dtype)
    at = 0
    for lo in range(0, len(lens), GATHER_SLICES):
        part_lens = lens[lo : lo + GATHER_SLICES]
        size = int(part_lens.sum())
        if size:
            firsts = np.concatenate(([0], np.cumsum(part_lens)[:-1]))
            offsets = np.repeat(starts[lo : lo + GATHER_SLICES] - firsts, part_lens)
            out[at : at + size] = blob[np.arange(size) + offsets]
        at += size
    return out


def digest_rows(digests: Sequence[bytes]) -> np.ndarray:
    """Digests (xxh3-128, 16 bytes each) as a uint8 [n, 16] array."""
    return np.frombuffer(b"".join(d.ljust(16, b"\0")[:16] for d in digests),
                         dtype=np.uint8).reshape(-1, 16).copy()


def pack(items: Sequence[str]) -> np.ndarray:
    """Names as one uint8 array. NUL never occurs in a path, a language name or a symbol."""
    return np.frombuffer("\0".join(items).encode("utf-8"), dtype=np.uint8).copy()


def unpack(raw: np.ndarray) -> list[str]:
    text = raw.tobytes().decode("utf-8")
    return text.split("\0") if text else []
