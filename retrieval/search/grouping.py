"""Rankings at three levels from one chunk ranking: chunk, symbol and file.

A symbol is a chunk's symbol path within its file (`Session > send`; "" for module-level
code); a file is its path. A group is shown as its best chunk, with a score aggregated
from its chunks in the fused ranking (at file level, the best chunk of each symbol).

Aggregations (of the fused chunk scores of a group, best first: s1 >= s2 >= ...):

- `max`:    s1. A file is as good as its best chunk.
- `sum`:    s1 + s2 + ... Every matching chunk counts; favours long files.
- `topm`:   s1 + ... + sm (m = `top_m`). Several good chunks beat one, without
            rewarding sheer length.
- `decay`:  s1 + s2/2 + s3/4 + ... The best chunk dominates, further ones add less.
- `rrf`:    sum over the group's chunks of 1 / (k + rank in the chunk ranking), the
            ranking, not the fused score, aggregated.

`bench/quality.py` measures them on SWE-bench; `DEFAULT_AGG` holds the best of them
for each level.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from indexer.location import ChunkLocation

Level = Literal["chunk", "symbol", "file"]
Aggregation = Literal["max", "sum", "topm", "decay", "rrf"]

LEVELS: Final[tuple[str, ...]] = ("chunk", "symbol", "file")
AGGREGATIONS: Final[tuple[str, ...]] = ("max", "sum", "topm", "decay", "rrf")
# File level: `decay`, chosen on the tune half of the SWE-bench split (docs/benchmarks.md:
# at 24 tune instances it leads `topm` at Acc@3; `topm` had led by one gold file's rank at
# 8). CoSQA's files are single functions, where the two agree.
DEFAULT_AGG: Final[dict[str, Aggregation]] = {"symbol": "max", "file": "decay"}
TOP_M: Final = 3
RANK_K: Final = 60.0


@dataclass
class Group:
    """One result at some level: its best chunk, its score, and every chunk in it."""

    key: tuple[str, ...]
    best: ChunkLocation
    score: float
    members: list[ChunkLocation] = field(default_factory=list)


def group_key(doc: ChunkLocation, level: Level) -> tuple[str, ...]:
    if level == "file":
        return (doc.path,)
    if level == "symbol":
        return (doc.path, doc.symbol)
    return (doc.path, str(doc.start_line), str(doc.end_line))


def group(ranking: Sequence[tuple[ChunkLocation, float]], level: Level,
          agg: Aggregation | None = None, *, top_m: int = TOP_M,
          rank_k: float = RANK_K) -> list[Group]:
    """Groups of a chunk ranking (best first) at `level`, best first.

    For `chunk` every chunk is its own group with its own score. Ties keep the order in
    which the groups' best chunks were ranked.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; use one of {', '.join(LEVELS)}")
    if level == "chunk":
        return [Group(group_key(d, "chunk"), d, s, [d]) for d, s in ranking]
    agg = agg or DEFAULT_AGG[level]
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {agg!r}; use one of {', '.join(AGGREGATIONS)}")
    groups: dict[tuple[str, ...], Group] = {}
    scores: dict[tuple[str, ...], list[float]] = {}
    ranks: dict[tuple[str, ...], list[int]] = {}
    # A file's score counts each of its symbols once, by its best chunk: a long function
    # cut into five chunks is one piece of evidence, not five (measured on CoSQA, where a
    # file is one function: MRR 49.3 -> 51.5 with `decay`, SWE-bench unchanged).
    counted: set[tuple[str, str]] = set()
    for rank, (doc, score) in enumerate(ranking, start=1):
        key = group_key(doc, level)
        g = groups.get(key)
        if g is None:
            groups[key] = g = Group(key, doc, 0.0, [])
            scores[key] = []
            ranks[key] = []
        g.members.append(doc)
        if level == "file":
            if (doc.path, doc.symbol) in counted:
                continue
            counted.add((doc.path, doc.symbol))
        scores[key].append(score)
        ranks[key].append(rank)
    for key, g in groups.items():
        g.score = _aggregate(agg, scores[key], ranks[key], top_m, rank_k)
    return sorted(groups.values(), key=lambda g: -g.score)


def diversify(ranking: Sequence[tuple[ChunkLocation, float]], saturation: float,
              *, file_first: bool = False,
              limit: int | None = None) -> list[tuple[ChunkLocation, float]]:
    """The chunk ranking with each chunk's score scaled by `saturation` once per chunk of
    its file ranked above it (1: unchanged), best first.

    What a search prints is read top down: a fifth chunk of one header shown above a
    second file's first costs the reader a place, and a question whose answer spans
    three files cannot be answered by one. Greedy: take the best adjusted score, then
    lower the rest of that file's chunks; a chunk's score is recomputed lazily when it
    reaches the top of the heap with a stale file count.

    With `limit`, the first `limit` chunks are exactly those of the whole pass, and the
    rest follow by the scores they last had on the heap (each no higher than the last
    one placed): a search that prints ten does not order the hundreds behind them.
    """
    if (saturation >= 1.0 and not file_first) or len(ranking) < 2:
        return list(ranking)
    shown: dict[str, int] = {}
    first: dict[str, float] = {}
    if file_first:
        # A file's first chunk stands for the file: it takes the file's score (its
        # symbols' chunks, `decay`, as `group` computes it), so a file that answers in
        # several places leads.
        counted: set[tuple[str, str]] = set()
        taken: dict[str, int] = {}
        for doc, score in ranking:
            if (doc.path, doc.symbol) in counted:
                continue
            counted.add((doc.path, doc.symbol))
            n = taken.get(doc.path, 0)
            taken[doc.path] = n + 1
            first[doc.path] = first.get(doc.path, 0.0) + score * 0.5**n
    # (-adjusted score, rank, file count it was adjusted for)
    heap = [(-first.get(d.path, s), i, 0) for i, (d, s) in enumerate(ranking)]
    heapq.heapify(heap)
    out: list[tuple[ChunkLocation, float]] = []
    while heap:
        neg, i, seen = heapq.heappop(heap)
        doc, score = ranking[i]
        now = shown.get(doc.path, 0)
        if now != seen:
            heapq.heappush(heap, (-score * saturation**now, i, now))
            continue
        out.append((doc, -neg))
        shown[doc.path] = now + 1
        if limit is not None and len(out) >= limit:
            out.extend((ranking[j][0], -n) for n, j, _ in sorted(heap))
            break
    return out


def _aggregate(agg: Aggregation, scores: list[float], ranks: list[int], top_m: int,
               rank_k: float) -> float:
    # `scores` arrive best first because the ranking is sorted.
    if agg == "max":
        return scores[0]
    if agg == "sum":
        return sum(scores)
    if agg == "topm":
        return sum(scores[:top_m])
    if agg == "decay":
        return sum(s * 0.5**i for i, s in enumerate(scores))
    return sum(1.0 / (rank_k + r) for r in ranks)
