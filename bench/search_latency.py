"""In-process search latency: `Index.search` as an MCP server or an agent's Python calls
it, warm, on real trees with the real model.

    python bench/search_latency.py [--trees requests,flask] [--queries 64]
        [--wheel PATH] [--out NAME]

Each tree is a git mirror under /work/.mirror (`psf+requests`, `pallets+flask`, ...; read
with `git archive HEAD`, the commit recorded), copied into one folder, indexed once with
the default embedder (cached across runs in bench/.cache/search_latency, so a rerun
embeds nothing), then searched `--queries` times after a warm-up: short questions and
the names of symbols sampled from the index itself (the two kinds agents send), k=10,
sealed (the default mode: search runs here), plus the same with a `--path` filter that
keeps one directory. Reports p50/p95 of the whole call and of the query embedding alone,
and the machine's load beside them (the figures move with it). Writes
bench/results/search_latency.json (`--out NAME`: NAME.json).

`--wheel PATH` searches a package as its wheel ships it instead of mirrors (its files
but the .dist-info folder, the wheel's sha256 recorded): django's git snapshot is more
than this machine can fetch, its wheel is in the local package index.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import bench_cache, table, unpack_mirror, write_json  # noqa: E402

QUESTIONS = [
    "where is the retry policy applied to outgoing requests",
    "how are routes registered and dispatched",
    "how are cookies stored between requests",
    "where is the session object created",
    "how does the app handle errors in a view",
    "where are redirects followed",
    "how is the request context pushed",
    "how are templates rendered",
    "where is the configuration loaded from a file",
    "how are authentication headers added",
    "where are timeouts enforced",
    "how is json encoded in a response",
]


def _pct(values: list[float], q: int) -> float:
    return round(sorted(values)[min(len(values) - 1, len(values) * q // 100)], 2)


def _unpack_wheel(wheel: Path, into: Path) -> str:
    """The wheel's files but its .dist-info under `into`; its sha256."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.split("/", 1)[0].endswith(".dist-info") or name.endswith("/"):
                continue
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
    return "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="psf/requests,pallets/flask")
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wheel", type=Path, help="a wheel to search instead of --trees")
    parser.add_argument("--out", default="search_latency", help="the result file's name")
    args = parser.parse_args()
    bench_cache("search_latency")
    work = Path(tempfile.mkdtemp(prefix="codeveil-latency-"))
    try:
        repo = work / "repo"
        if args.wheel is not None:
            commits = {args.wheel.name: _unpack_wheel(args.wheel, repo)}
        else:
            commits = {name: unpack_mirror(name, repo / name.split("/")[1])
                       for name in args.trees.split(",")}
        from retrieval import Index

        with Index(repo) as idx:
            t0 = time.perf_counter()
            report = idx.index(wait=True)
            index_s = time.perf_counter() - t0
            import sqlite3

            db = sqlite3.connect(repo / ".codeveil" / "state.sqlite")
            symbols = sorted({s.split(" > ")[-1] for (s,) in db.execute(
                "SELECT symbol FROM chunks WHERE symbol != ''")})
            db.close()
            rng = random.Random(args.seed)
            names = rng.sample(symbols, min(len(symbols), args.queries // 2))
            queries = [*names, *(QUESTIONS * args.queries)[: args.queries - len(names)]]
            rng.shuffle(queries)
            folder = sorted(p.name for p in repo.iterdir() if p.is_dir()
                            and not p.name.startswith("."))[0]
            for q in queries[:8]:  # warm: model loaded, indexes read
                idx.search(q, k=10)
            rows = {}
            for label, path in (("all", None), (f"--path '{folder}/*'", f"{folder}/*")):
                times = []
                for i, q in enumerate(queries):
                    q = f"{q} {' ' * (i % 3)}"  # a fresh query each time: no vector cache
                    t = time.perf_counter()
                    idx.search(q, k=10, path=path)
                    times.append((time.perf_counter() - t) * 1000)
                rows[label] = {"p50_ms": _pct(times, 50), "p95_ms": _pct(times, 95),
                               "mean_ms": round(statistics.fmean(times), 2)}
            embed = idx.embedder.embedder
            times = []
            for i, q in enumerate(queries):
                t = time.perf_counter()
                embed.embed([f"{q} {i}"])
                times.append((time.perf_counter() - t) * 1000)
            rows["query embedding alone"] = {"p50_ms": _pct(times, 50),
                                             "p95_ms": _pct(times, 95),
                                             "mean_ms": round(statistics.fmean(times), 2)}
            model = embed.model_id
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{report.chunks_total} chunks of {', '.join(commits)}; model {model};"
          f" first index {index_s:.1f} s; load {os.getloadavg()[0]:.1f} on"
          f" {os.cpu_count()} cores")
    print(table(["search (k=10, warm, in-process)", "p50 ms", "p95 ms", "mean ms"],
                [[k, v["p50_ms"], v["p95_ms"], v["mean_ms"]] for k, v in rows.items()]))
    path = write_json(args.out, {"trees": commits, "chunks": report.chunks_total,
                                 "model": model, "queries": len(queries),
                                 "index_s": round(index_s, 1), "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
