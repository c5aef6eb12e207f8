"""Short questions in many languages: codeveil against whole-file BM25, file-level NDCG@10.

    python bench/multilang.py --data DIR [--mirrors DIR] [--stage plan|warm|eval]
        [--repos a/b,c/d] [--threads N] [--out multilang]

The benchmark (bench/multilang_build.py, built into `--data` on first use from the git
mirrors): 42 repositories in 16 languages, each pinned to a commit, with three kinds of
query drawn from what their authors wrote: a symbol name (gold: the one file defining it),
a doc comment's first sentence (gold: the defining file; the comment is cut out of the
tree), a commit subject (gold: the 1-3 code files it touched). The split is by repository
(`multilang_build.half_of`): settings are chosen on tune, numbers published from report.

Systems, over the files `codeveil index` keeps (code and docs; assets skipped):
- BM25 files: `bm25s` over whole files, English stop words.
- codeveil (shipped defaults): the production ranking (`retrieval.search.fusion.HybridRanker`,
  `retrieval.search.grouping`) over the chunks' vectors in memory, as bench/quality.py runs it.
- codeveil with no vectors: the same ranking with no vote by meaning, what a first index
  serves before its vectors exist.
- each ranking signal switched off in turn (the ablation).

Prints per-kind, per-language and per-repo tables for each half; writes
bench/results/multilang.json (the summaries and the repos) and, with `--per-query FILE`,
each query's row (its scores and files) to FILE as JSON lines: per-query detail is
thousands of lines a run, so it stays out of the committed results. The embedding cache
lives in `--data/cache`, so a rerun embeds nothing it embedded before; `--stage warm`
only fills it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIRRORS, table, write_json
from bench.multilang_build import Pin, Query, build, is_built, load, read_pins, tree_path
from bench.quality import BEFORE_MULTILANG, PEAK_GRID, PRINTED_BEFORE
from indexer.location import ChunkLocation

log = logging.getLogger("bench.multilang")

DEPTH = 50
NDCG_AT = 10
HALVES = ("tune", "report")
READ_DEPTH = 10  # hits an agent reads at most, chunks or files
TOP_KEPT = 5  # BM25's files kept per query in the result file, to read the misses
# The systems whose ten printed files are kept per query (beside the first one ranked).
KEEP_TOP = frozenset({"codeveil as printed before", "no vectors, as printed before"})
#: `--vector-kinds`: the file kinds whose chunks have vectors (None: every kind).
VECTOR_KINDS: frozenset[str] | None = None


def ndcg(files: Sequence[str], gold: set[str], k: int = NDCG_AT) -> float:
    """Binary-relevance NDCG@k over a list of files, each gold file gaining once, at its
    first place: over distinct files (a file ranking) or over the files of the chunks
    `codeveil search` prints, in order, repeats included (a chunk of a file already
    shown gains nothing and takes a place)."""
    dcg, seen = 0.0, set()
    for i, f in enumerate(files[:k]):
        if f in gold and f not in seen:
            seen.add(f)
            dcg += 1.0 / math.log2(i + 2)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(gold), k)))
    return dcg / ideal if ideal else 0.0


@dataclass(frozen=True)
class System:
    name: str
    options: dict  # SearchOptions fields changed from the defaults
    vectors: bool = True


# The ranking before the signals measured here (what `codeveil` shipped): Python's names
# only, every kind of file alike (bench/quality.py's rows of the same name use it too).
BEFORE = BEFORE_MULTILANG
# What a search serves before any vector is built (retrieval.search.searcher.Searcher.options).
NO_VECTORS = {"w_vector": 0.0, "w_header_vector": 0.0, "meaning_share": 0.0}



def systems(grid: bool = False) -> list[System]:
    """The rows: the shipped ranking, the ranking before, each new signal switched off in
    turn (the ablation) and, with `grid`, the settings tried on the tune half."""
    from retrieval.search.options import SearchOptions

    d = SearchOptions()
    out = [
        System("codeveil (shipped defaults)", {}),
        System("codeveil as printed before", PRINTED_BEFORE),
        System("codeveil before (Python names, kinds alike)", BEFORE),
        System("defaults, no saturation", {"saturation": 1.0, "file_first": False}),
        System("defaults, no path vote", {"w_path": 0.0}),
        System("defaults, secondary files alike", {"w_secondary": 1.0}),
        System("defaults, Python names only", {"identifier_refs": False}),
        System("defaults, no stem evidence" if d.stem_evidence else "defaults + stem evidence",
               {"stem_evidence": not d.stem_evidence}),
        System("defaults, every kind alike", {"w_non_code": 1.0}),
        System("defaults, kinds scaled on word votes only", {"non_code_scope": "words"}),
        System("defaults, bare names' vectors at full weight", {"w_meaning_identifier": 1.0}),
        System("defaults, no evidence", {"evidence": False}),
        System("defaults, prose BM25 weight whatever its ranking's shape",
               {"w_lexical_prose_peaked": None}),
        System("defaults, no header vector", {"w_header_vector": 0.0,
                                               "w_header_vector_prose": 0.0}),
        System("codeveil, no vectors (first index)", NO_VECTORS, vectors=False),
        System("no vectors, as printed before", {**NO_VECTORS, **PRINTED_BEFORE},
               vectors=False),
        System("no vectors, before", {**NO_VECTORS, **BEFORE}, vectors=False),
        System("BM25 chunks only", {**NO_VECTORS, "evidence": False, "w_non_code": 1.0},
               vectors=False),
    ]
    if grid:
        for vec, base in (("", {}), ("no vectors, ", NO_VECTORS)):
            out += [System(f"{vec}saturation {f}", {**base, "saturation": f,
                                                     "file_first": False},
                           vectors=not base) for f in (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)]
            out += [System(f"{vec}path vote {w}", {**base, "w_path": w},
                           vectors=not base) for w in (0.0, 0.25, 0.5, 1.0)]
            out += [System(f"{vec}secondary files x{w}", {**base, "w_secondary": w},
                           vectors=not base) for w in (1.0, 0.8, 0.6, 0.4)]
            out += [System(f"{vec}file first, saturation {f}",
                           {**base, "saturation": f, "file_first": True},
                           vectors=not base) for f in (1.0, 0.6, 0.4, 0.2, 0.0)]
            out += [System(f"{vec}non-code x{f}", {**base, "w_non_code": f},
                           vectors=not base) for f in (1.0, 0.8, 0.6, 0.4, 0.2)]
            out += [System(f"{vec}stem evidence {on}", {**base, "stem_evidence": on},
                           vectors=not base) for on in (False, True)]
        for scope in ("words", "all"):
            out += [System(f"non-code x{f}, scaling {scope}",
                           {"w_non_code": f, "non_code_scope": scope}) for f in (0.4, 0.2)]
        out += [System(f"bare names' vector share {w}", {"w_meaning_identifier": w})
                for w in (1.0, 0.5, 0.25, 0.0)]
        out += [System("no header vector", {"w_header_vector": 0.0,
                                            "w_header_vector_prose": 0.0})]
        out += [System(f"vector weight {w}", {"w_vector": w}) for w in (1.0, 0.5, 0.25)]
        out += [System(f"peaked prose BM25 {w} at ratio {r}",
                       {"w_lexical_prose_peaked": w, "prose_peak_ratio": r})
                for w, r in PEAK_GRID]
        out += [System("prose BM25 weight 1.0", {"w_lexical_prose": 1.0})]
    # One row per name: a grid setting equal to a named row is not run twice.
    seen: set[str] = set()
    unique = []
    for s in out:
        if s.name not in seen:
            seen.add(s.name)
            unique.append(s)
    return unique


BM25 = "BM25 files"


@dataclass
class Repo:
    pin: Pin
    # A query's ranking under a system: the chunks best first, and their files.
    rank: Callable[[str, System], tuple[list[ChunkLocation], list[str]]]
    bm25: Callable[[str], list[str]]
    chunks: int
    files: int
    chunk_tokens: dict[tuple[str, int, int], int]  # word pieces of each chunk's lines
    file_tokens: dict[str, int]  # and of each whole file

    def reading(self, chunks: Sequence[ChunkLocation], files: Sequence[str], gold: set[str]
                ) -> tuple[int, int] | None:
        """Tokens an agent reads before the first gold file: down the chunk hits (`codeveil
        search`, k=10) to the first hit in a gold file, and down the same ranking's whole
        files; None when either list has no gold file in its top 10."""
        as_chunks = 0
        for d in chunks[:READ_DEPTH]:
            as_chunks += self.chunk_tokens[d.key]
            if d.path in gold:
                break
        else:
            return None
        as_files = 0
        for path in files[:READ_DEPTH]:
            as_files += self.file_tokens.get(path, 0)
            if path in gold:
                return as_chunks, as_files
        return None


def prepare_repo(pin: Pin, data: Path, queries: Sequence[Query], enc, memo,
                 *, embed: bool = True) -> Repo:
    from bench.quality import VectorIndex, bm25_file_ranker, embed_all, lexical_index, load_tree
    from indexer.tokens import default_counter
    from retrieval.indexes.lexical import lexical_text
    from retrieval.search.fusion import HybridRanker, group_ranking
    from retrieval.search.grouping import DEFAULT_AGG
    from retrieval.search.options import SearchOptions

    corpus = load_tree(tree_path(data, pin.repo), pin.repo,
                       data / "chunks" / (pin.repo.replace("/", "+") + ".json"))
    paths = list(corpus.files)
    chunks = corpus.chunks
    docs = [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language)
            for c in chunks]
    lex = lexical_index(docs, [lexical_text(c) for c in chunks], memo)
    counter = default_counter()
    dim = enc.dim
    if embed:
        vectors = embed_all(enc, [c.embed_text for c in chunks], f"{pin.repo} chunks")
        hvec = embed_all(enc, [c.header for c in chunks], f"{pin.repo} headers")
        embed_all(enc, [q.text for q in queries], f"{pin.repo} queries")
    else:
        vectors = hvec = np.zeros((len(chunks), dim), dtype=np.float32)

    def embed_parts(parts: Sequence[str]) -> np.ndarray:
        return embed_all(enc, parts, "query parts")

    if VECTOR_KINDS is not None:
        # What a vote by meaning over only some kinds' chunks would rank (the others
        # never embedded): their rows leave both vector indexes.
        from indexer.kinds import file_kind

        keep = [i for i, d in enumerate(docs) if file_kind(d.path).value in VECTOR_KINDS]
        vdocs, vectors, hvec = [docs[i] for i in keep], vectors[keep], hvec[keep]
    else:
        vdocs = docs
    ranker = HybridRanker(lex, embed_parts, VectorIndex(vdocs, vectors).nearest, counter.count,
                          enc.embedder.max_tokens, count_many=counter.count_batch,
                          nearest_header=VectorIndex(vdocs, hvec).nearest)
    from bench._common import static_embedder

    static = static_embedder()
    if static is not None:
        # The static tier: every chunk's static vector (no cache: they cost ~0.2 ms).
        svec = static.embed([c.embed_text for c in chunks])
        ranker.use_static(VectorIndex(docs, svec), static.embed)
    agg = DEFAULT_AGG["file"]

    def rank(q: str, system: System) -> tuple[list[ChunkLocation], list[str]]:
        ranking = ranker.rank(q, replace(SearchOptions(), **system.options))
        files = [g.key[0] for g in group_ranking(ranking, "file", agg)][:DEPTH]
        # What `codeveil search` prints: the chunk-level groups, in order.
        printed = [g.best for g in group_ranking(ranking, "chunk")][:DEPTH]
        return printed, files

    chunk_tokens = dict(zip((d.key for d in docs),
                            counter.count_batch([c.text for c in chunks]), strict=True))
    file_tokens = dict(zip(paths, counter.count_batch([corpus.files[p] for p in paths]),
                           strict=True))
    return Repo(pin, rank, bm25_file_ranker(corpus.files, DEPTH), len(chunks), len(paths),
                chunk_tokens, file_tokens)


def set_up_run(data: Path) -> None:
    """Log lines with their time, bm25s quiet, the embedding cache under `data`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    import bm25s  # noqa: F401  (it sets its logger to DEBUG on import; quiet it after)

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    os.environ.setdefault("CODEVEIL_CACHE_DIR", str(data / "cache"))


def prepare_repos(pins: Sequence[Pin], queries: Sequence[Query], data: Path,
                  threads: int | None, *, embed: bool) -> tuple[Any, dict[str, Repo]]:
    """The embedder and each pinned repository ready to rank (`prepare_repo`), its
    chunks (and, with `embed`, their vectors) read through the caches under `data`."""
    from bench.quality import Memo, _embedders

    enc, _plain = _embedders(None, threads)
    memo = Memo()
    repos: dict[str, Repo] = {}
    for pin in pins:
        mine = [q for q in queries if q.repo == pin.repo]
        repos[pin.repo] = r = prepare_repo(pin, data, mine, enc, memo, embed=embed)
        log.info("%s: %d files, %d chunks", pin.repo, r.files, r.chunks)
    return enc, repos


def evaluate(repos: dict[str, Repo], queries: Sequence[Query], chosen: list[System],
             *, vectors: bool) -> list[dict]:
    """Per query, each system's NDCG@10 and top files; and for the first system (the
    shipped one) the tokens read to the first relevant result, where it runs."""
    rows = []
    for q in queries:
        repo = repos.get(q.repo)
        if repo is None:
            continue
        gold = set(q.gold)
        got = repo.bm25(q.text)
        # Whole-file BM25 prints files: its two scores are one.
        scores = {BM25: ndcg(got, gold)}
        file_scores = {BM25: scores[BM25]}
        top = {BM25: got[:TOP_KEPT]}
        read = None
        # The first system ranked: the shipped one, or with no vectors its own row.
        shown = next(s.name for s in chosen if vectors or not s.vectors)
        for n, s in enumerate(chosen):
            if s.vectors and not vectors:
                continue
            hits, files = repo.rank(q.text, s)
            scores[s.name] = ndcg([d.path for d in hits], gold)
            file_scores[s.name] = ndcg(files, gold)
            if s.name == shown or s.name in KEEP_TOP:
                top[s.name] = [d.path for d in hits[:NDCG_AT]]
            if n == 0:  # the shipped ranking
                read = repo.reading(hits, files, gold)
        rows.append({"repo": q.repo, "kind": q.kind, "language": q.language,
                     "half": repo.pin.half, "query": q.text, "gold": list(q.gold),
                     "scores": scores, "file_scores": file_scores, "top": top,
                     "distinct_files": len(set(top.get(shown, []))),
                     "reading": read})
    return rows


def mean_by(rows: list[dict], key: Callable[[dict], str], field: str = "scores"
            ) -> dict[str, dict[str, float]]:
    """Mean of each system's `field` ("scores": the chunks printed; "file_scores": the
    file ranking) per group of rows."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    out = {}
    for g, rs in sorted(groups.items()):
        names = rs[0][field].keys()
        out[g] = {n: float(np.mean([r[field][n] for r in rs])) for n in names}
        out[g]["queries"] = len(rs)
    return out


def reading_table(rows: list[dict]) -> dict:
    """Median tokens read to the first gold hit, chunks against whole files, per half:
    over the queries both reach within 10 hits."""
    out = {}
    for half in HALVES:
        pairs = [r["reading"] for r in rows if r["half"] == half and r.get("reading")]
        if pairs:
            chunks, files = zip(*pairs, strict=True)
            out[half] = {"queries": len(pairs), "reached_of": sum(r["half"] == half for r in rows),
                         "median_chunks": float(np.median(chunks)),
                         "median_files": float(np.median(files))}
    if out:
        print("\nTokens read to the first relevant result (shipped ranking, top 10 hits)")
        print(table(["half", "queries reached", "median, chunk hits", "median, whole files"],
                    [[h, f"{v['queries']} of {v['reached_of']}", v["median_chunks"],
                      v["median_files"]] for h, v in out.items()]))
    return out


def print_tables(rows: list[dict], names: list[str]) -> dict:
    report: dict = {}
    short = {n: n.replace("codeveil", "cv").replace("(shipped defaults)", "defaults")
             for n in names}
    for half in HALVES:
        hr = [r for r in rows if r["half"] == half]
        if not hr:
            continue
        by_kind = mean_by(hr, lambda r: r["kind"])
        by_kind["all"] = mean_by(hr, lambda r: "all")["all"]
        file_kind = mean_by(hr, lambda r: r["kind"], "file_scores")
        file_kind["all"] = mean_by(hr, lambda r: "all", "file_scores")["all"]
        shown = [r["distinct_files"] for r in hr]
        report[half] = {"kind": by_kind, "file_kind": file_kind,
                        "language": mean_by(hr, lambda r: r["language"]),
                        "repo": mean_by(hr, lambda r: r["repo"]),
                        "distinct_files_in_ten": float(np.mean(shown))}
        for title, kinds in (("the ten chunks printed", by_kind),
                             ("the file ranking", file_kind)):
            print(f"\n{half} half: NDCG@{NDCG_AT} of {title}, by kind ({len(hr)} queries)")
            print(table(["system", *[f"{k} ({kinds[k]['queries']})" for k in kinds]],
                        [[n, *[kinds[k].get(n, float("nan")) for k in kinds]] for n in names]))
        print(f"distinct files in the ten printed (shipped): mean {np.mean(shown):.2f}")
        for what in ("language", "repo"):
            groups = report[half][what]
            print(f"\n{half} half: NDCG@{NDCG_AT} of the ten chunks printed, by {what}")
            print(table([what, "queries", *[short[n] for n in names]],
                        [[g, v["queries"], *[v.get(n, float("nan")) for n in names]]
                         for g, v in groups.items()]))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="Folder for trees, queries, chunk lists and the embedding cache.")
    ap.add_argument("--mirrors", type=Path, default=MIRRORS)
    ap.add_argument("--stage", choices=("plan", "warm", "lexical", "eval"), default="eval",
                    help="plan: count chunks; warm: only embed; lexical: rank without "
                         "vectors (BM25 and the no-vector rows); eval: everything.")
    ap.add_argument("--repos", default="", help="Only these owner/name, comma-separated.")
    ap.add_argument("--halves", default="tune,report")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--grid", action="store_true",
                    help="Also rank with each setting tried on the tune half.")
    ap.add_argument("--latency", type=int, default=0, metavar="CHUNKS",
                    help="Only time the ranking at this many chunks, shipped against before "
                         "these signals (bench/quality.py run_latency); writes "
                         "multilang_latency.json.")
    ap.add_argument("--out", default="multilang")
    ap.add_argument("--per-query", type=Path, default=None, metavar="FILE",
                    help="Also write each query's row (scores, files ranked) to FILE, one"
                         " JSON object a line; not a result file: keep it out of git.")
    ap.add_argument("--vector-kinds", default=None,
                    help="comma-separated file kinds (code, tests, docs, examples, config)"
                         " whose chunks keep their vectors; the others get none, as if"
                         " never embedded (default: every kind)")
    args = ap.parse_args()
    if args.vector_kinds is not None:
        global VECTOR_KINDS
        VECTOR_KINDS = frozenset(k.strip() for k in args.vector_kinds.split(",") if k.strip())
    if args.latency:
        from bench.quality import SHARED, run_latency

        got = run_latency(args.latency, [SHARED / "swebench" / "verified_dev.jsonl"])
        for label in ("short", "issue"):
            print(label, {k: round(v, 2) for k, v in got[label].items()})
        write_json("multilang_latency", got)
        return
    set_up_run(args.data)
    pins = read_pins()
    if not is_built(args.data, pins):
        build(args.data, args.mirrors, pins)
    pins, queries = load(args.data)
    halves = set(args.halves.split(","))
    wanted = set(filter(None, args.repos.split(",")))
    pins = [p for p in pins if p.half in halves and (not wanted or p.repo in wanted)]

    started = time.perf_counter()
    vectors = args.stage in ("warm", "eval")
    enc, repos = prepare_repos(pins, queries, args.data, args.threads, embed=vectors)
    if args.stage == "plan":
        print(table(["repo", "half", "files", "chunks"],
                    [[r.pin.repo, r.pin.half, r.files, r.chunks] for r in repos.values()]))
        print(f"total chunks {sum(r.chunks for r in repos.values()):,}")
        return
    if args.stage == "warm":
        return
    chosen = systems(args.grid)
    rows = evaluate(repos, queries, chosen, vectors=vectors)
    names = [BM25, *[s.name for s in chosen if vectors or not s.vectors]]
    report = print_tables(rows, names)
    report["tokens_to_first_relevant"] = reading_table(rows)
    write_json(args.out, {
        "model": enc.model_id, "stage": args.stage, "ndcg_at": NDCG_AT,
        "repos": [{"repo": r.pin.repo, "commit": r.pin.commit, "language": r.pin.language,
                   "half": r.pin.half, "files": r.files, "chunks": r.chunks}
                  for r in repos.values()],
        "systems": names, "report": report, "queries": len(rows),
        "seconds": round(time.perf_counter() - started, 1),
    })
    if args.per_query is not None:
        with args.per_query.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
