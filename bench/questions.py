"""Questions people ask, written by reading the code: both tiers, file-level NDCG@10.

    python bench/questions.py --data DIR [--mirrors DIR] [--stage lexical|eval]
        [--halves tune,report] [--repos a/b,c/d] [--threads N] [--out questions]

The question set (bench/questions/<owner>+<name>.jsonl, data we wrote): for each of its
public repositories, pinned to a commit, about twenty questions written from the code
before any search ran on it, never edited after: "how does X work" (`how`), "what
implements / where is X" in plain words (`what`), and names (`symbol`), each with its
gold file(s) and, where the answer is one definition, its span. None of the
repositories is one of those the benchmark kept from us holds. Unlike the dev set of
bench/multilang.py (doc comments, commit subjects, module headers: words their code
shares), these questions say what code does in the asker's words, so they can see
what a vote by meaning adds.

The split is by repository (`bench.multilang_build.half_of`): settings are chosen on
tune, numbers published from report. Each question's word overlap with its gold files
(the share of its content words, by stem, that occur in them) is reported per kind.

Systems, over the files `codeveil index` keeps, as bench/multilang.py runs them:
- BM25 files: whole-file BM25 (`bm25s`).
- the model alone: the body vectors' ranking, no words, names or paths.
- codeveil (shipped defaults): the production ranking with vectors (the second tier).
- codeveil, no vectors: the words tier, what `index` answers with before the builder.
- the words tier's parts switched off in turn (the ablation).

Scores are NDCG@10 of the ten chunks `codeveil search` prints (their files, in order).
Prints per-kind, per-language and per-repository tables for each half; writes
bench/results/<out>.json (summaries only) and the per-question rows to --data.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIRRORS, ROOT, table, unpack_mirror, write_json
from bench.multilang import (
    BM25,
    NDCG_AT,
    NO_VECTORS,
    System,
    evaluate,
    mean_by,
    prepare_repos,
    print_tables,
    set_up_run,
)
from bench.multilang_build import Pin, Query, half_of, tree_path

log = logging.getLogger("bench.questions")

QUESTIONS = ROOT / "bench" / "questions"
KINDS = ("how", "what", "symbol")
MODEL_ALONE = {"hybrid": False, "evidence": False, "w_path": 0.0, "w_header_vector": 0.0,
               "w_header_vector_prose": 0.0, "w_meaning_identifier": 1.0, "w_static_meaning": 0.0}
# The static model's vectors alone (indexer.static_embedder): no words, names or MiniLM.
STATIC_ALONE = {**MODEL_ALONE, "w_vector": 0.0, "w_static_meaning": 1.0}


def load_questions(folder: Path = QUESTIONS) -> tuple[list[Pin], list[Query], list[dict]]:
    """The pins (one per repository), the questions as the benchmark's queries, and the
    questions as written (for their spans and ids)."""
    pins: dict[str, Pin] = {}
    queries: list[Query] = []
    raw: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            q = json.loads(line)
            if q["kind"] not in KINDS:
                raise SystemExit(f"{path.name}: {q['id']}: kind {q['kind']!r} not in {KINDS}")
            pin = pins.setdefault(q["repo"], Pin(q["repo"], q["commit"], q["language"],
                                                 half_of(q["repo"])))
            if pin.commit != q["commit"]:
                raise SystemExit(f"{path.name}: {q['id']}: a second commit for {q['repo']}")
            queries.append(Query(q["repo"], q["kind"], q["query"], tuple(q["gold"]),
                                 q["language"]))
            raw.append(q)
    return list(pins.values()), queries, raw


def ensure_trees(data: Path, mirrors: Path, pins: Sequence[Pin]) -> None:
    """Each repository's tree at its commit under `data/trees/` (kept between runs)."""
    for pin in pins:
        dest = tree_path(data, pin.repo)
        if not dest.is_dir():
            log.info("unpacking %s at %s", pin.repo, pin.commit[:12])
            tmp = dest.with_name(dest.name + ".part")
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp)
            unpack_mirror(pin.repo, tmp, mirrors, pin.commit)
            tmp.rename(dest)


def overlap(query: str, gold_texts: Sequence[str]) -> float:
    """The share of a question's content words (by stem) found among its gold files'
    words: 1.0 for a question that only repeats the code's words."""
    from indexer.lexical_tokens import stem, tokenize
    from retrieval.search.query import STOPWORDS

    words = {stem(w) for w in tokenize(query) if w not in STOPWORDS and len(w) > 2}
    if not words:
        return 0.0
    present = {stem(w) for text in gold_texts for w in tokenize(text)}
    return len(words & present) / len(words)


def grid_rows() -> list[System]:
    """The words tier's settings tried on the tune half."""
    nv = NO_VECTORS
    rows = [System(f"words: path vote {w}", {**nv, "w_path": w}, vectors=False)
            for w in (0.0, 0.05, 0.1, 0.25)]
    rows += [System(f"words: saturation {f}", {**nv, "saturation": f}, vectors=False)
             for f in (0.3, 0.5, 0.7)]
    rows += [System(f"words: non-code x{f}", {**nv, "w_non_code": f}, vectors=False)
             for f in (0.2, 0.4, 0.6)]
    rows += [System(f"words: file vote {w}", {**nv, "w_file_vote": w}, vectors=False)
             for w in (0.25, 0.5, 1.0)]
    rows += [System(f"words: file vote {w}, path 0.1", {**nv, "w_file_vote": w, "w_path": 0.1},
                    vectors=False) for w in (0.5, 1.0)]
    rows += [System("words: file first off", {**nv, "file_first": False}, vectors=False)]
    # With every vector: the fusion's weights for questions in plain words.
    rows += [System(f"vectors: prose BM25 {w}", {"w_lexical_prose": w}) for w in (0.5, 1.0)]
    rows += [System(f"vectors: file vote {w}", {"w_file_vote_meaning": w}) for w in (0.5, 1.0)]
    rows += [System(f"vectors: prose header vector {w}", {"w_header_vector_prose": w})
             for w in (0.25, 0.5)]
    rows += [System(f"vectors: vector weight {w}", {"w_vector": w}) for w in (0.5, 2.0)]
    rows += [System("vectors: question words kept", {"question_words_out": False})]
    # The static tier's vote: alone (the words tier's first answer) and beside the vectors.
    rows += [System(f"words: static vote {w}", {**nv, "w_static": w}, vectors=False)
             for w in (0.25, 0.5, 1.0, 1.5)]
    rows += [System(f"vectors: static vote {w}", {"w_static_meaning": w})
             for w in (0.0, 0.1, 0.5)]
    return rows


def systems(vectors: bool, grid: bool = False) -> list[System]:
    """The rows: the tiers, the model alone, and the words tier's ablation (with `grid`,
    the settings tried on the tune half)."""
    rows = []
    if vectors:
        rows += [System("codeveil (shipped defaults)", {}),
                 System("the model alone", MODEL_ALONE),
                 System("the static model alone", STATIC_ALONE, vectors=False)]
    rows += [
        System("codeveil, no vectors (words tier)", NO_VECTORS, vectors=False),
        System("words tier, no static vote", {**NO_VECTORS, "w_static": 0.0}, vectors=False),
        System("words tier, no path vote", {**NO_VECTORS, "w_path": 0.0}, vectors=False),
        System("words tier, no evidence", {**NO_VECTORS, "evidence": False}, vectors=False),
        System("words tier, question words kept", {**NO_VECTORS, "question_words_out": False},
               vectors=False),
        System("words tier, every kind alike", {**NO_VECTORS, "w_non_code": 1.0},
               vectors=False),
        System("words tier, no saturation", {**NO_VECTORS, "saturation": 1.0,
                                             "file_first": False}, vectors=False),
        System("BM25 chunks only", {**NO_VECTORS, "evidence": False, "w_non_code": 1.0,
                                    "w_path": 0.0}, vectors=False),
    ]
    return rows + (grid_rows() if grid else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="Folder for trees, chunk lists, the embedding cache and the "
                         "per-question rows.")
    ap.add_argument("--mirrors", type=Path, default=MIRRORS)
    ap.add_argument("--stage", choices=("lexical", "warm", "eval"), default="eval",
                    help="lexical: the words tier and BM25 only (no model); warm: only "
                         "embed; eval: everything.")
    ap.add_argument("--repos", default="", help="Only these owner/name, comma-separated.")
    ap.add_argument("--halves", default="tune,report")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--grid", action="store_true",
                    help="Also rank with each words-tier setting tried on the tune half.")
    ap.add_argument("--out", default="questions")
    args = ap.parse_args()
    set_up_run(args.data)
    pins, queries, _written = load_questions()
    halves = set(args.halves.split(","))
    wanted = set(filter(None, args.repos.split(",")))
    pins = [p for p in pins if p.half in halves and (not wanted or p.repo in wanted)]
    ensure_trees(args.data, args.mirrors, pins)

    started = time.perf_counter()
    vectors = args.stage in ("warm", "eval")
    enc, repos = prepare_repos(pins, queries, args.data, args.threads, embed=vectors)
    if args.stage == "warm":
        return
    chosen = systems(vectors, args.grid)
    rows = evaluate(repos, queries, chosen, vectors=vectors)
    names = [BM25, *[s.name for s in chosen if vectors or not s.vectors]]
    report = print_tables(rows, names)

    # Word overlap of each question with its gold files, by kind and half.
    texts = {}
    for q in queries:
        if q.repo in repos:
            root = tree_path(args.data, q.repo)
            texts[q] = [(root / g).read_text(errors="replace") for g in q.gold
                        if (root / g).is_file()]
    for r in rows:
        q = next(q for q in queries if q.repo == r["repo"] and q.text == r["query"])
        r["overlap"] = overlap(q.text, texts[q])
    print("\nWord overlap of the questions with their gold files (share of content words)")
    ov = {}
    for half in ("tune", "report"):
        hr = [r for r in rows if r["half"] == half]
        if hr:
            ov[half] = {k: float(np.mean([r["overlap"] for r in hr if r["kind"] == k]))
                        for k in KINDS if any(r["kind"] == k for r in hr)}
            ov[half]["all"] = float(np.mean([r["overlap"] for r in hr]))
    print(table(["half", *KINDS, "all"],
                [[h, *[v.get(k, float("nan")) for k in (*KINDS, "all")]]
                 for h, v in ov.items()]))
    report["overlap"] = ov
    # Low-overlap questions, the ones only meaning can answer: each system's mean there.
    low = {}
    for half in ("tune", "report"):
        hr = [r for r in rows if r["half"] == half and r["overlap"] < 0.5]
        if hr:
            low[half] = mean_by(hr, lambda r: "all")["all"]
    report["overlap_below_half"] = low

    args.data.mkdir(parents=True, exist_ok=True)
    with (args.data / f"{args.out}.rows.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_json(args.out, {
        "model": enc.model_id, "stage": args.stage, "ndcg_at": NDCG_AT,
        "questions": len(rows),
        "repos": [{"repo": r.pin.repo, "commit": r.pin.commit, "language": r.pin.language,
                   "half": r.pin.half, "files": r.files, "chunks": r.chunks}
                  for r in repos.values()],
        "systems": names, "report": report,
        "seconds": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
