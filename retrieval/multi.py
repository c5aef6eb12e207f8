"""One query over several repositories: `codeveil search -C service -C client ...`.

Each repository keeps its own index, workspace and key; a query is ranked in each, and
the hits are merged by fused score. The fused scores of two repositories are comparable:
both are weighted reciprocal-rank sums over the same sources with the same weights, so a
hit that leads every source of its repository scores alike whichever repository it is
in, and a repository where the query matches nothing well does not push its best (weak)
hits above another's strong ones. Repositories built with the same model share one
embedder, so the model loads once and the query is embedded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from indexer.embedder import Embedder
from indexer.embedder_registry import embedder_for_model_id
from indexer.errors import CodeveilError
from retrieval.api import Index
from retrieval.hits import Hit
from sync.config import find_root, load_config


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
        self.indexes: list[Index] = []
        for root in roots:
            model_id = load_config(root).model_id
            if embedder is None and model_id not in shared:
                shared[model_id] = embedder_for_model_id(model_id)
            self.indexes.append(Index(root, embedder=embedder or shared[model_id]))

    @property
    def roots(self) -> list[Path]:
        return [idx.root for idx in self.indexes]

    def search(self, query: str, k: int = 10, *, path: str | None = None,
               language: str | None = None, kind: str | Sequence[str] | None = None,
               group: str = "chunk") -> list[Hit]:
        """The `k` best hits over every repository, best first, each with its `repo`
        (the repository's folder); the options as `Index.search`'s, applied in each."""
        hits: list[Hit] = []
        for idx in self.indexes:
            found = idx.search(query, k=k, path=path, language=language, kind=kind,
                               group=group)
            hits.extend(replace(h, repo=str(idx.root)) for h in found)
        # Ties (rare: equal fused scores) go to the repository named first.
        order = sorted(range(len(hits)), key=lambda i: -hits[i].score)
        return [hits[i] for i in order[:k]]

    def coverage(self) -> dict[str, dict[str, int | bool]]:
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
