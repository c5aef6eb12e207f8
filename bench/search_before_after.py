"""In-process search latency of two commits on one index, taking turns.

    python bench/search_before_after.py --before REV [--after REV] --repo PATH
        [--rounds 4] [--name NAME]

`--repo` must be indexed already (`codeveil index --wait`, with CODEVEIL_CONFIG_DIR and
CODEVEIL_CACHE_DIR as this process has them). Each commit is unpacked (`git archive`);
each round runs one fresh process per commit, alternating, that opens the index with that
commit's code, warms it on the queries, then times `Index.search(query, k=10)` over them
five times (a space appended each time, so the query cache never answers). Short
questions and names, as agents send. Writes bench/results/<NAME>.json (default
search_before_after) with every timing, and prints p50/p90 per commit.
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

from bench._common import table, write_json
from bench.before_after import unpack

QUERIES = ["send a prepared request", "session cookies", "retry on connection error",
           "blueprint register url rule", "json response", "Response.iter_content",
           "redirect handling", "template rendering context", "app config from object",
           "proxy environment variables", "basic auth header", "stream chunked upload"]

TIMER = """
import json, sys, time
from retrieval import Index
queries = json.loads(sys.argv[2])
idx = Index(sys.argv[1])
for q in queries:
    idx.search(q, k=10)
out = []
for r in range(1, 6):
    for q in queries:
        t = time.perf_counter()
        idx.search(q + " " * r, k=10)
        out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--name", default="search_before_after")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="codeveil-search-ab-") as tmp:
        trees = {side: Path(tmp) / side for side in times}
        commits = {side: unpack(getattr(args, side), trees[side]) for side in times}
        for _ in range(args.rounds):
            for side, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run([sys.executable, "-c", TIMER, str(args.repo.resolve()),
                                      json.dumps(QUERIES)], env=env, cwd=tmp, check=True,
                                     capture_output=True, text=True).stdout
                times[side].extend(json.loads(out.strip().splitlines()[-1]))
    rows = {side: {"commit": commits[side], "p50_ms": round(statistics.median(ts), 3),
                   "p90_ms": round(sorted(ts)[int(0.9 * len(ts))], 3), "searches": len(ts)}
            for side, ts in times.items()}
    print(table(["side", "commit", "p50 ms", "p90 ms", "searches"],
                [[s, r["commit"][:10], r["p50_ms"], r["p90_ms"], r["searches"]]
                 for s, r in rows.items()]))
    write_json(args.name, {"repo": str(args.repo), "queries": QUERIES, "rows": rows,
                           "times_ms": times})


if __name__ == "__main__":
    main()
