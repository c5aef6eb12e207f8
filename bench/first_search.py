"""Time from `codeveil index` start to the first answered search, on a first index.

    python bench/first_search.py [--repo PATH] [--watch 60]

A copy of `--repo` (default: the installed `sklearn` package, 671 Python files; django's
879 are not on this machine) with isolated config and cache dirs; the ONNX graph is
exported beforehand (a machine that has run codeveil once). `codeveil index -q` starts;
another process runs `codeveil search QUERY --json` as soon as the repo is initialised
and again and again: the time of the first search that returns hits (target < 10 s),
what it said about the index (chunks with vectors of how many), then coverage samples
for `--watch` seconds while the index runs on; then the index is stopped.
Writes bench/results/first_search.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import copy_tree, isolate, table, write_json

QUERY = "fit a linear model with an l1 penalty"
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--watch", type=float, default=60)
    parser.add_argument("--query", default=QUERY)
    args = parser.parse_args()
    spec = importlib.util.find_spec("sklearn")
    src = args.repo or Path(spec.origin).parent  # type: ignore[union-attr, arg-type]
    base = isolate()
    repo = copy_tree(src, base / "repo")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CODEVEIL_EMBEDDER="minilm")
    from indexer.onnx_embedder import load_graph

    load_graph("int8")  # exported once per machine, not per index
    cli = [sys.executable, "-m", "retrieval"]
    t0 = time.perf_counter()
    indexing = subprocess.Popen([*cli, "index", "--wait", "-q"], cwd=repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    first = None
    try:
        while time.perf_counter() - t0 < 600 and indexing.poll() is None:
            if not (repo / ".codeveil" / "config.json").exists():
                time.sleep(0.05)
                continue
            started = time.perf_counter() - t0
            proc = subprocess.run([*cli, "search", args.query, "--json", "-k", "5"], cwd=repo,
                                  env=env, capture_output=True, text=True, check=False)
            done = time.perf_counter() - t0
            if proc.returncode != 0:
                continue
            out = json.loads(proc.stdout)
            sample = {"asked_s": started, "answered_s": done, **out["index"],
                      "top": [h["path"] for h in out["hits"]]}
            samples.append(sample)
            if first is None and out["hits"]:
                first = sample
            if first is not None and done - first["answered_s"] > args.watch:
                break
    finally:
        indexing.kill()
        indexing.wait()
    rows = [[f"{s['asked_s']:.1f}", f"{s['answered_s']:.1f}", s["chunks_with_vectors"],
             s["chunks"], ", ".join(s["top"][:2])] for s in samples]
    print(f"repo: {src}; query: {args.query!r}")
    print(table(["asked at s", "answered at s", "chunks with vectors", "chunks",
                 "top 2"], rows))
    if first:
        print(f"first answered search: {first['answered_s']:.1f} s after `codeveil index`"
              f" started ({first['chunks_with_vectors']} of {first['chunks']} chunks had"
              " vectors)")
    path = write_json("first_search", {"repo": str(src), "query": args.query,
                                       "first": first, "samples": samples})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
