"""The parts a ranking is composed of: votes, each a ranking of chunks with a weight,
fused by reciprocal rank, then rescoring steps over the fused scores, in order.

`HybridRanker.rank` (retrieval.search.fusion) prepares what every part reads once (the query
cut into parts, the names it holds, its BM25 and evidence rankings: a `QueryView`),
asks each vote of `VOTES` for its ballot, fuses them, and applies each step of
`RESCORING`. A new signal is a new part here, named in the benchmarks' ablation by the
option that weighs it, not another branch in `rank`.

Votes:       vector (the body vectors), header_vector (the `path > symbol` vectors),
             lexical (BM25), path (retrieval.search.path_vote), file (whole-file BM25),
             evidence (what the query names).
Rescoring:   prefer_code (tests, docs, examples, config count less unless asked for),
             prefer_primary (legacy copies, declarations, barrels count less).
Diversity among the chunks printed is applied when they are grouped
(retrieval.search.grouping.diversify), since it orders a list, not scores.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np

from indexer.location import ChunkLocation
from retrieval.search.options import (
    Embed,
    Keep,
    Nearest,
    NearestEach,
    SearchOptions,
    VectorSearch,
    peaked,
    rrf,
)
from retrieval.search.query import QueryRefs, RepoNames
from retrieval.search.signals import prefer_code, prefer_primary

if TYPE_CHECKING:
    from retrieval.indexes.lexical import LexicalIndex
    from retrieval.search.path_vote import PathWords

DocKey = tuple[str, int, int]
# The votes cast by words and names (what `non_code_scope="words"` scales).
WORD_SOURCES: Final = frozenset({"lexical", "evidence", "path", "file"})


class Ranker(Protocol):
    """What the parts read of the ranker that runs them (`retrieval.search.fusion.
    HybridRanker`): the indexes it ranks over and its vector ranking."""

    lexical: LexicalIndex
    embed: Embed
    nearest: Nearest
    nearest_header: Nearest | None
    nearest_each: NearestEach | None
    nearest_header_each: NearestEach | None
    static: VectorSearch | None
    embed_static: Embed | None

    def names(self) -> RepoNames: ...

    def path_words(self) -> PathWords: ...

    def file_best(self, paths: list[str], bm25: list[tuple[int, float]]
                  ) -> dict[str, ChunkLocation]: ...

    def vector_ranking(self, vectors: np.ndarray, o: SearchOptions, keep: Keep | None,
                       nearest: Nearest,
                       each: NearestEach | None) -> list[tuple[ChunkLocation, float]]: ...


@dataclass
class QueryView:
    """What the parts of one ranking read: the query and what was derived from it once."""

    text: str
    options: SearchOptions
    parts: list[str]  # the query cut to fit the model's window
    refs: QueryRefs  # the paths, symbols and frames it names
    prose: bool  # names nothing: plain words
    lex_query: str | list[str]  # BM25's terms for the query
    dedupe: bool  # whether BM25 counts each term once
    bm25: list[tuple[int, float]]  # (lexical doc, score), best first
    evidence: tuple[list[int], dict[str, list[str]]] | None  # docs it names, and the names
    mask: np.ndarray | None
    keep: Keep | None
    w_vector: float  # the vectors' weights for this query (a bare name's: none)
    w_header: float
    w_static: float = 0.0
    _vectors: np.ndarray | None = None
    _static: np.ndarray | None = None

    @property
    def short(self) -> bool:
        """A question, not an issue text: the parts tuned on short questions only (the
        path vote, `prefer_primary`) leave a long query's ranking as SWE-bench measured it."""
        return len(self.text.split()) <= self.options.short_query_words

    def vectors(self, ranker: Ranker) -> np.ndarray:
        """The parts' vectors, embedded on first use (a ranking with no vote by meaning
        never loads the model)."""
        if self._vectors is None:
            self._vectors = ranker.embed(self.parts)
        return self._vectors


    def static_vectors(self, ranker: Ranker) -> np.ndarray:
        """The parts' static vectors (`indexer.static_embedder`), on first use."""
        if self._static is None:
            assert ranker.embed_static is not None
            self._static = ranker.embed_static(self.parts)
        return self._static


@dataclass
class Ballots:
    """The votes cast so far: one ranking of chunk keys per vote, its weight, its name."""

    lists: list[list[DocKey]] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    voters: list[str] = field(default_factory=list)
    docs: dict[DocKey, ChunkLocation] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)  # vote -> candidates it gave

    def cast(self, source: str, ranking: Iterable[ChunkLocation], weight: float) -> None:
        keys = []
        for d in ranking:
            self.docs.setdefault(d.key, d)
            keys.append(d.key)
        self.lists.append(keys)
        self.weights.append(weight)
        self.voters.append(source)
        self.sources[source] = len(keys)

    def fuse(self, k: float, cap: int, only: frozenset[str] | None = None
             ) -> dict[DocKey, float]:
        """Reciprocal-rank fusion of the ballots (of the votes in `only`, if given)."""
        chosen = [i for i, v in enumerate(self.voters) if only is None or v in only]
        return rrf([self.lists[i] for i in chosen], k=k,
                   weights=[self.weights[i] for i in chosen], cap=cap)


class Vote(Protocol):
    """One ranking of chunks for the fusion, or none for this query."""

    name: str

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None: ...


class Rescoring(Protocol):
    """A step over the fused scores."""

    name: str

    def apply(self, q: QueryView, ballots: Ballots, fused: dict[DocKey, float],
              cap: int) -> dict[DocKey, float]: ...


class VectorVote:
    """The chunks nearest by meaning: by body vectors, or with `header` by the vectors of
    each chunk's `path > symbol` header."""

    def __init__(self, header: bool = False) -> None:
        self.header = header
        self.name = "header_vector" if header else "vector"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        weight = q.w_header if self.header else q.w_vector
        nearest = ranker.nearest_header if self.header else ranker.nearest
        each = ranker.nearest_header_each if self.header else ranker.nearest_each
        if not weight or nearest is None:
            return
        hits = ranker.vector_ranking(q.vectors(ranker), q.options, q.keep, nearest, each)
        ballots.cast(self.name, (d for d, _ in hits), weight)


class StaticVote:
    """The chunks nearest by the static model's vectors, which every chunk has from the
    moment `index` returns: meaning while MiniLM's vectors are still being built. Its
    weight yields to theirs as they land (`QueryView.w_static`)."""

    name = "static"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        static = ranker.static
        if not q.w_static or static is None or ranker.embed_static is None:
            return
        hits = ranker.vector_ranking(q.static_vectors(ranker), q.options, q.keep,
                                     static.nearest, static.nearest_each)
        ballots.cast(self.name, (d for d, _ in hits), q.w_static)


class LexicalVote:
    """BM25 over the chunks. A query in plain words has a smaller vote, a full one when
    its BM25 ranking is peaked (its words are the code's own)."""

    name = "lexical"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        o = q.options
        if not o.hybrid or not len(ranker.lexical):
            return
        weight = o.w_lexical
        if q.prose and o.w_lexical_prose is not None:
            # The smaller vote yields to meaning only as far as meaning votes: while no
            # vector is built (a first index) BM25 is the one ranking by text and votes
            # in full; the share of the vectors' vote moves it toward w_lexical_prose.
            weight = o.as_vectors_land(o.w_lexical, o.w_lexical_prose)
        if q.prose and o.w_lexical_prose_peaked is not None and peaked(q.bm25,
                                                                      o.prose_peak_ratio):
            weight = o.w_lexical_prose_peaked
        ballots.cast(self.name, (ranker.lexical.doc(i) for i, _ in q.bm25), weight)


class PathVote:
    """The small files whose own path holds the query's words (retrieval.search.path_vote)."""

    name = "path"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        if (not q.options.hybrid or not q.options.w_path or not q.short
                or not len(ranker.lexical)):
            return
        doc_path = ranker.names().doc_path
        best: dict[str, int] = {}
        for i, _ in q.bm25:
            best.setdefault(doc_path[i], i)
        faces = ranker.path_words().rank(q.text, best, q.options.depth)
        if q.mask is not None:
            faces = [i for i in faces if q.mask[i]]
        if faces:
            ballots.cast(self.name, (ranker.lexical.doc(i) for i in faces),
                         q.options.w_path)


class FileVote:
    """Whole files by BM25 over all their chunks, for a question in plain words: its words
    are often spread over a file (its name, its definitions' names, its comments) with
    no one chunk holding them all. Each file votes with its best BM25 chunk, else its
    first. `w_file_vote` while no vector is built, `w_file_vote_meaning` once all are."""

    name = "file"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        o = q.options
        # Like BM25's prose vote it yields to meaning as the vectors land: where every
        # vector votes, a file of one function (CoSQA) is only BM25 again.
        weight = o.as_vectors_land(o.w_file_vote, o.w_file_vote_meaning)
        if not o.hybrid or not weight or not q.prose or not q.short or not len(ranker.lexical):
            return
        files = [path for path, _ in ranker.lexical.file_top(
            q.lex_query, o.depth, mask=q.mask, dedupe=q.dedupe, max_terms=o.max_query_terms)]
        best = ranker.file_best(files, q.bm25)
        if best:
            ballots.cast(self.name, (best[p] for p in files if p in best), weight)


class EvidenceVote:
    """The chunks of the files, symbols and frames the query names."""

    name = "evidence"

    def cast(self, ranker: Ranker, q: QueryView, ballots: Ballots) -> None:
        if q.evidence is not None:
            ballots.cast(self.name, (ranker.lexical.doc(i) for i in q.evidence[0]),
                         q.options.w_evidence)


class PreferCode:
    """Code first: what the votes (every vote's, or the words') gave tests, docs,
    examples and config counts `w_non_code` as much, unless the query asks for them."""

    name = "prefer_code"

    def apply(self, q: QueryView, ballots: Ballots, fused: dict[DocKey, float],
              cap: int) -> dict[DocKey, float]:
        o = q.options
        if o.w_non_code == 1.0:
            return fused
        scaled = fused
        if o.non_code_scope == "words":
            scaled = ballots.fuse(o.rrf_k, cap, only=WORD_SOURCES)
        return prefer_code(fused, scaled, ballots.docs, q.text, o.w_non_code)


class PreferPrimary:
    """The implementation before what stands beside it (retrieval.search.signals.is_secondary)."""

    name = "prefer_primary"

    def apply(self, q: QueryView, ballots: Ballots, fused: dict[DocKey, float],
              cap: int) -> dict[DocKey, float]:
        if not q.short:
            return fused
        return prefer_primary(fused, ballots.docs, q.text, q.options.w_secondary)


VOTES: Final[tuple[Vote, ...]] = (VectorVote(), VectorVote(header=True), StaticVote(),
                                  LexicalVote(),
                                  PathVote(), FileVote(), EvidenceVote())
RESCORING: Final[tuple[Rescoring, ...]] = (PreferCode(), PreferPrimary())
