"""Hybrid ranking: the vector neighbours, BM25 and what the query names, fused.

Each source gives a ranking of chunks; reciprocal-rank fusion (Cormack et al., 2009)
adds `weight / (k + rank)` per ranking a chunk appears in. Ranks, not scores, are fused
because the sources' scores live on unrelated scales (cosine in [-1, 1] after the
encrypted round trip, unbounded BM25 sums, evidence counts).

A long query is cut into parts that fit the model's window (`retrieval.query`); each
part is embedded and searched, and the parts' rankings are first fused into one vector
ranking, so a query of ten parts weighs no more against BM25 than a query of one.

The vector side is a `VectorSearch` (this machine's own index, or the server's ranking
re-scored here; `retrieval.searcher` picks it), or plain callables, so that the
benchmarks can feed it from plain vectors through the same ranking code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Literal, Protocol, TypeVar

import numpy as np

from indexer.location import ChunkLocation
from retrieval.filters import HitFilter
from retrieval.grouping import Aggregation, Group, Level, diversify, group
from retrieval.lexical import LexicalIndex
from retrieval.path_vote import PathWords
from retrieval.query import (
    Evidence,
    QueryRefs,
    RepoNames,
    extract_refs,
    lexical_terms,
    split_query,
)
from retrieval.ranking_parts import RESCORING, VOTES, Ballots, QueryView, Rescoring, Vote

# Measured (docs/benchmarks.md, "Search quality"): 20 beats the customary 60 on SWE-bench
# and CoSQA alike. At 60 the fused scores of the first ranks are nearly equal, so summing
# a file's chunks (grouping) counts its chunks more than it weighs how good they are.
RRF_K: Final = 20.0
DEPTH: Final = 100

K = TypeVar("K", bound=Hashable)

# How the parts of a long query combine: "rrf" fuses the parts' rankings, "max" ranks by
# the best cosine over parts, "mean" searches the mean of the parts' vectors. "none"
# embeds the query whole (the embedder averages its token windows); "first" searches
# the first part only, which is what a model's own truncation does (a baseline).
SplitMode = Literal["rrf", "max", "mean", "none", "first"]

# Embeds texts that fit the window: float32 [n, dim], unit rows.
Embed = Callable[[Sequence[str]], np.ndarray]
# A filter on hits: a `HitFilter` (which a local index applies as a mask before scoring)
# or any predicate (applied to hits as they come).
Keep = Callable[[ChunkLocation], bool]


class Nearest(Protocol):
    """The `n` chunks nearest to a query vector: (doc, cosine), best first; with
    `keep`, the `n` nearest of the chunks it keeps."""

    def __call__(self, vector: np.ndarray, n: int, *,
                 keep: Keep | None = None) -> list[tuple[ChunkLocation, float]]: ...


class NearestEach(Protocol):
    """`Nearest` of each row of a matrix of query vectors, at once (one pass over the
    vectors); `keep` is a `HitFilter` or None."""

    def __call__(self, vectors: np.ndarray, n: int, *,
                 keep: HitFilter | None = None) -> list[list[tuple[ChunkLocation, float]]]: ...


class VectorSearch(Protocol):
    """The vector side of a search: chunks nearest to query vectors, by each chunk's body
    vector or, with `header`, by its `path > symbol` header vector. Implemented by the
    sealed workspace's own index (`retrieval.local_vectors.LocalVectorIndex`) and by the
    server-search re-ranker (`retrieval.server_vectors.ServerVectors`)."""

    #: Whether `header=True` ranks anything (else no header-vector vote is cast).
    headers: bool

    def nearest(self, vector: np.ndarray, n: int, *, keep: Keep | None = None,
                header: bool = False) -> list[tuple[ChunkLocation, float]]: ...

    def nearest_each(self, vectors: np.ndarray, n: int, *, keep: HitFilter | None = None,
                     header: bool = False) -> list[list[tuple[ChunkLocation, float]]]: ...


def rrf(rankings: Sequence[Sequence[K]], *, k: float = RRF_K,
        weights: Sequence[float] | None = None, cap: int | None = None) -> dict[K, float]:
    """Reciprocal-rank fusion: item -> sum over rankings of weight / (k + rank), rank from 1.

    An item listed twice in one ranking counts at its best rank only. With `cap`, only
    ranks up to `cap` add to a score; an item found deeper only is kept with score 0, so
    that reading the rankings deeper (more results asked for) adds candidates after the
    others and never reorders them.
    """
    weights = weights if weights is not None else [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    out: dict[K, float] = defaultdict(float)
    for ranking, w in zip(rankings, weights, strict=True):
        if w == 0:
            continue
        seen: set[K] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            out[item] += w / (k + rank) if cap is None or rank <= cap else 0.0
    return dict(out)


def ranked(scores: dict[K, float]) -> list[tuple[K, float]]:
    """Items by score, best first; equal scores keep their insertion order."""
    return sorted(scores.items(), key=lambda kv: -kv[1])


PEAK_AT = 10  # the rank a prose query's best BM25 score is compared with


def peaked(bm25: Sequence[tuple[int, float]], ratio: float) -> bool:
    """Whether a BM25 ranking's best score is at least `ratio` times its `PEAK_AT`-th
    (a ranking shorter than that: its words are rare, so it is peaked)."""
    if not bm25:
        return False
    if len(bm25) < PEAK_AT:
        return True
    return bm25[0][1] >= ratio * bm25[PEAK_AT - 1][1]


@dataclass(frozen=True)
class SearchOptions:
    """How a query is ranked. The defaults are what the benchmarks found best."""

    hybrid: bool = True  # fuse BM25 with the vectors
    split: SplitMode = "rrf"  # how the parts of a long query combine
    evidence: bool = True  # rank chunks that the query names (paths, symbols, frames)
    rrf_k: float = RRF_K
    w_vector: float = 1.0
    # BM25's vote for a query that names code (an issue text, an identifier lookup). A
    # full vote once BM25 scores only the rarest terms (max_query_terms): then what it
    # matches are the names in the query. Chosen on the SWE-bench tune half; half a vote
    # was the choice while BM25 scored every term (docs/benchmarks.md).
    w_lexical: float = 1.0
    # BM25's weight for a query in plain words, one that names no path, module, symbol
    # or frame ("check if a file exists"): such a query finds code by what it means,
    # and its words rarely appear in the code, so BM25 ranks it poorly (CoSQA: BM25
    # alone MRR ~0.3 against the vectors' ~0.5) and an equal vote only pulls the vector
    # ranking down. None: w_lexical for every query.
    w_lexical_prose: float | None = 0.25
    # BM25's weight for a query in plain words whose BM25 ranking is peaked: its best
    # chunk scores at least `prose_peak_ratio` times its tenth. Such a query's words are
    # the code's own (a doc comment's first sentence names what the code calls things),
    # where a flat ranking means they match everything a little (CoSQA's web queries).
    # None: w_lexical_prose whatever the ranking's shape. Chosen on the tune halves of
    # the multi-language benchmark and CoSQA together: the largest multi-language gain
    # (doc comments 0.834 -> 0.854 NDCG@10, all +0.8) costing CoSQA at most half an MRR
    # point (-0.2); a ratio of 1.5 gains +1.3 and costs CoSQA 1.0, 1.2 gains +1.5 and
    # costs 4.0 (docs/benchmarks.md).
    w_lexical_prose_peaked: float | None = 1.0
    prose_peak_ratio: float = 2.0
    w_evidence: float = 1.0
    depth: int = DEPTH  # chunks taken from each ranking
    # Ranks beyond this add nothing to a score (rrf's `cap`): a search for more results
    # reads the rankings deeper (`retrieval.searcher.ranking_depth`), and its first ten
    # must be the ten a search for ten shows.
    scored_depth: int = DEPTH
    dedupe_terms: bool = True  # BM25: a query term counts once
    # BM25: only the query's 32 rarest terms (None: every term). An issue text has
    # a hundred or more distinct words; its rarest are the names in it, and its common
    # ones match most files a little. Chosen on the SWE-bench tune half (docs/benchmarks.md).
    max_query_terms: int | None = 32
    w_file_lexical: float = 0.0  # file level: fuse whole-file BM25 with this weight
    # The same for a query in plain words (measured on CoSQA: a file there is one
    # function, and whole-file BM25 only repeats the chunk-level one, worse).
    w_file_lexical_prose: float = 0.0
    # Weight of a long query's first part (an issue's title and opening), which names
    # what is wrong; chosen on the SWE-bench tune half.
    w_first_part: float = 2.0
    # BM25 (chunks and files) for a query that names code: leave English stop words out.
    # An issue text is mostly prose; "the", "is", "to" match nearly every file a little.
    # Chosen on the SWE-bench tune half, with code_term_weight 2 (docs/benchmarks.md).
    stopwords: bool = True
    # Weight of a second vector ranking: the query's parts against vectors of each chunk's
    # `path > symbol` header alone, where the ranker was given them (0: not used). An
    # issue text names the module or function it is about in words the body's vector
    # dilutes among a chunk's lines. Chosen on the SWE-bench tune half (docs/benchmarks.md):
    # half a vote on 38 tune instances, then a full one on all 74.
    w_header_vector: float = 1.0
    # The same for a query in plain words (CoSQA's tune half: a vote of 0.5 costs 7.6
    # MRR points, 0.25 costs 4.5): such a query says what code does, not where it is.
    w_header_vector_prose: float = 0.0
    # BM25 for a query that names code: the terms of words that look like code
    # (identifiers, code lines, traceback frames) count this many times, prose words
    # once (1: all alike). Chosen with stopwords on the SWE-bench tune half.
    code_term_weight: int = 2
    # Read the names of every language in a query (`lowerCamel`, `A::B`, `A#b`) and take
    # a query that is one bare name as a definition lookup.
    identifier_refs: bool = True
    # A query's name that is a file's stem (`NetworkError` -> NetworkError.ts) counts as
    # evidence for that file. Measured on the multi-language tune half: no gain (+0.000
    # NDCG@10 with no vectors), so off.
    stem_evidence: bool = False
    # Scores of chunks in tests, docs, examples and config files are scaled by this,
    # unless the query asks for that kind (retrieval.signals): 1 ranks every kind alike.
    # Chosen on the multi-language tune half (bench/multilang.py), with vectors: 0.4
    # where the curve flattens (0.8: +0.7 NDCG@10, 0.4: +1.7, 0.2: +1.9 scaling the
    # word votes); lower would bury a README for a question only docs answer.
    w_non_code: float = 0.4
    # Which votes `w_non_code` scales: "words" (BM25 and names) or "all" (the vectors'
    # too). "all": +3.1 NDCG@10 over "words" on that tune half; the vectors also rank a
    # test or a README for the words it shares with the code.
    non_code_scope: Literal["words", "all"] = "all"
    # The vectors' vote (body and header) for a query that is one bare name, as a share
    # of their usual weight. 0 on that tune half: symbol lookups 0.966 -> 0.996, since
    # a name's definition is found by name and the vectors only add its look-alikes;
    # and the query is not embedded at all.
    w_meaning_identifier: float = 0.0
    # The chunks printed (chunk level): a chunk's score is scaled by this once per chunk
    # of its file ranked above it (retrieval.grouping.diversify; 1: no scaling). Chosen
    # on the multi-language tune half, scoring the ten chunks printed: with no vectors
    # 0.796 -> 0.811 at 0.6, 0.813 at 0.4 (docs/benchmarks.md).
    saturation: float = 0.5
    # The vote of the small files whose own path holds the query's words
    # (retrieval.path_vote; 0: none). Chosen on the multi-language tune half with no
    # vectors: module questions 0.431 -> 0.535 NDCG@10 at 0.25, all +0.004; a half vote
    # costs the doc comments 0.046 (docs/benchmarks.md).
    w_path: float = 0.25
    # Scores of chunks of files beside the implementation (legacy copies, type
    # declarations, code-level config, barrels; retrieval.signals.is_secondary) are
    # scaled by this unless the query asks for one (1: all alike). On the multi-language
    # tune half with no vectors: commits +0.004 at 0.8; 0.4 costs symbols 0.014 (a type
    # is defined in its declarations).
    w_secondary: float = 0.8
    # The path vote and `w_secondary` apply to queries of at most this many words: they
    # were chosen on short questions (the multi-language benchmark's are 30 words at
    # most), and an issue text keeps the ranking SWE-bench chose.
    short_query_words: int = 40
    # The chunks printed, for a query in plain words: a file's first chunk is ranked by
    # its file's score (its symbols' chunks aggregated, `decay`), the rest by their own.
    # A query that names code keeps each chunk's own score: there the chunk that
    # defines the name is the answer, and a file of many chunks that mention it must not
    # outrank it (with vectors, symbols 0.984 -> 0.972 when every query took it).
    file_first: bool = True


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
    saturation: float = 1.0  # chunk level: see `retrieval.grouping.diversify`
    file_first: bool = False  # chunk level: a file's first chunk takes the file's score


def group_ranking(ranking: Ranking, level: Level, agg: Aggregation | None = None) -> list[Group]:
    """`ranking` grouped at `level`; at file level, fused with its file-level rankings.

    The chunk-based file ranking (chunk scores aggregated per file) and each file-level
    ranking (whole-file BM25) are fused by reciprocal rank; the fused score becomes the
    group's score.
    """
    if level == "chunk":
        return group(diversify(ranking.chunks, ranking.saturation,
                               file_first=ranking.file_first), level)
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
        self.count_tokens = count_tokens
        self.count_many = count_many
        self.max_tokens = max_tokens
        self._names: RepoNames | None = None
        self._path_words: PathWords | None = None
        self.face_chunks = 3  # the largest file the path vote speaks for, in chunks
        # The parts of a ranking, in order (retrieval.ranking_parts).
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
        reciprocal rank, then each step of `self.rescoring` (retrieval.ranking_parts).

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
            result.file_best = self._file_best([p for p, _ in files], q.bm25)
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
        if refs.identifier and evidence is not None:
            # A bare name the repo defines: its definition is found by name, and the
            # vectors only add look-alikes. A name nothing defines keeps them.
            w_vector *= o.w_meaning_identifier
            w_header *= o.w_meaning_identifier
        return QueryView(query, o, parts, refs, prose, lex_query, dedupe, bm25, evidence, mask,
                         keep, w_vector, w_header)

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
        return query, o.dedupe_terms

    def _file_best(self, paths: list[str], bm25: list[tuple[int, float]]
                   ) -> dict[str, ChunkLocation]:
        """A chunk to show for each file: its best BM25 chunk, else its first."""
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
