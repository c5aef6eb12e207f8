"""One query over several repositories: `codeveil search -C service -C client ...`.

Each repository keeps its own index, workspace and key; a query is ranked in each, and
the best MERGE_DEPTH hits of each are merged into one ranking. Fused scores alone do not
compare across repositories: a reciprocal-rank sum rewards agreement between sources
within one repository, so the best hit of a repository that holds no answer scores like
the best hit of the one that does (merged by fused score alone, Acc@5 fell 11.7 points
below searching the answer's repository alone, on the report half of
bench/multi_repo.py). The merge therefore fuses two rankings of the union by reciprocal
rank: by fused score, and by the cosine of each hit's chunk vector with the query, which
the one model makes comparable everywhere (1.0 point below alone on the report half).
The depth, weight and constant were chosen on the tune half. Repositories built with the
same model share one embedder, so the model loads once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import numpy as np

from indexer.chunk import chunk_header
from indexer.embed_cache import cache_key
from indexer.embedder import Embedder
from indexer.embedder_registry import embedder_for_model_id
from indexer.errors import CodeveilError
from retrieval.faces.api import Index
from retrieval.search.coverage import Coverage
from retrieval.search.hits import Hit
from retrieval.search.limits import SEARCH
from sync.checkout.config import find_root, load_config
from sync.checkout.server_contact import Unreachable

#: Hits of each repository that enter the merge (at least k).
MERGE_DEPTH: Final = 20
#: The cosine ranking's weight beside the fused one's (1.0), and the reciprocal-rank
#: constant of the merge: chosen on the tune half of bench/multi_repo.py.
COSINE_WEIGHT: Final = 1.0
MERGE_RRF_K: Final = 20.0


class MultiIndex:
    """The indexes of several folders, searched as one. Each folder must be indexed."""

    def __init__(self, paths: Sequence[str | Path], *, embedder: Embedder | None = None
                 ) -> None:
        if not paths:
            raise CodeveilError("no repository to search")
        roots: list[Path] = []
        for p in paths:
            root = find_root(Path(p))
            if root in roots:
                raise CodeveilError(f"{p} is the repository {root} named twice")
            roots.append(root)
        shared: dict[str, Embedder | None] = {}
        query_caches: dict[str, OrderedDict[str, np.ndarray]] = {}
        self.indexes: list[Index] = []
        for root in roots:
            model_id = load_config(root).model_id
            if embedder is None and model_id not in shared:
                shared[model_id] = embedder_for_model_id(model_id)
            idx = Index(root, embedder=embedder or shared[model_id])
            # One query cache per model: a query is embedded once, not once per repo.
            idx._query_cache = query_caches.setdefault(model_id, idx._query_cache)
            # The merge compares fused scores across repositories, which holds only when
            # every repository casts the same votes: a bare name keeps its vectors here,
            # also in the repository that defines it (there its vote is otherwise
            # dropped, and its fused scores would sink below the others').
            idx.search_options = replace(idx.search_options, w_meaning_identifier=1.0)
            self.indexes.append(idx)

    @property
    def roots(self) -> list[Path]:
        return [idx.root for idx in self.indexes]

    def search(self, query: str, k: int = SEARCH.default, *, path: str | None = None,
               language: str | None = None, kind: str | Sequence[str] | None = None,
               group: str = "chunk") -> list[Hit]:
        """The `k` best hits over every repository, best first, each with its `repo`
        (the repository's folder); the options as `Index.search`'s, applied in each.
        `score` is the merge's (higher is better, within this list)."""
        hits: list[Hit] = []
        for idx in self.indexes:
            found = idx.search(query, k=max(k, MERGE_DEPTH), path=path, language=language,
                               kind=kind, group=group)
            hits.extend(replace(h, repo=str(idx.root)) for h in found)
        if len(self.indexes) == 1 or not hits:
            return hits[:k]
        by_score = sorted(range(len(hits)), key=lambda i: -hits[i].score)
        cosines = self._cosines(query, hits)
        by_cosine = sorted(range(len(hits)), key=lambda i: -cosines[i])
        merged = [0.0] * len(hits)
        for weight, order in ((1.0, by_score), (COSINE_WEIGHT, by_cosine)):
            for rank, i in enumerate(order):
                merged[i] += weight / (MERGE_RRF_K + rank + 1)
        # Ties go to the higher fused score, then to the repository named first.
        best = sorted(range(len(hits)), key=lambda i: (-merged[i], -hits[i].score, i))
        return [replace(hits[i], score=merged[i]) for i in best[:k]]

    def _cosines(self, query: str, hits: list[Hit]) -> list[float]:
        """The cosine of the query with each hit's chunk vector (the embedding cache's,
        by the chunk's embedded text); -2 where there is none (a stale hit)."""
        out = [-2.0] * len(hits)
        for idx in self.indexes:
            rows = [i for i, h in enumerate(hits) if h.repo == str(idx.root) and not h.stale]
            if not rows:
                continue
            q = idx._query_vectors([query])[0]  # cached by the search just made
            embedder = idx.embedder
            keys = [cache_key(embedder.model_id,
                              f"{chunk_header(hits[i].path, hits[i].symbol)}\n{hits[i].text}")
                    for i in rows]
            vectors = embedder.cache.get_many(keys, embedder.dim)
            for i, key in zip(rows, keys, strict=True):
                if key in vectors:
                    out[i] = float(vectors[key] @ q)
        return out

    def offline(self) -> dict[str, Unreachable]:
        """The repositories whose last search answered from this machine's copy alone,
        their server unreachable (`Index.offline`), by folder."""
        return {str(idx.root): idx.offline for idx in self.indexes if idx.offline is not None}

    def coverage(self) -> dict[str, Coverage]:
        """`Index.coverage()` of each repository, by its folder."""
        return {str(idx.root): idx.coverage() for idx in self.indexes}

    def close(self) -> None:
        for idx in self.indexes:
            idx.close()

    def __enter__(self) -> MultiIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MultiIndex"]
