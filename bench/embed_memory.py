"""Peak memory and time of embedding a repository's chunks, by batch budget.

    python bench/embed_memory.py [--repo DIR] [--budgets 16384,8192] [--threads 0]
        [--runs 3] [--limit N] [--out embed_memory]

Each run is a fresh process (the default embedder, ONNX int8 on the CPU; its exported
graph is made once beforehand and shared) that chunks `--repo` (default: this project)
and embeds its first `--limit` chunks with `CODEVEIL_BATCH_TOKENS` set to one budget,
reading its own peak RSS (VmHWM) at the end. Budgets take turns, so the machine's load
falls on each alike; medians are reported. 16384 is what batching did before the budget
(64 texts of up to 256 word pieces); the budget caps texts x longest word pieces.
`--threads` (a list) also sets the ONNX session's intra-op threads (0: the default, one
per core); every budget runs with every thread count.
Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, table, write_json

_CHILD = r"""
import json, sys, time
from pathlib import Path
from indexer.chunker import chunk_file
from indexer.embedder_registry import default_embedder
from indexer.languages import language_for_path
from indexer.walk import SourceFile, read_source, walk_repo

repo, limit, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
texts = []
for entry in walk_repo(repo).files:
    src = read_source(repo, entry.path)
    if isinstance(src, SourceFile):
        texts += [c.embed_text for c in chunk_file(entry.path, src.text,
                                                   language=language_for_path(entry.path))]
texts = texts[:limit]
model = default_embedder()
if threads:
    model._threads = threads  # read when the session is made, on the first batch
start = time.perf_counter()
model.embed(texts)
seconds = time.perf_counter() - start
status = Path("/proc/self/status").read_text()
peak = int(status.split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps({"texts": len(texts), "seconds": seconds, "peak_rss_mb": peak}))
"""


def run_once(repo: Path, limit: int, budget: int, cache: Path, threads: int = 0) -> dict:
    env = dict(os.environ, CODEVEIL_BATCH_TOKENS=str(budget), CODEVEIL_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(repo), str(limit), str(threads)],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--budgets", default="16384,8192")
    ap.add_argument("--threads", default="0", help="ONNX threads to try (0: default)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--out", default="embed_memory")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    # A configuration: a budget, and a thread count where one is set ("4096@1t").
    configs = {(f"{b}@{t}t" if t else str(b)): (b, t) for t in threads for b in budgets}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        run_once(args.repo, 1, budgets[0], cache)  # exports the graph once, for all runs
        runs: dict[str, list[dict]] = {c: [] for c in configs}
        for _ in range(args.runs):
            for c, (b, t) in configs.items():
                runs[c].append(run_once(args.repo, args.limit, b, cache, t))
                print(c, runs[c][-1], flush=True)
    medians = {c: {"seconds": statistics.median(r["seconds"] for r in rs),
                   "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
                   "texts": rs[0]["texts"]} for c, rs in runs.items()}
    print(table(["budget (word pieces)[@threads]", "texts", "seconds (median)",
                 "peak RSS MB (median)"],
                [[c, m["texts"], round(m["seconds"], 1), round(m["peak_rss_mb"])]
                 for c, m in medians.items()]))
    write_json(args.out, {"repo": str(args.repo), "limit": args.limit, "runs": runs,
                          "medians": medians})

if __name__ == "__main__":
    main()
