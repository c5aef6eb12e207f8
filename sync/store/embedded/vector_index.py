"""The search index of one workspace: its faiss index, the rows its ids stand for, and
the snapshot file that lets a restart skip rebuilding them.

Index kinds. A workspace searches exactly (`IndexFlatL2` in an `IndexIDMap2`) while it
holds fewer than `IndexPolicy.exact_max_rows` rows: exact search reads every vector, so
its cost grows with the rows (about 2 ms per 10k rows of dim 384 on one core when memory
is quiet, several times that when it is busy). From there on it uses `IndexIVFFlat`:
k-means cells trained on a sample of the workspace's own encrypted vectors, of which a
search reads the `nprobe` nearest. IVF keeps full vectors (no loss of precision), adds
and removes ids in place, and needs no graph to repair; HNSW in faiss cannot remove ids.
The cells are retrained when the rows grow or shrink by `regrow` since training, so
lists stay near their intended length. Encrypted vectors are not normalised and carry a
large secret scale; k-means and search are plain L2 on them, which the scale does not
change.

Rows. `RowTable` maps a faiss id (`rid`) to its chunk id and sealed metadata, and a file
(`fid`) to its rids, in numpy columns rather than a dict of Python objects: a million
rows take about 160 MB instead of about 600 MB, and the columns go to the snapshot as
they are.

Snapshot (`write_snapshot`, `read_snapshot`): one file, written to a temporary name,
fsynced and renamed into place, so a reader sees a whole snapshot or the previous one::

    faiss index (faiss.write_index) || rid || fid || chunk ids || meta offsets || metas
    || trailer: JSON {format, dim, generation, ..., sections: name -> [offset, length],
                      digests: name -> xxh3-128 hex of the section's bytes}
    || u64 trailer length || magic "CVSNAP01"

Arrays are little-endian and C-ordered. The trailer records the store generation the
snapshot reflects; the store decides whether to trust it (see sync.store.embedded.search_index).
Every section is read back against its digest: a snapshot with a byte changed is a
`SnapshotError` naming the section (faiss would read garbled vectors without a word, and
searches would silently rank by them), so the store rebuilds the index from its rows and
`codeveil doctor --data` names the file. Format 1 (no digests) is rebuilt likewise.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

import numpy as np
import xxhash

from indexer.lazy import LazyModule
from indexer.private_files import fsync_dir
from sync.errors import SyncError

# faiss takes ~50 ms to import; a sync with nothing to send never needs it.
if TYPE_CHECKING:
    import faiss
else:
    faiss = LazyModule("faiss")

__all__ = [
    "IndexPolicy",
    "RowTable",
    "SnapshotError",
    "VectorIndex",
    "chunk_id_array",
    "pack",
    "read_snapshot",
    "read_snapshot_info",
    "write_snapshot",
]

CHUNK_ID_BYTES: Final = 16
SNAPSHOT_FORMAT: Final = 2  # 2: a digest per section
_MAGIC: Final = b"CVSNAP01"
_TAIL = struct.Struct("<Q8s")
_BATCH: Final = 65_536  # rows per add: bounds the temporary copies of a rebuild

Batches = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]  # -> (rids, vectors)


class SnapshotError(SyncError):
    """A snapshot file that cannot be used (damaged, another format, another dim)."""


# -- policy -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexPolicy:
    """Which index a workspace of a given size gets, and how it is tuned.

    Defaults and the measurements behind them: docs/benchmarks.md, "Query latency".
    """

    #: Exact search below this many rows, IVF from it on.
    exact_max_rows: int = 30_000
    #: Retrain the IVF cells once the rows have grown or shrunk by this factor.
    regrow: float = 4.0
    #: Cells per sqrt(rows at training): nlist = cells_per_sqrt * sqrt(rows).
    cells_per_sqrt: float = 2.0
    #: Training points per cell (faiss warns below 39; more costs k-means time).
    train_per_cell: int = 64
    #: k-means iterations: beyond ~10 the cells barely move and recall does not change.
    train_iterations: int = 10
    #: Cells probed per query: probe_scale * sqrt(nlist). The probes a given recall needs
    #: grow about as sqrt(nlist), not in proportion to it. Queries are what makes it
    #: expensive: a question in words lands far from the code it finds (cosine ~0.44 to
    #: its nearest chunk, against ~0.84 between neighbouring chunks), so its neighbours
    #: spread over many cells. 7 gives recall@10 ~0.99 for such queries.
    probe_scale: float = 7.0
    #: ...and never fewer than this.
    min_probes: int = 32
    #: A query for k rows probes enough cells to hold `k * candidates_per_hit` rows on
    #: average, so a large k does not come back short or with poor recall.
    candidates_per_hit: int = 4

    def nlist(self, rows: int) -> int:
        # Small workspaces (tests) are capped so that every cell gets its training points.
        cells = min(self.cells_per_sqrt * math.sqrt(max(rows, 1)), rows / self.train_per_cell)
        return max(1, round(cells))

    def nprobe(self, nlist: int, rows: int, k: int) -> int:
        base = max(self.min_probes, math.ceil(self.probe_scale * math.sqrt(nlist)))
        per_cell = max(rows / nlist, 1.0)
        return min(nlist, max(base, math.ceil(k * self.candidates_per_hit / per_cell)))

    def wants_rebuild(self, index: VectorIndex, rows: int) -> bool:
        """Whether `index`, now holding `rows` rows, should be rebuilt."""
        if index.kind == "exact":
            return rows >= self.exact_max_rows
        # Back to exact well below the threshold only, so that a workspace hovering
        # around it does not retrain at every apply.
        if rows < self.exact_max_rows // 2:
            return True
        trained = max(index.trained_rows, 1)
        return rows >= trained * self.regrow or rows * self.regrow <= trained


# -- the faiss index ----------------------------------------------------------------------


class VectorIndex:
    """A faiss index over encrypted vectors, keyed by rid: exact or IVF (see the module
    docstring). Searches may run concurrently; changes must be serialised by the caller
    and must not run during a search."""

    def __init__(
        self, index: faiss.Index, kind: str, trained_rows: int, policy: IndexPolicy
    ) -> None:
        self.index = index
        self.kind = kind
        self.trained_rows = trained_rows
        self.policy = policy
        self.dim: int = index.d
        self.nlist: int = index.nlist if kind == "ivf" else 0

    @classmethod
    def exact(cls, dim: int, policy: IndexPolicy) -> VectorIndex:
        return cls(faiss.IndexIDMap2(faiss.IndexFlatL2(dim)), "exact", 0, policy)

    @classmethod
    def build(
        cls,
        dim: int,
        rows: int,
        batches: Batches,
        policy: IndexPolicy,
        *,
        seed: int = 0,
    ) -> VectorIndex:
        """The index `policy` picks for `rows` rows, filled from `batches` (a callable
        returning a fresh iterator of (rids, vectors); called twice for IVF: once to
        sample the training set, once to add)."""
        if rows < policy.exact_max_rows:
            index = cls.exact(dim, policy)
            for rids, vectors in batches():
                index.add(vectors, rids)
            return index
        nlist = policy.nlist(rows)
        sample = _sample(batches, rows, min(rows, nlist * policy.train_per_cell), dim, seed)
        quantizer = faiss.IndexFlatL2(dim)
        ivf = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_L2)
        ivf.cp.niter = policy.train_iterations
        ivf.cp.seed = seed + 1234
        ivf.train(sample)
        del sample
        out = cls(ivf, "ivf", rows, policy)
        for rids, vectors in batches():
            out.add(vectors, rids)
        return out

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray, rids: np.ndarray) -> None:
        if len(rids):
            self.index.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32),
                np.ascontiguousarray(rids, dtype=np.int64),
            )

    def remove(self, rids: np.ndarray) -> None:
        if len(rids):
            removed = self.index.remove_ids(np.ascontiguousarray(rids, dtype=np.int64))
            if removed != len(rids):
                raise RuntimeError(f"removed {removed} of {len(rids)} ids from the index")

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Squared L2 distances and rids of the `k` nearest rows; rid -1 pads a short
        answer (IVF returns fewer than k only if the probed cells hold fewer rows)."""
        if self.kind == "exact":
            return self.index.search(queries, k)
        params = faiss.SearchParametersIVF(
            nprobe=self.policy.nprobe(self.nlist, self.ntotal, k)
        )
        return self.index.search(queries, k, params=params)

    def batches(self, size: int = _BATCH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(rids, vectors) of every row, as views into the index's own storage: valid
        only until the index next changes."""
        if self.kind == "exact":
            n = self.ntotal
            if not n:
                return
            flat = faiss.downcast_index(self.index.index)
            vectors = faiss.rev_swig_ptr(flat.get_xb(), n * self.dim).reshape(n, self.dim)
            rids = faiss.vector_to_array(self.index.id_map)
            for start in range(0, n, size):
                yield rids[start : start + size], vectors[start : start + size]
            return
        invlists = self.index.invlists
        for cell in range(self.nlist):
            n = invlists.list_size(cell)
            if not n:
                continue
            codes = faiss.rev_swig_ptr(invlists.get_codes(cell), n * self.index.code_size)
            ids = faiss.rev_swig_ptr(invlists.get_ids(cell), n)
            yield ids, codes.view(np.float32).reshape(n, self.dim)

    def rebuilt(self, rows: int, *, seed: int = 0) -> VectorIndex:
        """A new index for `rows` rows (the policy's kind) holding this one's rows."""
        return VectorIndex.build(self.dim, rows, self.batches, self.policy, seed=seed)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "rows": self.ntotal}
        if self.kind == "ivf":
            out |= {
                "nlist": self.nlist,
                "trained_rows": self.trained_rows,
                "nprobe": self.policy.nprobe(self.nlist, self.ntotal, 1),  # more for large k
            }
        return out


def _sample(batches: Batches, rows: int, want: int, dim: int, seed: int) -> np.ndarray:
    """About `want` rows drawn uniformly from `batches`, without materialising them all."""
    rng = np.random.default_rng(seed)
    keep = min(1.0, want / max(rows, 1) * 1.02)  # a little over, then trimmed
    parts = []
    for _rids, vectors in batches():
        picked = rng.random(len(vectors)) < keep
        if picked.any():
            parts.append(np.array(vectors[picked], dtype=np.float32))
    sample = np.concatenate(parts) if parts else np.empty((0, dim), np.float32)
    if len(sample) > want:
        sample = sample[np.sort(rng.choice(len(sample), want, replace=False))]
    return np.ascontiguousarray(sample)


# -- rows -------------------------------------------------------------------------------


class RowTable:
    """rid -> (chunk id, sealed meta), and fid -> its rids, for the rows in the index.

    Columns are kept in rid order. Rids come from a counter and the rows of a batch are
    appended with rids above all earlier ones, so the order holds without sorting and a
    rid is found by binary search. The rows of one file are one run of consecutive rids
    (a file's rows are always replaced together), so a file is a few (first rid, count)
    spans. Removed rows stay as dead entries until they are a third of the table.
    """

    def __init__(self) -> None:
        self._n = 0  # slots in use, dead or alive
        self._live = 0
        self._rid = np.empty(0, np.int64)
        self._fid = np.empty(0, np.int64)
        self._cid = np.empty((0, CHUNK_ID_BYTES), np.uint8)
        self._alive = np.empty(0, np.bool_)
        self._moff = np.zeros(1, np.int64)  # meta i is _mbuf[_moff[i]:_moff[i + 1]]
        self._mbuf = np.empty(0, np.uint8)
        self._spans: dict[int, tuple[int, ...]] = {}  # fid -> (first rid, count, ...)

    @classmethod
    def from_columns(
        cls,
        rid: np.ndarray,
        fid: np.ndarray,
        chunk_id: np.ndarray,
        meta_offsets: np.ndarray,
        meta_data: np.ndarray,
    ) -> RowTable:
        """A table of live rows, from the arrays `columns` returns, in any rid order."""
        table = cls()
        order = np.argsort(rid, kind="stable")
        if not np.array_equal(order, np.arange(len(rid))):
            rid, fid, chunk_id = rid[order], fid[order], chunk_id[order]
            meta_offsets, meta_data = _gather(meta_offsets, meta_data, order)
        n = len(rid)
        if n and np.any(np.diff(rid) <= 0):
            raise ValueError("duplicate rids")
        if len(fid) != n or len(chunk_id) != n or len(meta_offsets) != n + 1:
            raise ValueError("columns of different lengths")
        table._n = table._live = n
        table._rid = np.ascontiguousarray(rid, dtype=np.int64)
        table._fid = np.ascontiguousarray(fid, dtype=np.int64)
        table._cid = np.ascontiguousarray(chunk_id, dtype=np.uint8).reshape(n, CHUNK_ID_BYTES)
        table._alive = np.ones(n, np.bool_)
        table._moff = np.ascontiguousarray(meta_offsets, dtype=np.int64)
        table._mbuf = np.ascontiguousarray(meta_data, dtype=np.uint8)
        table._rebuild_spans()
        return table

    def __len__(self) -> int:
        return self._live

    def has_file(self, fid: int) -> bool:
        return fid in self._spans

    def rids(self) -> np.ndarray:
        """The live rids, ascending."""
        return self._rid[: self._n][self._alive[: self._n]]

    def append(
        self,
        rid: np.ndarray,
        fid: np.ndarray,
        chunk_id: np.ndarray,
        meta_offsets: np.ndarray,
        meta_data: np.ndarray,
    ) -> None:
        """Add rows: `chunk_id` (n, 16) uint8; meta i is meta_data[offsets[i]:offsets[i+1]]
        (see `pack`)."""
        n = len(rid)
        if not n:
            return
        rids = np.asarray(rid, dtype=np.int64)
        fids = np.asarray(fid, dtype=np.int64)
        chunk_ids = chunk_id
        if np.any(np.diff(rids) <= 0) or (self._n and rids[0] <= self._rid[self._n - 1]):
            # Not reached through the store (rids only grow); kept correct regardless.
            mine = self.columns()
            base = int(mine["meta_offsets"][-1])
            merged = RowTable.from_columns(
                np.concatenate([mine["rid"], rids]),
                np.concatenate([mine["fid"], fids]),
                np.concatenate([mine["chunk_id"], chunk_ids]),
                np.concatenate([mine["meta_offsets"], base + meta_offsets[1:]]),
                np.concatenate([mine["meta_data"], meta_data]),
            )
            self.__dict__.update(merged.__dict__)
            return
        size = int(meta_offsets[-1])
        m0 = int(self._moff[self._n])
        self._reserve(self._n + n, m0 + size)
        at = self._n
        self._rid[at : at + n] = rids
        self._fid[at : at + n] = fids
        self._cid[at : at + n] = chunk_ids
        self._alive[at : at + n] = True
        self._moff[at + 1 : at + n + 1] = m0 + meta_offsets[1:]
        self._mbuf[m0 : m0 + size] = meta_data[:size]
        self._n += n
        self._live += n
        for run_fid, first, count in _runs(rids, fids):
            self._spans[run_fid] = (*self._spans.get(run_fid, ()), first, count)

    def remove_files(self, fids: Sequence[int]) -> np.ndarray:
        """Drop the rows of files `fids` (unknown ones are skipped); returns their rids."""
        out: list[np.ndarray] = []
        live = self._rid[: self._n]
        for fid in fids:
            spans = self._spans.pop(fid, ())
            for first, count in zip(spans[::2], spans[1::2], strict=True):
                at = int(np.searchsorted(live, first))
                self._alive[at : at + count] = False
                out.append(np.arange(first, first + count, dtype=np.int64))
        gone = np.concatenate(out) if out else np.empty(0, np.int64)
        self._live -= len(gone)
        self._maybe_compact()
        return gone

    def remove_rids(self, rids: np.ndarray) -> None:
        """Drop rows by rid (all must be present)."""
        if not len(rids):
            return
        at = np.searchsorted(self._rid[: self._n], rids)
        if np.any(at >= self._n) or np.any(self._rid[np.minimum(at, self._n - 1)] != rids):
            raise KeyError("rid not in the table")
        self._alive[at] = False
        self._live = int(self._alive[: self._n].sum())
        self._rebuild_spans()
        self._maybe_compact()

    def lookup(self, rids: Sequence[int]) -> list[tuple[bytes, bytes]]:
        """(chunk id, meta) of each rid; KeyError for a rid not in the table."""
        live = self._rid[: self._n]
        at = np.searchsorted(live, np.asarray(rids, dtype=np.int64))
        out = []
        for rid, i in zip(rids, at.tolist(), strict=True):
            if i >= self._n or live[i] != rid or not self._alive[i]:
                raise KeyError(rid)
            meta = self._mbuf[self._moff[i] : self._moff[i + 1]].tobytes()
            out.append((self._cid[i].tobytes(), meta))
        return out

    def columns(self) -> dict[str, np.ndarray]:
        """The live rows as arrays (copies), for a snapshot: see `from_columns`."""
        keep = self._alive[: self._n]
        offsets, data = _gather(self._moff[: self._n + 1], self._mbuf, np.flatnonzero(keep))
        return {
            "rid": self._rid[: self._n][keep],
            "fid": self._fid[: self._n][keep],
            "chunk_id": self._cid[: self._n][keep],
            "meta_offsets": offsets,
            "meta_data": data,
        }

    def nbytes(self) -> int:
        arrays = (self._rid, self._fid, self._cid, self._alive, self._moff, self._mbuf)
        return sum(a.nbytes for a in arrays)

    # -- internals ------------------------------------------------------------------

    def _reserve(self, rows: int, meta_bytes: int) -> None:
        if rows > len(self._rid):
            cap = max(rows, len(self._rid) * 3 // 2, 1024)
            self._rid = _grown(self._rid, cap)
            self._fid = _grown(self._fid, cap)
            self._cid = _grown(self._cid, cap)
            self._alive = _grown(self._alive, cap)
            self._moff = _grown(self._moff, cap + 1)
        if meta_bytes > len(self._mbuf):
            self._mbuf = _grown(self._mbuf, max(meta_bytes, len(self._mbuf) * 3 // 2, 65_536))

    def _maybe_compact(self) -> None:
        dead = self._n - self._live
        if dead < 4096 or dead * 3 < self._n:
            return
        cols = self.columns()
        fresh = RowTable.from_columns(**cols)
        self.__dict__.update(fresh.__dict__)

    def _rebuild_spans(self) -> None:
        keep = self._alive[: self._n]
        rids, fids = self._rid[: self._n][keep], self._fid[: self._n][keep]
        spans: dict[int, tuple[int, ...]] = {}
        for fid, first, count in _runs(rids, fids):
            spans[fid] = (*spans.get(fid, ()), first, count)
        self._spans = spans


def pack(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of byte strings: item i is data[offsets[i]:offsets[i + 1]]."""
    offsets = np.zeros(len(items) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=offsets[1:])
    return offsets, np.frombuffer(b"".join(items), np.uint8)


def chunk_id_array(chunk_ids: Sequence[bytes]) -> np.ndarray:
    """(n, 16) uint8 of 16-byte chunk ids."""
    return np.frombuffer(b"".join(chunk_ids), np.uint8).reshape(len(chunk_ids), CHUNK_ID_BYTES)


def _grown(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.empty((rows, *array.shape[1:]), array.dtype)
    out[: len(array)] = array
    return out


def _runs(rids: np.ndarray, fids: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(fid, first rid, count) of each run of consecutive rids of one fid."""
    if not len(rids):
        return
    breaks = np.flatnonzero((np.diff(fids) != 0) | (np.diff(rids) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    counts = np.diff(np.concatenate([starts, [len(rids)]]))
    yield from zip(
        fids[starts].tolist(), rids[starts].tolist(), counts.tolist(), strict=True
    )


def _gather(
    offsets: np.ndarray, data: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The variable-length items `rows` of (offsets, data), as new (offsets, data)."""
    starts = offsets[:-1][rows]
    lengths = offsets[1:][rows] - starts
    new_offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    # Byte j of the output comes from starts[item] + (j - new_offsets[item]).
    shift = np.repeat(starts - new_offsets[:-1], lengths)
    return new_offsets, data[shift + np.arange(int(new_offsets[-1]), dtype=np.int64)]


# -- snapshot ---------------------------------------------------------------------------


def write_snapshot(
    path: Path, index: VectorIndex, rows: RowTable, info: dict[str, Any]
) -> int:
    """Write `index`, `rows` and `info` (JSON-able) to `path` atomically; returns bytes."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "wb") as f:
            sections: dict[str, list[int]] = {}
            digests: dict[str, str] = {}
            start = f.tell()
            hasher = xxhash.xxh3_128()

            def write(data: bytes) -> int:
                hasher.update(data)
                return f.write(data)

            writer = faiss.PyCallbackIOWriter(write)
            faiss.write_index(index.index, writer)
            del writer  # flushes its buffer into f
            sections["faiss"] = [start, f.tell() - start]
            digests["faiss"] = hasher.hexdigest()
            arrays: dict[str, Any] = {}
            for name, array in rows.columns().items():
                start = f.tell()
                data = np.ascontiguousarray(array).data
                f.write(data)
                sections[name] = [start, f.tell() - start]
                digests[name] = xxhash.xxh3_128_hexdigest(data)
                arrays[name] = [array.dtype.str, list(array.shape)]
            trailer = json.dumps(
                {
                    **info,
                    "format": SNAPSHOT_FORMAT,
                    "dim": index.dim,
                    "index": {"kind": index.kind, "trained_rows": index.trained_rows},
                    "sections": sections,
                    "digests": digests,
                    "arrays": arrays,
                }
            ).encode()
            f.write(trailer)
            f.write(_TAIL.pack(len(trailer), _MAGIC))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_snapshot_info(path: Path) -> dict[str, Any]:
    """The trailer of a snapshot (cheap: reads its last bytes). SnapshotError if the
    file is not a snapshot this code reads; FileNotFoundError if there is none."""
    with open(path, "rb") as f:
        return _trailer(f)


def read_snapshot(
    path: Path, policy: IndexPolicy
) -> tuple[VectorIndex, RowTable, dict[str, Any]]:
    """The index, rows and info written by `write_snapshot`."""
    with open(path, "rb") as f:
        info = _trailer(f)
        sections, arrays, digests = info["sections"], info["arrays"], info["digests"]
        try:
            offset, length = sections["faiss"]
            f.seek(offset)
            left = length
            hasher = xxhash.xxh3_128()

            def read(n: int) -> bytes:
                nonlocal left
                data = f.read(min(n, left))
                left -= len(data)
                hasher.update(data)
                return data

            # The digest first: faiss is not handed bytes that are not the ones written.
            while read(1 << 20):
                pass
            _check_digest(path, "faiss", hasher.hexdigest(), digests)
            f.seek(offset)
            left = length
            raw = faiss.read_index(faiss.PyCallbackIOReader(read))
            cols = {}
            for name, (dtype, shape) in arrays.items():
                offset, length = sections[name]
                f.seek(offset)
                buf = bytearray(length)
                if f.readinto(buf) != length:
                    raise SnapshotError(f"{path}: section {name} is cut short")
                _check_digest(path, name, xxhash.xxh3_128_hexdigest(buf), digests)
                cols[name] = np.frombuffer(buf, np.dtype(dtype)).reshape(shape)
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise SnapshotError(f"{path}: {exc}") from exc
    kind = info["index"]["kind"]
    index = raw  # read_index hands back the concrete class, owning its C++ object
    if kind not in ("exact", "ivf") or index.d != info["dim"]:
        raise SnapshotError(f"{path}: unexpected index ({kind}, dim {index.d})")
    vindex = VectorIndex(index, kind, int(info["index"]["trained_rows"]), policy)
    try:
        rows = RowTable.from_columns(**cols)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"{path}: bad row columns ({exc})") from exc
    if len(rows) != vindex.ntotal:
        raise SnapshotError(f"{path}: {len(rows)} rows but {vindex.ntotal} vectors")
    return vindex, rows, info


def _check_digest(path: Path, name: str, digest: str, digests: dict[str, str]) -> None:
    if digests.get(name) != digest:
        raise SnapshotError(f"{path}: section {name} does not match its digest (the file"
                            " is damaged)")


def _trailer(f: BinaryIO) -> dict[str, Any]:
    try:
        f.seek(-_TAIL.size, os.SEEK_END)
        length, magic = _TAIL.unpack(f.read(_TAIL.size))
        if magic != _MAGIC:
            raise SnapshotError(f"{f.name}: not a codeveil index snapshot")
        f.seek(-_TAIL.size - length, os.SEEK_END)
        info = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise SnapshotError(f"{f.name}: unreadable trailer ({exc})") from exc
    version = info.get("format") if isinstance(info, dict) else None
    if version != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{f.name}: snapshot format {version!r}, not {SNAPSHOT_FORMAT}")
    return info

