"""Exact search by meaning on the client: the vectors of the client's own chunk table.

The index covers the chunks of every file of `indexer.local_chunks` that is not pending
(a pending file's vectors are not ready yet), each with two vectors the embedding cache
holds under the caller's model: the one of its embedded text (`Chunk.embed_text`, the
body) and the one of its `path > symbol` header alone (`Chunk.header`), which a search
ranks on its own as a second vote (`retrieval.search.fusion`, `w_header_vector`). A chunk whose
body vector the cache lacks is left out and counted (`LocalVectorIndex.missing`); one
whose header vector it lacks is kept, searched by its body only, and re-read by the
first refresh after the sync has recorded that the cache holds every header. Search is
exact: the cosine of the query with every live vector (all vectors are L2-normalised,
so a dot product), best first. The vectors approximate the
code, so they live only under `.codeveil/vectors/` (0700) and never go to a server.

Layout on disk. A large immutable *base* and a small *delta*, as in `retrieval.indexes.lexical`:

    base-<id>.npy   float32 [2, n, dim] vectors of the base, a plain .npy (memory-mapped):
                    the body vectors, then the header vectors (zeros where none), each
                    plane contiguous (a strided half-row read costs a search +35%)
    base-<id>.npz   the base's chunk metadata, its vectors' xxh3-64 checksum, format
    delta.npz       the pointer: format, model id, dim, base id, the state database's
                    stamp, the deleted base rows, the delta's vectors and metadata, and
                    the file list (path -> digest) the index was built from

Write order: a new base's vectors, then its metadata, then `delta.npz`, each atomically
(temp file, fsync, rename, fsync of the folder); the replaced base is removed last.
Readers go the other way: `delta.npz` names the base it goes with. A crash leaves at
worst an unreferenced base, never a delta naming a base it does not match. Any file that
cannot be read, fails its checksum, or has another format is rebuilt from the state
database and the cache, with one warning; a search never fails for it.

Storage: float32. float16 would halve the disk (1.5 KB -> 0.77 KB per 384-dim chunk),
but measured on 100k clustered unit vectors (dim 384) it moves cosines by up to 8.7e-5
(mean 8.5e-6), which reorders the top 10 of 35% of queries and changes 1% of its
members: no longer the exact ranking the cache's vectors give. float32 also maps
straight into memory, so a new process opens a 100k base in milliseconds with no
conversion pass (float16 had to be widened: 0.37 s). Scores are computed with numpy's
BLAS matrix-vector product, which at 100k measured faster than faiss `IndexFlatIP`
(17 ms vs 23 ms on two cores) and needs no copy of the mapped vectors.

Keeping it current: triggers on `chunk_files` (insert, update, delete) and on
`pending_files` (insert, delete) bump a counter in the state database, next to a random
epoch that changes when the database is recreated. `current()` reads that one row; when
it matches the index's stamp the index in memory (or on disk) is returned as is. Else
the non-pending file list is compared with the one the index holds: only changed, new,
newly stored and deleted files are re-read, their base rows masked and their new rows
put in the delta; when the delta and the masked rows pass a tenth of the base, the two
are merged into a new base. A recreated database, a new model or dim, and a change of
more than half of the chunks rebuild from scratch.

Modules, one job each::

    docs.py      VectorDocs: the rows' chunk locations (retrieval.indexes.derived.columns) and
                 whether each row holds a header vector
    scoring.py   the BLAS thread limit and the top rows of one total order
    index.py     LocalVectorIndex: base + delta + masked rows; exact nearest chunks by
                 body or header vectors, filters, updating and merging
    store.py     LocalVectorStore: `.codeveil/vectors/` on disk, kept in step with the
                 chunk table and the cache (retrieval.indexes.derived.store)
    approx.py    ApproxPlanes: an IVF-PQ index per plane over a large base (past
                 `APPROX_MIN_CHUNKS`), its candidates re-ranked exactly; the delta
                 and masked rows as for exact search
    approx_build.py  that index, built by a detached process of its own per base
    mapped.py    handing the mapped base's pages back after sparse reads, so that the
                 approximate index's process stays small

The names below are imported on first use (indexer.lazy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from retrieval.indexes.local_vectors.index import MERGE_SHARE, LocalVectorIndex
    from retrieval.indexes.local_vectors.scoring import ONE_THREAD_VALUES, one_blas_thread
    from retrieval.indexes.local_vectors.store import (
        DELTA_FILE,
        FORMAT_VERSION,
        REBUILD_SHARE,
        LocalVectorStore,
        read_stamp,
    )

__all__ = ["DELTA_FILE", "FORMAT_VERSION", "MERGE_SHARE", "ONE_THREAD_VALUES",
           "REBUILD_SHARE", "LocalVectorIndex", "LocalVectorStore", "one_blas_thread",
           "read_stamp"]

_HOMES = {
    "DELTA_FILE": "retrieval.indexes.local_vectors.store",
    "FORMAT_VERSION": "retrieval.indexes.local_vectors.store",
    "MERGE_SHARE": "retrieval.indexes.local_vectors.index",
    "ONE_THREAD_VALUES": "retrieval.indexes.local_vectors.scoring",
    "REBUILD_SHARE": "retrieval.indexes.local_vectors.store",
    "LocalVectorIndex": "retrieval.indexes.local_vectors.index",
    "LocalVectorStore": "retrieval.indexes.local_vectors.store",
    "one_blas_thread": "retrieval.indexes.local_vectors.scoring",
    "read_stamp": "retrieval.indexes.local_vectors.store",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
