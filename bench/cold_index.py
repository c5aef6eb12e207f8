"""Cold index cost, this code tree beside another: what a first `codeveil index` pays.

    python bench/cold_index.py --baseline DIR [--repo PATH] [--runs 3]

Each run is a fresh `codeveil index --json .` process on a fresh copy of `--repo`
(default: the installed `requests` package) with an empty embedding cache, so every
chunk goes through the model; the exported ONNX graph is made once beforehand and
shared (a machine that has run codeveil before), so the export does not drown the
difference. The two trees (`--baseline`, say a `git archive` of the commit before a
change, and this one) alternate run by run, so that load on a shared machine falls on
both alike. Medians of `--runs` runs: the whole process, and the index's own embed
stage. Prints a table and writes bench/results/cold_index.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import copy_tree, isolate, table, write_json

HERE = Path(__file__).resolve().parent.parent


def default_repo() -> Path:
    spec = importlib.util.find_spec("requests")
    assert spec and spec.origin
    return Path(spec.origin).parent


def index_once(code: Path, src: Path, work: Path, models: Path) -> dict:
    """One cold index with `code`: wall seconds and the index's own report."""
    shutil.rmtree(work, ignore_errors=True)
    repo = copy_tree(src, work / "repo")
    cache = work / "cache"
    cache.mkdir(parents=True)
    (cache / "models").symlink_to(models, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_CONFIG_DIR": str(work / "config"),
           "CODEVEIL_CACHE_DIR": str(cache)}
    env.pop("CODEVEIL_EMBEDDER", None)  # the default model, as a user's install picks it
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "retrieval.cli", "index", "--wait", "--json", "."],
                          cwd=repo, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"index with {code} failed:\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {"seconds": wall, "seconds_embed": report["seconds_embed"],
            "chunks_embedded": report["chunks_embedded"],
            "headers_embedded": report.get("headers_embedded", 0)}


def export_graph(code: Path, into: Path) -> Path:
    """The default model's graph, exported once into `into`/models."""
    env = {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_CACHE_DIR": str(into)}
    subprocess.run([sys.executable, "-c", "from indexer.embedder_registry import "
                    "default_embedder; default_embedder().embed(['warm up'])"],
                   env=env, check=True)
    return into / "models"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="another code tree (a checkout of the commit to compare with)")
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "codeveil": HERE}
    src = (args.repo or default_repo()).resolve()
    base = isolate()
    models = export_graph(HERE, base / "graph")
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, code in trees.items():
            runs[name].append(index_once(code, src, base / name, models))
            print(f"run {i + 1}/{args.runs} {name}: {runs[name][-1]}", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in runs.items()}
    rows = [[name, m["seconds"], m["seconds_embed"], int(m["chunks_embedded"]),
             int(m["headers_embedded"]),
             m["seconds"] / med["baseline"]["seconds"]] for name, m in med.items()]
    print(f"repo: {src}; medians of {args.runs} runs, alternating")
    print(table(["code", "cold index s", "embed stage s", "chunks embedded",
                 "headers embedded", "x baseline"], rows))
    path = write_json("cold_index", {"repo": str(src), "baseline": str(trees["baseline"]),
                                     "runs": runs, "medians": med})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
