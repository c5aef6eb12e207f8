"""Synthetic embeddings shaped like all-MiniLM-L6-v2's of code, for the benchmarks that
time a vector search without a model (bench/query_latency.py, bench/local_vectors.py)."""

from __future__ import annotations

import numpy as np

DIM = 384
PER_FILE = 10  # chunks per file
SPECTRUM = 0.4
MEAN_NORM = 0.5
LEVELS = ((20_000, 0.5), (500, 0.5), (PER_FILE, 0.6))
LEAF = 0.6
QUERY_NOISE = 2.5


def synthetic(n: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` corpus vectors and `queries` query vectors, unit norm, float32.

    Code embeddings are anisotropic (a common direction, a spectrum that falls off) and
    nested: a package's chunks are closer to each other than to the rest, a file's closer
    still. So: a covariance with a power-law spectrum in a random basis, a common mean,
    and three levels of centres (areas of ~20k chunks, packages of ~500, files of
    PER_FILE) each drawn around its parent; a chunk is its file's centre plus noise.
    A query is a chunk plus more noise (a question is phrased unlike the code it finds).
    The constants were fitted to 12k real chunks of Python packages embedded with
    all-MiniLM-L6-v2 and to 60 real queries: nearest-neighbour similarities, the
    spectrum, and IVF recall against nprobe (docs/benchmarks.md, "Query latency").
    """
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((DIM, DIM)))
    spectrum = np.arange(1, DIM + 1, dtype=np.float64) ** -SPECTRUM
    spectrum /= np.sqrt((spectrum**2).sum())
    shape = (basis * spectrum).T.astype(np.float32)  # z @ shape: the spectrum, E|.|^2 = 1
    mean = rng.standard_normal(DIM).astype(np.float32)
    centres = (MEAN_NORM * mean / np.linalg.norm(mean))[None, :]
    owner = np.zeros(n, np.int64)
    for size, scale in LEVELS:
        groups = max(1, n // size)
        point_group = np.arange(n) * groups // n  # contiguous blocks nest level by level
        first_point = np.searchsorted(point_group, np.arange(groups))
        noise = rng.standard_normal((groups, DIM)).astype(np.float32) @ shape
        centres = centres[owner[first_point]] + scale * noise
        owner = point_group
    corpus = np.empty((n, DIM), np.float32)
    for start in range(0, n, 100_000):
        stop = min(n, start + 100_000)
        noise = rng.standard_normal((stop - start, DIM)).astype(np.float32) @ shape
        corpus[start:stop] = centres[owner[start:stop]] + LEAF * noise
    picked = corpus[rng.integers(0, n, queries)]
    noise = rng.standard_normal((queries, DIM)).astype(np.float32) @ shape
    query = picked / np.linalg.norm(picked, axis=1, keepdims=True) + QUERY_NOISE * noise
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    query /= np.linalg.norm(query, axis=1, keepdims=True)
    return corpus, query.astype(np.float32)
