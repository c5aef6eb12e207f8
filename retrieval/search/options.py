"""What the fusion and its parts share: how a query is ranked (`SearchOptions`), the
vector side's interface, and the arithmetic of reciprocal-rank fusion. Its own module so
that the parts of a ranking (`retrieval.search.ranking_parts`) and the ranker that runs
them (`retrieval.search.fusion`) both build on it and not on each other."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeVar

import numpy as np

from indexer.location import ChunkLocation
from retrieval.indexes.filters import HitFilter

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
    sealed workspace's own index (`retrieval.indexes.local_vectors.LocalVectorIndex`) and by the
    server-search re-ranker (`retrieval.search.server_vectors.ServerVectors`)."""

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
    # ranking down. None: w_lexical for every query. The weight is this only where the
    # vectors vote in full: with none built yet it is w_lexical, in between as they land
    # (retrieval.search.ranking_parts.LexicalVote; question set, words tier, tune half:
    # 0.775 -> 0.792).
    w_lexical_prose: float | None = 0.25
    # The static model's vote (retrieval.indexes.static_vectors: every chunk has a static
    # vector from the moment `index` returns): `w_static` while no MiniLM vector is
    # built, `w_static_meaning` once every one votes, in between as they land
    # (`meaning_share`). Chosen on the tune halves (docs/benchmarks.md): 0.75 lifts the
    # question set's words tier 0.802 -> 0.824; beside every vector 0.25 gave +0.009
    # there but -1.2 MRR on CoSQA's, so none.
    w_static: float = 0.75
    w_static_meaning: float = 0.0
    # The share of the chunks that have vectors (the searcher sets it while they are
    # being built; 0: none yet): how far BM25's prose weight has yielded to meaning.
    meaning_share: float = 1.0
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
    # reads the rankings deeper (`retrieval.search.searcher.ranking_depth`), and its first ten
    # must be the ten a search for ten shows.
    scored_depth: int = DEPTH
    dedupe_terms: bool = True  # BM25: a query term counts once
    # BM25: only the query's 32 rarest terms (None: every term). An issue text has
    # a hundred or more distinct words; its rarest are the names in it, and its common
    # ones match most files a little. Chosen on the SWE-bench tune half (docs/benchmarks.md).
    max_query_terms: int | None = 32
    # The vote of whole files by BM25 for a short question in plain words, each file
    # voting with its best chunk (retrieval.search.ranking_parts.FileVote; 0: none).
    # Chosen on the tune half of the question set (bench/questions.py), words tier:
    # 0.792 -> 0.797 at 0.25, 0.801 at 1.0 (docs/benchmarks.md). That is its weight while
    # no vector is built; `w_file_vote_meaning` once every vector votes (in between as
    # they land, `meaning_share`): at 1.0 beside the vectors CoSQA's MRR fell 6 points
    # (a file there is one function: the vote only repeats BM25).
    w_file_vote: float = 1.0
    w_file_vote_meaning: float = 0.0
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
    # BM25 for a query in plain words: leave out stop words and the words that frame a
    # question (`retrieval.search.query.QUESTION_WORDS`: how, where, does, ...). On the
    # question set's tune half, words tier: 0.736 -> 0.775 NDCG@10 (docs/benchmarks.md).
    question_words_out: bool = True
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
    # unless the query asks for that kind (retrieval.search.signals): 1 ranks every kind alike.
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
    # of its file ranked above it (retrieval.search.grouping.diversify; 1: no scaling). Chosen
    # on the multi-language tune half, scoring the ten chunks printed: with no vectors
    # 0.796 -> 0.811 at 0.6, 0.813 at 0.4 (docs/benchmarks.md).
    saturation: float = 0.5
    # The vote of the small files whose own path holds the query's words
    # (retrieval.search.path_vote; 0: none). Chosen on the multi-language tune half with no
    # vectors: module questions 0.431 -> 0.535 NDCG@10 at 0.25, all +0.004; a half vote
    # costs the doc comments 0.046 (docs/benchmarks.md).
    w_path: float = 0.25
    # Scores of chunks of files beside the implementation (legacy copies, type
    # declarations, code-level config, barrels; retrieval.search.signals.is_secondary) are
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

    def as_vectors_land(self, none_built: float, all_built: float) -> float:
        """A weight that moves from `none_built` (no vector yet: the first answer) to
        `all_built` (every vector votes) with the share of chunks that have vectors
        (`meaning_share`): BM25's prose vote, the file vote and the static vote."""
        return none_built + (all_built - none_built) * self.meaning_share
