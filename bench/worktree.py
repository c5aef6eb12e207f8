"""A second worktree of an indexed repository: how soon it is searchable.

    python bench/worktree.py [--repo DIR] [--embedder minilm|hashing] [--out worktree]

A clone of `--repo` (default: this repository, at HEAD) is indexed cold, with an empty
embedding cache, through the CLI (`codeveil index --json`), as a user would; then
`git worktree add` makes a second checkout of it, which is indexed the same way with the
cache the first one filled, and searched (words and vectors both). The embedding cache is
by content, so the second index embeds nothing the first did, and the first's chunk
table gives it every file's chunks (indexer.sibling_chunks); what is left is reading the
files, the local indexes and the store. Prints both rows and their ratio; writes
bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, isolate, table, write_json

QUERY = "how a file's chunk rows are padded before upload"
CLI = [sys.executable, "-m", "retrieval"]


def codeveil(cwd: Path, *args: str) -> tuple[float, Any]:
    """Run the CLI in `cwd`; (wall seconds, its parsed --json output)."""
    started = time.perf_counter()
    done = subprocess.run([*CLI, *args, "--json"], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"codeveil {' '.join(args)} failed in {cwd}:\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def index_row(name: str, cwd: Path) -> dict[str, Any]:
    seconds, report = codeveil(cwd, "index", "--wait", ".")
    keys = ("files_changed", "files_reused", "chunks_total", "chunks_embedded", "chunks_from_cache",
            "headers_embedded", "seconds_chunk", "seconds_embed", "seconds_sync",
            "seconds_search_ready")
    row = {"checkout": name, "seconds": round(seconds, 2)}
    row.update({k: report.get(k) for k in keys})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="A git repository to clone.")
    ap.add_argument("--embedder", default="minilm",
                    help="CODEVEIL_EMBEDDER for both indexes (hashing: a quick run whose "
                         "embedding costs next to nothing, so the ratio means less).")
    ap.add_argument("--out", default="worktree")
    args = ap.parse_args()
    base = isolate()  # an empty embedding cache and config dir
    os.environ["CODEVEIL_EMBEDDER"] = args.embedder
    first, second = base / "first", base / "second"
    subprocess.run(["git", "clone", "-q", str(args.repo), str(first)], check=True)
    commit = subprocess.run(["git", "-C", str(first), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    rows = [index_row("first clone, cold (empty embedding cache)", first)]
    subprocess.run(["git", "-C", str(first), "worktree", "add", "-q", "--detach",
                    str(second)], check=True)
    rows.append(index_row("second worktree (cache filled by the first)", second))
    search_s, hits = codeveil(second, "search", QUERY, "-k", "5")
    found = [h.get("path") for h in (hits.get("hits", hits) if isinstance(hits, dict) else hits)]
    ratio = rows[1]["seconds"] / rows[0]["seconds"]
    print(table(["checkout", "seconds", "files", "files' chunks reused", "chunks",
                 "embedded", "from cache", "chunk s"],
                [[r["checkout"], r["seconds"], r["files_changed"], r["files_reused"],
                  r["chunks_total"], r["chunks_embedded"], r["chunks_from_cache"],
                  r["seconds_chunk"]] for r in rows]))
    print(f"second / first: {ratio:.3f}; a search in the second: {search_s:.2f} s, "
          f"top files {found[:3]}")
    write_json(args.out, {"repo": str(args.repo), "commit": commit,
                          "embedder": args.embedder, "rows": rows, "ratio": round(ratio, 4),
                          "search": {"query": QUERY, "seconds": round(search_s, 2),
                                     "top": found[:5]},
                          "load_avg": os.getloadavg()[0]})
    if not found:
        raise SystemExit("the second worktree's search found nothing")


if __name__ == "__main__":
    main()
