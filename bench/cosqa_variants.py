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
  the candidates, plus BM25 over its maximum).

Vectors come through the embedding cache under DIR (the quality benchmark fills it for
the lines and the header). Writes bench/results/cosqa_variants.json.
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


def unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cosqa", type=Path, default=Q.SHARED / "cosqa")
    parser.add_argument("--embedder", default="minilm-torch")
    parser.add_argument("--out", default="cosqa_variants")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    os.environ.setdefault("CODEVEIL_CACHE_DIR", str(args.data / "cache"))
    from retrieval.fusion import ranked, rrf
    from retrieval.lexical import LexDoc, lexical_text

    enc, _plain = Q._embedders(args.embedder)
    rows = [json.loads(line) for line in (args.cosqa / "dev.jsonl").open()]
    corpus = Q.cosqa_corpus(args.cosqa / "corpus.jsonl")
    chunks = corpus.chunks
    queries = [r["query"] for r in rows]
    ranks = Ranks([c.path for c in chunks], [f"corpus/{r['gold_doc_id']}.py" for r in rows])
    qv = Q.embed_all(enc, queries, "queries")

    vectors = {}
    for name, render in RENDERINGS.items():
        vectors[name] = Q.embed_all(enc, [render(c) for c in chunks], name)
        ranks.add_scores(f"chunks as {name}", qv @ vectors[name].T)
    lines = vectors["lines"]
    base = qv @ lines.T

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
    lex_docs = [LexDoc(c.path, c.start_line, c.end_line, c.symbol, c.language) for c in chunks]
    lex = Q.lexical_index(lex_docs, [lexical_text(c) for c in chunks], memo)
    fused: dict[str, list[list[int]]] = {}
    for q, s in zip(queries, base, strict=True):
        vec = np.argsort(-s, kind="stable")[:100]
        bm = dict(lex.top(q, 100))
        for w in (0.25, 0.1):
            f = rrf([list(vec), list(bm)], weights=[1.0, w], k=20)
            fused.setdefault(f"lines + BM25, RRF weight {w}", []).append(
                [i for i, _ in ranked(f)])
        cand = set(vec.tolist()) | set(bm)
        top_cos, low_cos = float(s[vec[0]]), float(s[vec[-1]])
        top_bm = max(bm.values(), default=1.0) or 1.0
        for a in (0.95, 0.9):
            sc = {i: a * (s[i] + 1) / (top_cos + 1) + (1 - a) * bm.get(i, 0.0) / top_bm
                  for i in cand}
            fused.setdefault(f"lines + BM25, {a} cosine + {1 - a:.2f} BM25", []).append(
                [i for i, _ in ranked(sc)])
        sc = {i: 0.9 * (s[i] - low_cos) / max(top_cos - low_cos, 1e-9)
              + 0.1 * bm.get(i, 0.0) / top_bm for i in cand}
        fused.setdefault("lines + BM25, min-max 0.9 + 0.1", []).append(
            [i for i, _ in ranked(sc)])
    for name, orders in fused.items():
        ranks.add_orders(name, orders)

    summary = ranks.summary()
    print(f"\nCoSQA dev, {len(rows)} queries, vector search over {len(chunks)} chunks")
    print(table(["system", "MRR", "R@1", "R@10"],
                [[s, v["mrr"], v["recall@1"], v["recall@10"]] for s, v in summary.items()]))
    path = write_json(args.out, {"model": enc.model_id, "queries": len(rows),
                                 "systems": summary})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
