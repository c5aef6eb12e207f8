"""What the first answer costs: each step of `codeveil index` before it returns, the static
tier's beside the others, measured in one process.

    python bench/first_tier.py [--tree NAME=FOLDER ...] [--runs 3] [--out first_tier]

For each tree (default: the installed `requests` package and codeveil's own source), each
run copies it to a fresh folder (an empty cache and config dir) and times, one after the
other: the local pass (`Workspace.index_words`: walk, chunk, the chunk table), then each
derived index built from scratch: the lexical one, the static vectors (the first tier
of meaning, `retrieval.indexes.static_vectors`) and the grep index; and the static
model's encoding of a short question (the query's whole cost of that tier). `codeveil
index` builds the static vectors in a thread beside the other two, so on two free cores
its wall time grows by less than their sum. Medians of `--runs`; writes
bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, table, write_json

STEPS = ("index_words", "lexical", "static", "grep")


def default_trees() -> dict[str, Path]:
    import requests

    return {"requests": Path(requests.__file__).parent,
            "codeveil": ROOT}


def _copy(src: Path, dest: Path) -> None:
    # Under src/: a copy of codeveil's own packages must not shadow the code that runs.
    shutil.copytree(src, dest / "src", ignore=shutil.ignore_patterns(
        ".venv", ".git", ".codeveil", "__pycache__", "results", "static_model"))


def one_run(src: Path) -> dict[str, float]:
    from indexer.embedder import HashingEmbedder
    from indexer.local_chunks import open_state_db
    from retrieval.indexes.lexical import LexicalStore
    from retrieval.indexes.static_vectors import StaticVectorStore
    from retrieval.indexes.trigram_index import TrigramStore
    from sync.checkout.config import codeveil_dir, state_path
    from sync.workspace.workspace import Workspace

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        os.environ["CODEVEIL_CACHE_DIR"] = str(base / "cache")
        os.environ["CODEVEIL_CONFIG_DIR"] = str(base / "config")
        repo = base / "repo"
        _copy(src, repo)
        out: dict[str, float] = {}
        ws = Workspace(repo, embedder=HashingEmbedder())
        t = time.perf_counter()
        report = ws.index_words()
        out["index_words"] = time.perf_counter() - t
        ws.close()
        out["chunks"] = report.chunks_total
        db = open_state_db(state_path(repo))
        folder = codeveil_dir(repo)
        static = StaticVectorStore(folder / "static")
        for name, build in (("lexical", lambda: LexicalStore(folder / "lexical").current(db)),
                            ("static", lambda: static.index(db)),
                            ("grep", lambda: TrigramStore(folder / "trigrams").current(db))):
            t = time.perf_counter()
            build()
            out[name] = time.perf_counter() - t
        db.close()
        model = static.embedder
        t = time.perf_counter()
        for i in range(200):
            model.embed_batch([f"where do we retry failed uploads {i}"])
        out["query_ms"] = (time.perf_counter() - t) / 200 * 1000
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=FOLDER")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="first_tier")
    args = ap.parse_args()
    trees = ({n: Path(p) for n, p in (t.split("=", 1) for t in args.tree)} if args.tree
             else default_trees())
    rows = {}
    for name, src in trees.items():
        runs = [one_run(src) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows[name] = {k: round(v, 4) for k, v in med.items()}
        print(f"{name}: {rows[name]}", flush=True)
    header = ["tree", "chunks", *(f"{s} s" for s in STEPS), "static ms/chunk", "query ms"]
    print(table(header, [[n, int(r["chunks"]), *(r[s] for s in STEPS),
                          1000 * r["static"] / max(r["chunks"], 1), r["query_ms"]]
                         for n, r in rows.items()]))
    write_json(args.out, {"runs": args.runs, "trees": rows, "steps": list(STEPS)})


if __name__ == "__main__":
    main()
