"""Hybrid ranking: the vector neighbours, BM25 and what the query names, fused.

Each source gives a ranking of chunks; reciprocal-rank fusion (Cormack et al., 2009)
adds `weight / (k + rank)` per ranking a chunk appears in. Ranks, not scores, are fused
because the sources' scores live on unrelated scales (cosine in [-1, 1] after the
encrypted round trip, unbounded BM25 sums, evidence counts).

A long query is cut into parts that fit the model's window (`retrieval.search.query`); each
part is embedded and searched, and the parts' rankings are first fused into one vector
ranking, so a query of ten parts weighs no more against BM25 than a query of one.

The vector side is a `VectorSearch` (this machine's own index, or the server's ranking
re-scored here; `retrieval.search.searcher` picks it), or plain callables, so that the
benchmarks can feed it from plain vectors through the same ranking code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from indexer.location import ChunkLocation
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.lexical import LexicalIndex
from retrieval.search.grouping import Aggregation, Group, Level, diversify, group
from retrieval.search.options import (
    RRF_K,
    Embed,
    Keep,
    Nearest,
    NearestEach,
    SearchOptions,
    VectorSearch,
    ranked,
    rrf,
)
from retrieval.search.path_vote import PathWords
from retrieval.search.query import (
    QUESTION_WORDS,
    STOPWORDS,
    Evidence,
    QueryRefs,
    RepoNames,
    extract_refs,
    lexical_terms,
    split_query,
)
from retrieval.search.ranking_parts import RESCORING, VOTES, Ballots, QueryView, Rescoring, Vote


@dataclass
class Ranking:
    """Fused chunks, best first, and what each source contributed (for explaining)."""

    chunks: list[tuple[ChunkLocation, float]]
    parts: int = 1
    sources: dict[str, int] = field(default_factory=dict)  # source -> candidates it gave
    matched: dict[str, list[str]] = field(default_factory=dict)
    # File-level rankings fused when grouping by file: (paths best first, weight).
    file_lists: list[tuple[list[str], float]] = field(default_factory=list)
    file_best: dict[str, ChunkLocation] = field(default_factory=dict)  # a chunk to show per file
    rrf_k: float = RRF_K
    saturation: float = 1.0  # chunk level: see `retrieval.search.grouping.diversify`
    file_first: bool = False  # chunk level: a file's first chunk takes the file's score


def group_ranking(ranking: Ranking, level: Level, agg: Aggregation | None = None, *,
                  limit: int | None = None) -> list[Group]:
    """`ranking` grouped at `level`; at file level, fused with its file-level rankings.
    At chunk level, `limit` is how many groups must be in their exact place (the rest
    follow in about their order: `diversify`).

    The chunk-based file ranking (chunk scores aggregated per file) and each file-level
    ranking (whole-file BM25) are fused by reciprocal rank; the fused score becomes the
    group's score.
    """
    if level == "chunk":
        return group(diversify(ranking.chunks, ranking.saturation,
                               file_first=ranking.file_first, limit=limit), level)
    groups = group(ranking.chunks, level, agg)
    if level != "file" or not ranking.file_lists:
        return groups
    by_key = {g.key: g for g in groups}
    lists = [[g.key for g in groups]] + [[(p,) for p in paths]
                                         for paths, _ in ranking.file_lists]
    weights = [1.0] + [w for _, w in ranking.file_lists]
    out = []
    for key, score in ranked(rrf(lists, k=ranking.rrf_k, weights=weights)):
        g = by_key.get(key)
        if g is None:
            best = ranking.file_best[key[0]]
            g = Group(key, best, 0.0, [best])
        g.score = score
        out.append(g)
    return out


class HybridRanker:
    """Ranks the chunks of one repo for a query, from the vectors, BM25 and evidence."""

    def __init__(self, lexical: LexicalIndex, embed: Embed, nearest: Nearest,
                 count_tokens: Callable[[str], int], max_tokens: int, *,
                 count_many: Callable[[Sequence[str]], list[int]] | None = None,
                 nearest_header: Nearest | None = None,
                 nearest_each: NearestEach | None = None,
                 nearest_header_each: NearestEach | None = None) -> None:
        """`nearest` (and `nearest_header`, the header vectors') ranks chunks for one
        query vector; `nearest_each` (`nearest_header_each`), where given, for all the
        parts of a query at once, and is used when no filter applies."""
        self.lexical = lexical
        self.embed = embed
        self.nearest = nearest
        self.nearest_header = nearest_header
        self.nearest_each = nearest_each
        self.nearest_header_each = nearest_header_each
        # The static tier (`use_static`): every chunk's static vector, and the query's.
        self.static: VectorSearch | None = None
        self.embed_static: Embed | None = None
        self.count_tokens = count_tokens
        self.count_many = count_many
        self.max_tokens = max_tokens
        self._names: RepoNames | None = None
        self._path_words: PathWords | None = None
        self.face_chunks = 3  # the largest file the path vote speaks for, in chunks
        # The parts of a ranking, in order (retrieval.search.ranking_parts).
        self.votes: tuple[Vote, ...] = VOTES
        self.rescoring: tuple[Rescoring, ...] = RESCORING

    @classmethod
    def over(cls, lexical: LexicalIndex, embed: Embed, vectors: VectorSearch,
             count_tokens: Callable[[str], int], max_tokens: int, *,
             count_many: Callable[[Sequence[str]], list[int]] | None = None) -> HybridRanker:
        """A ranker whose vector side is `vectors`."""
        ranker = cls(lexical, embed, vectors.nearest, count_tokens, max_tokens,
                     count_many=count_many)
        ranker.use_vectors(vectors)
        return ranker

    def use_vectors(self, vectors: VectorSearch) -> None:
        """Rank by `vectors` from now on (a refreshed local index, say): its nearest
        chunks by body vectors, and by header vectors where it has them."""
        self.nearest = vectors.nearest
        self.nearest_each = vectors.nearest_each
        if vectors.headers:
            self.nearest_header = partial(vectors.nearest, header=True)
            self.nearest_header_each = partial(vectors.nearest_each, header=True)
        else:
            self.nearest_header = self.nearest_header_each = None

    def use_static(self, static: VectorSearch | None, embed: Embed | None) -> None:
        """Rank by the static model's vectors (`static`, the query's by `embed`) as well,
        or no longer (None)."""
        self.static = static
        self.embed_static = embed if static is not None else None

    def use(self, lexical: LexicalIndex) -> None:
        """Rank over another (refreshed) lexical index from now on."""
        if lexical is not self.lexical:
            self.lexical = lexical
            self._names = None
            self._path_words = None

    def names(self) -> RepoNames:
        """Paths and symbol names of the repo (built on first use, then kept)."""
        if self._names is None:
            paths, symbols, lines = self.lexical.columns()
            self._names = RepoNames(paths, symbols, [tuple(x) for x in lines.tolist()])
        return self._names

    def path_words(self) -> PathWords:
        """The repo's files by the words of their paths (built on first use, then kept)."""
        if self._path_words is None:
            by_path = self.names().by_path
            self._path_words = PathWords(list(by_path), by_path,
                                         max_chunks=self.face_chunks)
        return self._path_words

    def rank(self, query: str, options: SearchOptions = SearchOptions(), *,
             mask: np.ndarray | None = None,
             keep: Keep | None = None) -> Ranking:
        """Fused chunk ranking of `query`: each vote of `self.votes` cast, fused by
        reciprocal rank, then each step of `self.rescoring` (retrieval.search.ranking_parts).

        `mask` (over the lexical index's docs) and `keep` (on any doc) apply the same
        filter to every source; the vector side is asked for more when filtering.
        """
        o = options
        q = self.view(query, o, mask, keep)
        ballots = Ballots()
        for v in self.votes:
            v.cast(self, q, ballots)
        cap = min(o.depth, o.scored_depth)
        fused = ballots.fuse(o.rrf_k, cap)
        for step in self.rescoring:
            fused = step.apply(q, ballots, fused, cap)
        chunks = [(ballots.docs[key], score) for key, score in ranked(fused)]
        if keep is not None:
            chunks = [(d, s) for d, s in chunks if keep(d)]
        result = Ranking(chunks, parts=len(q.parts), sources=ballots.sources,
                         matched=q.evidence[1] if q.evidence is not None else {},
                         rrf_k=o.rrf_k, saturation=o.saturation,
                         file_first=o.file_first and q.prose)
        w_file = o.w_file_lexical_prose if q.prose else o.w_file_lexical
        if o.hybrid and w_file and len(self.lexical):
            files = self.lexical.file_top(q.lex_query, o.depth, mask=mask, dedupe=q.dedupe,
                                          max_terms=o.max_query_terms)
            result.file_lists.append(([p for p, _ in files], w_file))
            result.file_best = self.file_best([p for p, _ in files], q.bm25)
            ballots.sources["file_lexical"] = len(files)
        return result

    def view(self, query: str, o: SearchOptions, mask: np.ndarray | None,
             keep: Keep | None) -> QueryView:
        """What every part of a ranking of `query` reads, derived once."""
        parts = (split_query(query, self.count_tokens, self.max_tokens,
                             count_many=self.count_many)
                 if o.split != "none" else [query])
        if o.split == "first":
            parts = parts[:1]
        refs = extract_refs(query, identifiers=o.identifier_refs)
        prose = not refs
        bm25: list[tuple[int, float]] = []
        lex_query, dedupe = self._lexical_query(query, prose, o)
        if o.hybrid and len(self.lexical):
            bm25 = self.lexical.top(lex_query, o.depth, mask=mask, dedupe=dedupe,
                                    max_terms=o.max_query_terms)
        evidence = None
        if o.evidence and len(self.lexical):
            evidence = self._evidence_ranking(refs, bm25, mask, o.depth, stems=o.stem_evidence)
        w_header = o.w_header_vector_prose if prose else o.w_header_vector
        w_vector = o.w_vector
        w_static = o.as_vectors_land(o.w_static, o.w_static_meaning)
        if refs.identifier and evidence is not None:
            # A bare name the repo defines: its definition is found by name, and the
            # vectors only add look-alikes. A name nothing defines keeps them.
            w_vector *= o.w_meaning_identifier
            w_header *= o.w_meaning_identifier
            w_static *= o.w_meaning_identifier
        return QueryView(query, o, parts, refs, prose, lex_query, dedupe, bm25, evidence, mask,
                         keep, w_vector, w_header, w_static)

    @staticmethod
    def _lexical_query(query: str, prose: bool, o: SearchOptions
                       ) -> tuple[str | list[str], bool]:
        """BM25's terms for `query` and whether to count each once. A query that names
        code (an issue text, an identifier lookup) drops stop words and weighs code
        words; one in plain words keeps plain terms."""
        if not prose and (o.stopwords or o.code_term_weight > 1):
            # Each term listed once, or code_term_weight times.
            return lexical_terms(query, stopwords=o.stopwords,
                                 code_weight=o.code_term_weight), False
        if prose and o.question_words_out:
            terms = lexical_terms(query, stop=STOPWORDS | QUESTION_WORDS)
            # A question of frame words only ("how does it work") keeps them all.
            return (terms, False) if terms else (query, o.dedupe_terms)
        return query, o.dedupe_terms

    def file_best(self, paths: list[str], bm25: list[tuple[int, float]]
                  ) -> dict[str, ChunkLocation]:
        """A chunk to show (or to vote with) for each file: its best BM25 chunk, else its
        first."""
        best: dict[str, ChunkLocation] = {}
        for i, _ in bm25:
            d = self.lexical.doc(i)
            best.setdefault(d.path, d)
        for p in paths:
            if p not in best:
                docs = self.lexical.docs_of(p)
                if len(docs):
                    best[p] = self.lexical.doc(int(docs[0]))
        return best

    def vector_ranking(self, vectors: np.ndarray, o: SearchOptions,
                        keep: Keep | None, nearest: Nearest,
                        each: NearestEach | None) -> list[tuple[ChunkLocation, float]]:
        """One vector ranking for the query (one vector per part), however many parts."""
        if len(vectors) == 1 or o.split == "mean":
            v = vectors.mean(axis=0)
            v /= max(float(np.linalg.norm(v)), 1e-12)
            return self._nearest(nearest, v, o.depth, keep)
        if each is not None and keep is None:
            per_part = each(vectors, o.depth)
        elif each is not None and isinstance(keep, HitFilter):
            per_part = each(vectors, o.depth, keep=keep)
        else:
            per_part = [self._nearest(nearest, v, o.depth, keep) for v in vectors]
        docs: dict[tuple[str, int, int], ChunkLocation] = {}
        for hits in per_part:
            for d, _ in hits:
                docs.setdefault(d.key, d)
        if o.split == "max":
            best: dict[tuple[str, int, int], float] = {}
            for hits in per_part:
                for d, s in hits:
                    best[d.key] = max(best.get(d.key, -2.0), s)
            return [(docs[key], s) for key, s in ranked(best)][: o.depth]
        weights = [o.w_first_part] + [1.0] * (len(per_part) - 1)
        fused = rrf([[d.key for d, _ in hits] for hits in per_part], k=o.rrf_k, weights=weights,
                    cap=min(o.depth, o.scored_depth))
        return [(docs[key], s) for key, s in ranked(fused)][: o.depth]

    @staticmethod
    def _nearest(nearest: Nearest, vector: np.ndarray, n: int,
                 keep: Keep | None) -> list[tuple[ChunkLocation, float]]:
        return nearest(vector, n) if keep is None else nearest(vector, n, keep=keep)

    def _evidence_ranking(
        self, refs: QueryRefs, bm25: list[tuple[int, float]], mask: np.ndarray | None,
        depth: int, *, stems: bool = False,
    ) -> tuple[list[int], dict[str, list[str]]] | None:
        """Docs the query names, strongest evidence first, ties broken by BM25."""
        if not refs:
            return None
        ev = Evidence.resolve(refs, self.names(), stems=stems)
        if not ev:
            return None
        lexical_score = dict(bm25)
        items = [(i, s) for i, s in ev.scores.items() if mask is None or mask[i]]
        items.sort(key=lambda it: (-it[1], -lexical_score.get(it[0], 0.0), it[0]))
        return [i for i, _ in items[:depth]], ev.matched
