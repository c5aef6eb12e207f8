"""Cold index cost, this code tree beside another: what a first `codeveil index` pays.

    python bench/cold_index.py [--baseline DIR] [--repo PATH] [--runs 3]

Each run is a fresh `codeveil index` process on a fresh copy of `--repo` (default: the
installed `requests` package) with an empty embedding cache, so every chunk goes
through the model; the exported ONNX graph is made once beforehand and shared (a
machine that has run codeveil before), so the export does not drown the difference.
Rows, interleaved run by run so that load on a shared machine falls on all alike:

    codeveil returns           `codeveil index --json .`: until the command returns,
                               words, names and structure indexed (peak RSS: the command)
    codeveil vectors complete  the same run, until its background builder has every
                               vector and has exited (peak RSS: the builder's)
    codeveil --wait            `codeveil index --wait --json .`, blocking
    baseline                   with `--baseline` (say a `git archive` of the commit
                               before a change): its blocking `codeveil index`

Medians of `--runs` runs. Prints a table and writes bench/results/cold_index.json
(bench/results/cold_index_tiers.json without a baseline).
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

from bench._common import copy_tree, isolate, proc_status_kb, table, write_json

HERE = Path(__file__).resolve().parent.parent


def default_repo() -> Path:
    spec = importlib.util.find_spec("requests")
    assert spec and spec.origin
    return Path(spec.origin).parent


def _fresh(code: Path, src: Path, work: Path, models: Path) -> tuple[Path, dict[str, str]]:
    shutil.rmtree(work, ignore_errors=True)
    repo = copy_tree(src, work / "repo")
    cache = work / "cache"
    cache.mkdir(parents=True)
    (cache / "models").symlink_to(models, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_CONFIG_DIR": str(work / "config"),
           "CODEVEIL_CACHE_DIR": str(cache)}
    env.pop("CODEVEIL_EMBEDDER", None)  # the default model, as a user's install picks it
    return repo, env


def _run(args: list[str], repo: Path, env: dict[str, str]) -> tuple[float, int, dict]:
    """A `codeveil` command: wall seconds, its peak RSS in kB, its JSON."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "retrieval", *args], cwd=repo,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, proc_status_kb(proc.pid, "VmHWM") or 0)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed:\n{err[-2000:]}")
    return wall, peak, json.loads(out)


def index_once(code: Path, src: Path, work: Path, models: Path) -> dict:
    """One cold blocking index with `code`: wall seconds, peak RSS and the report.
    (A tree from before the background builder blocks without `--wait`.)"""
    repo, env = _fresh(code, src, work, models)
    waits = "--wait" in (code / "retrieval" / "cli.py").read_text()
    wall, peak, report = _run(["index", *(["--wait"] if waits else []), "--json", "."],
                              repo, env)
    return {"seconds": wall, "peak_rss_mb": peak / 1024,
            "seconds_embed": report["seconds_embed"],
            "chunks_embedded": report["chunks_embedded"],
            "headers_embedded": report.get("headers_embedded", 0)}


def tiers_once(code: Path, src: Path, work: Path, models: Path) -> tuple[dict, dict]:
    """One cold `codeveil index` that returns with the words: until it returns, and
    until its builder has every vector."""
    repo, env = _fresh(code, src, work, models)
    t0 = time.perf_counter()
    wall, peak, report = _run(["index", "--json", "."], repo, env)
    pid = int(report["vectors"]["builder"]["pid"])
    state = repo / ".codeveil" / "builder.json"
    builder_peak = 0
    while True:  # the builder is not our child: watch its pid and its state file
        builder_peak = max(builder_peak, proc_status_kb(pid, "VmHWM") or 0)
        done = json.loads(state.read_text())
        if done["state"] not in ("starting", "running") and \
                proc_status_kb(pid, "VmHWM") is None:
            break
        time.sleep(0.1)
    complete = time.perf_counter() - t0
    if done["state"] != "done":
        raise SystemExit(f"the builder ended {done['state']}: {done.get('error')}")
    returns = {"seconds": wall, "peak_rss_mb": peak / 1024, "chunks_embedded": 0,
               "chunks_total": report["chunks_total"]}
    vectors = {"seconds": complete, "peak_rss_mb": max(peak, builder_peak) / 1024,
               "chunks_embedded": done["chunks_done"], "chunks_total": report["chunks_total"]}
    return returns, vectors


def export_graph(code: Path, into: Path) -> Path:
    """The default model's graph, exported once into `into`/models."""
    env = {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_CACHE_DIR": str(into)}
    subprocess.run([sys.executable, "-c", "from indexer.embedder_registry import "
                    "default_embedder; default_embedder().embed(['warm up'])"],
                   env=env, check=True)
    return into / "models"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another code tree (a checkout of the commit to compare with)")
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    src = (args.repo or default_repo()).resolve()
    base = isolate()
    models = export_graph(HERE, base / "graph")
    names = ["codeveil returns", "codeveil vectors complete", "codeveil --wait"]
    if args.baseline is not None:
        names.append("baseline")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(args.runs):
        returns, vectors = tiers_once(HERE, src, base / "tiers", models)
        runs["codeveil returns"].append(returns)
        runs["codeveil vectors complete"].append(vectors)
        runs["codeveil --wait"].append(index_once(HERE, src, base / "wait", models))
        if args.baseline is not None:
            runs["baseline"].append(index_once(args.baseline.resolve(), src,
                                               base / "baseline", models))
        for name in names:
            print(f"run {i + 1}/{args.runs} {name}: {runs[name][-1]}", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_rss_mb")}
           for name, rs in runs.items()}
    blocking = med["codeveil --wait"]["seconds"]
    rows = [[name, m["seconds"], m["peak_rss_mb"], m["seconds"] / blocking]
            for name, m in med.items()]
    print(f"repo: {src}; medians of {args.runs} runs, interleaved")
    print(table(["codeveil", "seconds", "peak RSS MB", "x --wait"], rows))
    path = write_json("cold_index" if args.baseline is not None else "cold_index_tiers",
                      {"repo": str(src), "baseline": str(args.baseline),
                       "runs": runs, "medians": med})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
