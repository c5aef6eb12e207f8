"""Word pieces each vector reads: what the model's work is made of, by kind of file.

    python bench/word_pieces.py [TREE ...] [--name NAME]

Chunks every file of each tree as `codeveil index` does and tokenizes what the model
sees of each chunk (its `path > symbol` header and its text) with the model's own
tokenizer. The forward pass of this small model costs about its word pieces (at 256
pieces attention is under a tenth of a layer's multiply-adds), so the share of pieces
past a cut is about the share of the model's time a cut would save. Per kind of file
(code, tests, docs, examples, config): chunks, pieces p50/p90/p99, the share of all
pieces that lie past 64 and past 128 pieces of a chunk, and the share a cut of the text
at `--cut-chars` characters (`indexer.chunk.embed_head`) keeps. Default trees: this
repository.
Writes bench/results/word_pieces[_NAME].json.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, table, write_json
from indexer.chunk import chunk_header, embed_head
from indexer.chunker import chunk_file
from indexer.kinds import file_kind
from indexer.tokens import get_tokenizer
from indexer.walk import SourceFile, read_source, walk_repo

CUTS = (64, 128)


def pieces_by_kind(trees: list[Path], cut: int) -> tuple[dict[str, list[int]],
                                                        dict[str, list[int]]]:
    """kind -> the word pieces of each chunk's embedded text (special tokens included),
    whole and cut at `cut` characters."""
    tokenizer = get_tokenizer()
    out: dict[str, list[int]] = defaultdict(list)
    kept: dict[str, list[int]] = defaultdict(list)
    for tree in trees:
        texts: list[tuple[str, str]] = []
        for entry in walk_repo(tree).files:
            path = entry.path
            source = read_source(tree, path)
            if not isinstance(source, SourceFile):
                continue
            kind = file_kind(path).value
            texts.extend((kind, chunk_header(c.path, c.symbol), c.text)
                         for c in chunk_file(path, source.text))
        whole = tokenizer.encode_batch([f"{h}\n{t}" for _, h, t in texts])
        heads = tokenizer.encode_batch([f"{h}\n{embed_head(t, cut)}" for _, h, t in texts])
        for (kind, _, _), w, c in zip(texts, whole, heads, strict=True):
            out[kind].append(len(w.ids))
            kept[kind].append(len(c.ids))
    return dict(out), dict(kept)


def summary(counts: list[int], kept: list[int]) -> dict[str, float]:
    a = np.asarray(counts, dtype=np.int64)
    total = int(a.sum())
    row: dict[str, float] = {
        "chunks": len(a), "pieces": total,
        "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
    }
    for cut in CUTS:
        row[f"share_past_{cut}"] = round(float(np.clip(a - cut, 0, None).sum()) / max(total, 1), 4)
    row["share_kept_by_cut"] = round(sum(kept) / max(total, 1), 4)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    ap.add_argument("--name", default="")
    ap.add_argument("--cut-chars", type=int, default=480)
    args = ap.parse_args()
    by_kind, kept = pieces_by_kind(args.trees, args.cut_chars)
    rows = {kind: summary(v, kept[kind]) for kind, v in sorted(by_kind.items())}
    rows["all"] = summary([n for v in by_kind.values() for n in v],
                          [n for v in kept.values() for n in v])
    headers = ["kind", "chunks", "pieces", "p50", "p90", "p99",
               *(f"share past {c}" for c in CUTS), f"kept by a {args.cut_chars}-char cut"]
    print(table(headers, [[k, *r.values()] for k, r in rows.items()]))
    write_json("word_pieces" + (f"_{args.name}" if args.name else ""), {
        "trees": [str(t) for t in args.trees], "cut_chars": args.cut_chars,
        "by_kind": rows})


if __name__ == "__main__":
    main()
