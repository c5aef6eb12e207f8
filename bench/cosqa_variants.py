"""CoSQA: what else was tried to beat plain MiniLM, on the vector side and in fusion.

    python bench/cosqa_variants.py --data DIR [--embedder minilm-torch]

The quality benchmark (bench/quality.py) shows the `path > symbol` header costing CoSQA
MRR while it is worth the most on SWE-bench. This runs the ideas that could win CoSQA
back without a second vector per chunk, each against the same vectors, exact cosine
search, a function ranked by its best chunk (MRR cut at 300 chunks):

- renderings of a chunk for the model: the lines alone; with the `path > symbol` line
  (shipped); with the symbol only; the symbol in words (`write boolean`); the language
  name; every identifier of the body split into words; and a second vector of the
  docstring, a chunk scored by the better of its two;
- the query: the language word (`python`, in all 500 queries) taken out; pseudo-relevance
  feedback (the query moved toward its top 3 chunks); the corpus mean taken out of the
  query;
- BM25 (codeveil's chunk index) fused with the vectors: reciprocal rank at two weights,
  and two score combinations (cosine scaled by its theoretical minimum, or min-max over
  the candidates, plus BM25 over its maximum);
- with the vectors the shipped index stores (the body embedded with its header, and the
  header's own vector): the header's share taken back out of each body vector (body minus
  a multiple of the header vector, scaled by the header's share of the chunk's word
  pieces); the corpus mean, or the mean and its top principal directions ("all but the
  top"), taken out of every body vector; and the query dressed as code (a comment, a
  docstring, a `> ` line like a header's) before it is embedded.

Vectors come through the embedding cache under DIR (the quality benchmark fills it for
the lines, the header and the header vectors; `--renderings` skips the others, which
embed the corpus once each). MRR is printed for all queries and for the tune and report
halves of bench/quality.py's rule. Writes bench/results/cosqa_variants.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quality as Q
from bench._common import table, write_json

DEPTH = 300  # chunks looked at per query
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOCSTRING = re.compile(r'(?s)^\s*(?:def|class)[^\n]*:\s*\n\s*[rRbBuU]?("""|\'\'\')(.*?)\1')
LANGUAGE_WORD = re.compile(r"\b(python3?|py)\b", re.I)


def in_words(text: str) -> str:
    """Every identifier split into its words: `writeBoolean(n)` -> `write boolean(n)`."""
    from indexer.lexical_tokens import split_identifier

    def words(m: re.Match) -> str:
        parts = split_identifier(m.group(0))
        return " ".join(parts) if len(parts) > 1 else m.group(0)

    return IDENT.sub(words, text)


def symbol_in_words(symbol: str) -> str:
    return " > ".join(in_words(s).replace("_", " ").strip() for s in symbol.split(" > "))


RENDERINGS: dict[str, Callable] = {
    "lines": lambda c: c.text,
    "path > symbol line (shipped)": lambda c: c.embed_text,
    "symbol line": lambda c: f"{c.symbol}\n{c.text}" if c.symbol else c.text,
    "symbol in words": lambda c: f"{symbol_in_words(c.symbol)}\n{c.text}" if c.symbol
    else c.text,
    "language line": lambda c: f"{c.language}\n{c.text}",
    "identifiers in words": lambda c: in_words(c.text),
}


class Ranks:
    """First rank of the gold function per query, for each system."""

    def __init__(self, paths: Sequence[str], golds: Sequence[str]) -> None:
        self.paths = paths
        self.golds = golds
        self.systems: dict[str, list[int | None]] = {}

    def first(self, order: Sequence[int], gold: str) -> int | None:
        """Rank of `gold` among the distinct functions of the chunks in `order`."""
        files = Q.files_from_windows(((self.paths[i], 0.0) for i in order), len(order))
        return Q.first_gold(files, {gold})

    def add_scores(self, name: str, scores: np.ndarray) -> None:
        """`scores`: [queries, chunks]."""
        self.systems[name] = [
            self.first(np.argsort(-s, kind="stable")[:DEPTH], g)
            for s, g in zip(scores, self.golds, strict=True)]

    def add_orders(self, name: str, orders: Sequence[Sequence[int]]) -> None:
        self.systems[name] = [self.first(o, g) for o, g in zip(orders, self.golds, strict=True)]

    def summary(self) -> dict[str, dict[str, float]]:
        return Q.mrr_summary(self.systems)

    def halves(self, halves: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
        return {h: Q.mrr_summary({s: [x for x, hx in zip(r, halves, strict=True) if hx == h]
                                  for s, r in self.systems.items()})
                for h in Q.HALVES}


def unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


SHIPPED_RENDERING = "path > symbol line (shipped)"
QUERY_DRESS = {"a comment": "# {q}", "a docstring": '"""{q}"""', "a `> ` line": "> {q}"}


def shipped_variants(ranks: Ranks, enc, chunks: Sequence, queries: Sequence[str],
                     qv: np.ndarray, shipped: np.ndarray, lines: np.ndarray) -> None:
    """Rows that start from the vectors the shipped index holds, to take the header's
    pull back out of them for a query in plain words (CoSQA's paths are `corpus/<id>.py`,
    so the header adds a number and a name)."""
    from indexer.tokens import default_counter

    headers = Q.embed_all(enc, [c.header for c in chunks], "headers")
    counter = default_counter()
    pieces = np.array(counter.count_batch([c.embed_text for c in chunks]), dtype=np.float32)
    share = np.minimum(np.array(counter.count_batch([c.header for c in chunks]),
                                dtype=np.float32) / np.minimum(pieces, enc.embedder.max_tokens),
                       1.0)[:, None]
    for b in (0.5, 1.0, 2.0):
        ranks.add_scores(f"shipped; body - {b} x header share x header vector",
                         qv @ unit(shipped - b * share * headers).T)
    mean = shipped.mean(axis=0)
    ranks.add_scores("shipped; 0.5 x corpus mean out of the chunks",
                     qv @ unit(shipped - 0.5 * mean).T)
    centred = shipped - mean
    sample = np.random.default_rng(0).choice(len(centred), min(len(centred), 5000),
                                             replace=False)
    top = np.linalg.svd(centred[sample], full_matrices=False)[2]
    for d in (1, 2):
        ranks.add_scores(f"shipped; all but the top {d} direction(s)",
                         qv @ unit(centred - (centred @ top[:d].T) @ top[:d]).T)
    for name, dress in QUERY_DRESS.items():
        dressed = Q.embed_all(enc, [dress.format(q=q) for q in queries], name)
        ranks.add_scores(f"shipped; the query as {name}", dressed @ shipped.T)
        ranks.add_scores(f"lines; the query as {name}", dressed @ lines.T)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cosqa", type=Path, default=Q.SHARED / "cosqa")
    parser.add_argument("--embedder", default="minilm-torch")
    parser.add_argument("--renderings", default=",".join(RENDERINGS),
                        help="Chunk renderings to embed and rank, comma-separated (the lines"
                             " and the shipped one are always in).")
    parser.add_argument("--out", default="cosqa_variants")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    os.environ.setdefault("CODEVEIL_CACHE_DIR", str(args.data / "cache"))
    from indexer.location import ChunkLocation
    from retrieval.indexes.lexical import lexical_text
    from retrieval.search.options import ranked, rrf

    enc, _plain = Q._embedders(args.embedder)
    rows = [json.loads(line) for line in (args.cosqa / "dev.jsonl").open()]
    corpus = Q.cosqa_corpus(args.cosqa / "corpus.jsonl")
    chunks = corpus.chunks
    queries = [r["query"] for r in rows]
    ranks = Ranks([c.path for c in chunks], [f"corpus/{r['gold_doc_id']}.py" for r in rows])
    qv = Q.embed_all(enc, queries, "queries")

    wanted = {"lines", SHIPPED_RENDERING, *(r for r in args.renderings.split(",") if r)}
    vectors, scores = {}, {}
    for name, render in RENDERINGS.items():
        if name not in wanted:
            continue
        vectors[name] = Q.embed_all(enc, [render(c) for c in chunks], name)
        scores[name] = qv @ vectors[name].T
        ranks.add_scores(f"chunks as {name}", scores[name])
    lines = vectors["lines"]
    base = scores["lines"]
    shipped_variants(ranks, enc, chunks, queries, qv, vectors[SHIPPED_RENDERING], lines)

    # A second vector per chunk from its docstring; the chunk scores its better one.
    docs = [m.group(2).strip() if (m := DOCSTRING.search(c.text)) else "" for c in chunks]
    has = [i for i, d in enumerate(docs) if d]
    doc_vectors = lines.copy()
    doc_vectors[has] = Q.embed_all(enc, [docs[i] for i in has], "docstrings")
    ranks.add_scores("lines, or the docstring's vector if better",
                     np.maximum(base, qv @ doc_vectors.T))

    stripped = [re.sub(r"\s+", " ", LANGUAGE_WORD.sub(" ", q)).strip() or q for q in queries]
    ranks.add_scores("lines; query without the language word",
                     Q.embed_all(enc, stripped, "queries without the language") @ lines.T)
    top = np.argsort(-base, axis=1)[:, :3]
    ranks.add_scores("lines; query + 0.3 x mean of its top 3 (feedback)",
                     unit(qv + 0.3 * lines[top].mean(axis=1)) @ lines.T)
    ranks.add_scores("lines; query - 0.5 x corpus mean",
                     unit(qv - 0.5 * lines.mean(axis=0)) @ lines.T)

    memo = Q.Memo()
    lex_docs = [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language)
                for c in chunks]
    lex = Q.lexical_index(lex_docs, [lexical_text(c) for c in chunks], memo)
    fused: dict[str, list[list[int]]] = {}
    bm25 = [dict(lex.top(q, 100)) for q in queries]
    # The same fusions over the lines' vectors and over the shipped ones.
    for label, rendering in (("lines", "lines"), ("shipped", SHIPPED_RENDERING)):
        for s, bm in zip(scores[rendering], bm25, strict=True):
            vec = np.argsort(-s, kind="stable")[:100]
            for w in (0.25, 0.1):
                f = rrf([list(vec), list(bm)], weights=[1.0, w], k=20)
                fused.setdefault(f"{label} + BM25, RRF weight {w}", []).append(
                    [i for i, _ in ranked(f)])
            cand = set(vec.tolist()) | set(bm)
            top_cos, low_cos = float(s[vec[0]]), float(s[vec[-1]])
            top_bm = max(bm.values(), default=1.0) or 1.0
            for a in (0.95, 0.9):
                sc = {i: a * (s[i] + 1) / (top_cos + 1) + (1 - a) * bm.get(i, 0.0) / top_bm
                      for i in cand}
                fused.setdefault(f"{label} + BM25, {a} cosine + {1 - a:.2f} BM25",
                                 []).append([i for i, _ in ranked(sc)])
            for a in (0.9, 0.8):
                sc = {i: a * (s[i] - low_cos) / max(top_cos - low_cos, 1e-9)
                      + (1 - a) * bm.get(i, 0.0) / top_bm for i in cand}
                fused.setdefault(f"{label} + BM25, min-max {a} + {1 - a:.1f}", []).append(
                    [i for i, _ in ranked(sc)])
    for name, orders in fused.items():
        ranks.add_orders(name, orders)

    summary = ranks.summary()
    halves = ranks.halves(Q.cosqa_halves([r["id"] for r in rows]))
    print(f"\nCoSQA dev, {len(rows)} queries, vector search over {len(chunks)} chunks: MRR")
    print(table(["system", "all", "tune", "report", "R@1", "R@10"],
                [[s, v["mrr"], halves["tune"][s]["mrr"], halves["report"][s]["mrr"],
                  v["recall@1"], v["recall@10"]] for s, v in summary.items()]))
    path = write_json(args.out, {"model": enc.model_id, "queries": len(rows),
                                 "systems": summary, "halves": halves})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
