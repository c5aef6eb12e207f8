"""The same benchmarks on two commits, in one run, taking turns: did a change move them?

    python bench/before_after.py --before REV [--after REV] [--name NAME]
        [--only index_speed,query_latency,local_vectors] [--bench-of after] [--rounds N]

Both commits are unpacked (`git archive`) into temp folders and each benchmark runs in
each, before and after alternating, so that a shared machine's load falls on both alike:
`bench/index_speed.py` on its small tree (the installed `httpx`; a 2,000-file synthetic
tree, one encode round) and `bench/query_latency.py` at 100k chunks (100 queries, no
crossover), and `bench/local_vectors.py` (the client's vector index) at 100k. Each run
writes its result inside its own folder; the pairs are kept as
bench/results/<NAME>.json (default before_after), with both commits; a run that fails
is recorded as failed (with its last line of output), the others still kept.
`--bench-of after` runs the after commit's bench/ on both, for a benchmark that the
before commit's own copy cannot run (a bench fixed since).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, table, write_json

RUNS = {
    "index_speed": ["bench/index_speed.py", "--files", "2000", "--rounds", "1"],
    "query_latency": ["bench/query_latency.py", "--sizes", "100000", "--queries", "100",
                      "--crossover", ""],
    "local_vectors": ["bench/local_vectors.py", "--sizes", "100000", "--queries", "100"],
}


def unpack(rev: str, dest: Path) -> str:
    """The tree of `rev` unpacked into `dest`; returns the full commit id."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {rev} failed")
    return commit


def run(tree: Path, name: str) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *RUNS[name]], cwd=tree, check=False,
                          env={**os.environ, "PYTHONPATH": str(tree)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"failed": f"exit status {proc.returncode}: {last}",
                "wall_s": time.perf_counter() - started}
    result = json.loads((tree / "bench" / "results" / f"{name}.json").read_text())
    result.pop("provenance", None)  # the pair's own records commits, command and load
    result["wall_s"] = time.perf_counter() - started
    return result


def figures(name: str, r: dict[str, Any]) -> dict[str, float]:
    """The headline figures of one result."""
    if "failed" in r:
        return {"failed": r["failed"]}
    if name == "local_vectors":
        row = r["results"][0]
        return {key: row[key] for key in ("cold_build_s", "open_s", "unchanged_p50_ms",
                                          "one_file_p50_ms", "nearest_n10_p50_ms",
                                          "nearest_mask1%_n10_p50_ms",
                                          "nearest_header_n10_p50_ms")}
    if name == "index_speed":
        return {"cold index s": r["cold"]["seconds"],
                "cold chunks/s": r["cold"]["chunks_per_s"],
                "warm re-index s": r["warm_nothing_changed_s"],
                "one file edited s": r["one_file_edited"]["seconds"],
                "synthetic warm s": r["synthetic"]["warm_s"]}
    row = r["results"][0]
    return {key: row[key] for key in ("local_p50_ms", "http_p50_ms", "sealed_p50_ms",
                                      "sealed_p99_ms", "recall@10", "ingest_s", "build_s")}


def _median_figures(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each headline figure's median over the rounds that did not fail."""
    per = [figures(name, r) for r in results]
    ok = [f for f in per if "failed" not in f]
    if not ok:
        return per[-1]
    return {key: statistics.median(f[key] for f in ok) for key in ok[0]}


def _ratio(before: Any, after: Any) -> float | str:
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before:
        return after / before
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--name", default="before_after")
    parser.add_argument("--only", default=",".join(RUNS),
                        help="which benchmarks, comma-separated")
    parser.add_argument("--bench-of", choices=("each", "after"), default="each",
                        help="whose bench/ runs: each commit its own, or the after's on both")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each pair this many times, the side that goes first"
                             " alternating; figures are the medians over the rounds")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown[0]!r}; use {', '.join(RUNS)}")
    work = Path(tempfile.mkdtemp(prefix="codeveil-before-after-"))
    try:
        trees = {"before": work / "before", "after": work / "after"}
        commits = {side: unpack(getattr(args, side), tree) for side, tree in trees.items()}
        if args.bench_of == "after":
            shutil.rmtree(trees["before"] / "bench")
            shutil.copytree(trees["after"] / "bench", trees["before"] / "bench")
        out: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {"before": [], "after": []} for name in names}
        for name in names:
            for i in range(args.rounds):
                # Whoever goes first meets a different machine than whoever goes second
                # (caches, a neighbour's load): take turns.
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    out[name][side].append(run(trees[side], name))
                    print(f"{name} {side} (round {i + 1}):"
                          f" {out[name][side][-1]['wall_s']:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name in names:
        before, after = (_median_figures(name, out[name][s]) for s in ("before", "after"))
        rows += [[name, key, before.get(key, "-"), after.get(key, "-"),
                  _ratio(before.get(key), after.get(key))]
                 for key in dict.fromkeys([*before, *after])]
    print(table(["benchmark", "figure", "before", "after", "after/before"], rows))
    path = write_json(args.name, {"commits": commits, "bench_of": args.bench_of,
                                  "rounds": args.rounds,
                                  "runs": {n: RUNS[n] for n in names}, "results": out,
                                  "figures": [dict(zip(("benchmark", "figure", "before",
                                                        "after", "ratio"), r, strict=True))
                                              for r in rows]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
