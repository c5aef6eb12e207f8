"""Scoring many rows at once: the BLAS thread limit and the top-m of one total order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import numpy as np
from threadpoolctl import ThreadpoolController

#: Scoring at most this many vector values (166k chunks of dim 384) runs on one BLAS
#: thread. A query's scoring is a matrix-vector product, bound by memory, and a pool of
#: threads on a busy machine waits for its slowest: measured side by side with two other
#: processes busy, 6.7k chunks took 8.0 ms on two threads and 1.2 ms on one, 100k chunks
#: 30 ms and 23.5 ms.
ONE_THREAD_VALUES: Final = 64_000_000

_blas: ThreadpoolController | None = None


@contextlib.contextmanager
def one_blas_thread(when: bool = True) -> Iterator[None]:
    """BLAS limited to one thread inside (when `when`); about 25 us to enter."""
    global _blas
    if not when:
        yield
        return
    if _blas is None:
        _blas = ThreadpoolController()  # inspects the loaded libraries once
    with _blas.limit(limits=1, user_api="blas"):
        yield


def top_rows(scores: np.ndarray, m: int) -> np.ndarray:
    """Rows of the `m` highest scores, best first, ties by row: the first `m` of one
    total order, so a wider call extends a narrower one's answer."""
    if m >= len(scores):
        cand = np.arange(len(scores))
    else:
        part = np.argpartition(-scores, m - 1)[:m]
        cand = np.flatnonzero(scores >= scores[part].min())  # every tie at the edge
    return cand[np.lexsort((cand, -scores[cand]))][:m]

