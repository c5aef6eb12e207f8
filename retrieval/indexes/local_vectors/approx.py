"""Approximate search over a large vector base: one faiss IVF-PQ index per vector plane
(body, header), its candidates re-ranked exactly from the base's own vectors.

Why this shape (measured by `bench/approx_vectors.py` on clustered 384-dim vectors,
docs/benchmarks.md): exact search reads every vector on every query, p50 17.5 ms at 100k
chunks, 39 ms at 300k and 204 ms at 1M, so it crosses a 30 ms budget near 200k: below
`APPROX_MIN_CHUNKS` it stays exact (the exact answer, no background build of minutes,
no extra disk). Above it, an IVF with PQ codes (48 bytes per
vector per plane, against 1,536 for the float32 vector) keeps the coarse search in a
few tens of MB of memory, and the top `rerank_width` candidates are scored again from
the memory-mapped float32 base, so the order of what is returned is the exact one (the
same cosines exact search gives) and only membership at the edge can differ. HNSW was
the alternative: no training, but its graph costs ~2x the PQ codes' memory per vector,
and it cannot remove a row; here masked rows are simply left out of the candidates.

Only the base is indexed: the delta (the edits since the last merge) is searched
exactly beside it, so an edit never touches the IVF. A merge makes a new base, whose
IVF reuses the trained quantizer and codebooks of the previous one (an `add`, no
training) unless the base has grown past `RETRAIN_GROWTH` times the rows it was
trained on: the coarse centroids then no longer fit the data's spread well enough.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

from retrieval.indexes.local_vectors.mapped import RELEASE_ROWS, release

#: Below this many base rows search stays exact (see the module docstring); the
#: environment variable CODEVEIL_APPROX_MIN_CHUNKS overrides it.
APPROX_MIN_CHUNKS: Final = 200_000
#: A base this many times the rows its IVF was trained on is trained afresh.
RETRAIN_GROWTH: Final = 2.0
PQ_BYTES: Final = 48  # bytes of PQ code per vector (dim must be a multiple)
TRAIN_SAMPLE: Final = 65_536  # vectors the quantizers are trained on, at least
# k-means iterations of the coarse quantizer and of each PQ sub-quantizer: faiss's 25
# cost 1.8x the build's training time (measured, 200k chunks) and the exact re-rank
# makes up for rougher PQ centroids.
TRAIN_ITERATIONS: Final = 10
# Lists probed: a share of them, not a count. Measured on 200k synthetic chunks (nlist
# 894, rows re-ranked 512): recall@10 against exact 0.911 probing 1/16 of the lists,
# 0.958 at 1/10, 0.973 at 1/8, 0.982 at 1/6. Questions land far from the code they find,
# so the near lists alone miss (the server's IVF probes many for the same reason).
PROBE_SHARE: Final = 1 / 6
NPROBE_MIN: Final = 48
# Candidates re-ranked exactly, at least. The PQ codes' order, not the lists probed,
# bounds recall here: at 1M synthetic chunks (nlist 2,000, 1/6 probed) recall@10 against
# exact was 0.9685 re-ranking 512, 0.981 at 768, 0.9865 at 1,024, 0.9915 at 1,536, for
# p50 11.7, 12.6, 11.5 and 23.8 ms on a busy machine (probing 1/5 instead: 0.9695).
RERANK_MIN: Final = 1024
RERANK_PER_HIT: Final = 10  # and this many per hit asked for
ADD_ROWS: Final = 16_384  # rows added to the IVF at once (24 MB of the base at dim 384)


def approx_min_chunks() -> int:
    raw = os.environ.get("CODEVEIL_APPROX_MIN_CHUNKS", "")
    if not raw:
        return APPROX_MIN_CHUNKS
    try:
        return max(int(raw), 1)
    except ValueError:
        raise ValueError(f"CODEVEIL_APPROX_MIN_CHUNKS={raw!r} is not a whole number") from None


def _faiss() -> Any:
    import faiss  # heavy: imported only where an approximate index is built or read

    return faiss


@dataclass
class ApproxPlanes:
    """The IVF-PQ index of each vector plane of one base (rows are base rows)."""

    planes: list[object]  # faiss.IndexIVFPQ per plane (body, header)
    trained_rows: int  # base rows the quantizers were trained on

    @classmethod
    def build(cls, base: np.ndarray, *, like: ApproxPlanes | None = None,
              seed: int = 0) -> ApproxPlanes:
        """IVF-PQ indexes of `base` (float32 [2, n, dim]); with `like`, its trained
        quantizers are reused unless the base outgrew them (`RETRAIN_GROWTH`)."""
        faiss = _faiss()
        n, dim = int(base.shape[1]), int(base.shape[2])
        reuse = like is not None and n <= RETRAIN_GROWTH * like.trained_rows \
            and like.planes[0].d == dim  # type: ignore[attr-defined]
        planes = []
        threads = faiss.omp_get_max_threads()
        # One thread: a background build on a laptop that also runs the editor, and
        # OpenMP's spinning threads measured 6x slower than one on two busy cores.
        faiss.omp_set_num_threads(1)
        try:
            for p in range(base.shape[0]):
                planes.append(cls._plane(base[p], like.planes[p] if reuse and like else None,
                                         seed + p))
        finally:
            faiss.omp_set_num_threads(threads)
        return cls(planes, like.trained_rows if reuse and like is not None else n)

    @staticmethod
    def _plane(vectors: np.ndarray, like: object | None, seed: int) -> object:
        faiss = _faiss()
        n, dim = vectors.shape
        if like is not None:
            index = faiss.clone_index(like)
            index.reset()
        else:
            # k-means wants ~39 points per centroid: fewer lists and PQ centroids for a
            # small base (a test's), the usual 8-bit codes from 10k rows up.
            # 2 sqrt(n) lists (as the server's IVF): 4 sqrt(n) doubled the coarse
            # k-means and the assignment of every row, which dominate the build.
            nlist = int(max(1, min(2 * np.sqrt(n), n // 39, 8192)))
            nbits = int(min(8, max(1, np.log2(max(n // 39, 2)))))
            index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, _pq_m(dim), nbits,
                                     faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(seed)
            sample = np.sort(rng.choice(n, size=min(n, max(TRAIN_SAMPLE, 40 * nlist)),
                                        replace=False))
            index.cp.verbose = False
            index.cp.niter = TRAIN_ITERATIONS
            index.pq.cp.niter = TRAIN_ITERATIONS
            train = np.empty((len(sample), dim), dtype=np.float32)
            for at in range(0, len(sample), RELEASE_ROWS):  # scattered reads: see mapped.py
                train[at : at + RELEASE_ROWS] = vectors[sample[at : at + RELEASE_ROWS]]
                release(vectors)
            index.train(train)
            del train
        for start in range(0, n, ADD_ROWS):  # in slices: the mapped base is not copied
            index.add(np.ascontiguousarray(vectors[start : start + ADD_ROWS]))
            release(vectors)  # each page is read once: none kept resident (mapped.py)
        index.nprobe = nprobe(index.nlist)
        return index

    def untrained_copy(self) -> ApproxPlanes:
        """The trained quantizers with no rows: what a later build reuses (`like`)."""
        faiss = _faiss()
        planes = []
        for p in self.planes:
            empty = faiss.clone_index(p)
            empty.reset()
            planes.append(empty)
        return ApproxPlanes(planes, self.trained_rows)

    def candidates(self, queries: np.ndarray, plane: int, width: int) -> np.ndarray:
        """int64 [m, width]: base rows the IVF ranks first for each unit query row of
        `queries` [m, dim] (-1 where it has fewer)."""
        index = self.planes[plane]
        _, rows = index.search(np.ascontiguousarray(queries, dtype=np.float32),  # type: ignore[attr-defined]
                               width)
        return np.asarray(rows, dtype=np.int64)

    # -- disk -----------------------------------------------------------------------

    def save(self, f: IO[bytes]) -> None:
        """One file: the trained-rows count, then each plane's serialised index."""
        faiss = _faiss()
        blobs = [faiss.serialize_index(p) for p in self.planes]
        np.save(f, np.array([self.trained_rows, len(blobs)], dtype=np.int64))
        for b in blobs:
            np.save(f, b)

    @classmethod
    def load(cls, path: Path, rows: int, dim: int) -> ApproxPlanes:
        """The indexes `save` wrote, checked against the base they index (raises
        ValueError or what faiss raises for a damaged file)."""
        faiss = _faiss()
        with path.open("rb") as f:
            head = np.load(f, allow_pickle=False)
            if head.shape != (2,) or head[1] not in (1, 2):
                raise ValueError("not an approximate vector index")
            planes = [faiss.deserialize_index(np.load(f, allow_pickle=False))
                      for _ in range(int(head[1]))]
        for p in planes:
            if p.ntotal != rows or p.d != dim:
                raise ValueError(f"an approximate index of {p.ntotal} x {p.d} for a base "
                                 f"of {rows} x {dim}")
            p.nprobe = nprobe(p.nlist)
        return cls(planes, int(head[0]))


def _pq_m(dim: int) -> int:
    """Sub-vectors per PQ code: PQ_BYTES where it divides `dim`, each at least 8 values."""
    for m in (PQ_BYTES, 32, 24, 16, 12, 8, 4, 2, 1):
        if dim % m == 0 and dim // m >= 8:
            return m
    return 1


def nprobe(nlist: int) -> int:
    """Lists probed of an IVF of `nlist` (all of a small one's)."""
    return int(min(nlist, max(NPROBE_MIN, round(PROBE_SHARE * nlist))))


def rerank_width(n: int) -> int:
    """Candidates of the IVF re-ranked exactly for the `n` best."""
    return max(RERANK_MIN, RERANK_PER_HIT * n)


def live_candidates(rows: Sequence[int] | np.ndarray, deleted: np.ndarray,
                    keep_base: np.ndarray | None) -> np.ndarray:
    """The candidate base rows that are real, not masked, and (with a mask) kept."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows >= 0]
    ok = ~deleted[rows]
    if keep_base is not None:
        ok &= keep_base[rows]
    return np.unique(rows[ok])
