"""Cold index cost: what a first `codeveil index` pays, beside another tree or a peer.

    python bench/cold_index.py [--tree NAME=SPEC ...] [--runs 3] [--wait]
        [--threads 1,2] [--baseline DIR] [--peer PYTHON --peer-model DIR] [--out NAME]

`--tree` (repeatable) names a source tree: SPEC is a folder, `mirror:owner/name,...`
(git mirrors under /work/.mirror at HEAD, each in a folder of its own: one tree holding
them all) or `wheel:PATH` (a wheel's files but its .dist-info and `locale/` folders, the
translation catalogs). Default: the installed `requests` package. Each run is a fresh
`codeveil index` process on a fresh copy of the tree with an empty embedding cache, so
every chunk goes through the model; the exported ONNX graph is made once beforehand and
shared (a machine that has run codeveil before), so the export does not drown the
difference. Rows per tree, interleaved run by run so that load on a shared machine falls
on all alike:

    codeveil returns           `codeveil index --json .`: until the command returns,
                               words, names and structure indexed (peak RSS, CPU: the
                               command's)
    codeveil vectors complete  the same run, until its background builder has every
                               vector and has exited (peak RSS: the larger of the
                               command's and the builder's; CPU: both together)
    ..., N threads             with `--threads`: the two rows above once per thread
                               count (CODEVEIL_EMBED_THREADS in the command's and so
                               its builder's environment), the counts taking turns
                               within each run
    codeveil --wait            with `--wait`: `codeveil index --wait --json .`, blocking
    baseline                   with `--baseline` (say a `git archive` of the commit
                               before a change): its blocking `codeveil index`
    peer                       with `--peer`: `semble`'s whole cold index in a fresh
                               process (`SembleIndex.from_path`, every content type) run
                               by PYTHON with the static model in `--peer-model`
                               (docs/benchmarks.md says how it is distilled from the
                               bundled MiniLM)

Beside each codeveil run: the first answer, a fresh `codeveil search --json` started the
moment `codeveil index` returns (seconds until it answers, its builder still running);
and once the vectors are complete, in-process search latency, `Index.search` as an MCP
server calls it (k=10, warm, each query new: symbol names sampled from the index and
short questions, as bench/search_latency.py asks them), with the peer's `search` timed
on the same queries. Peak RSS is VmHWM; CPU seconds are user plus system. Each run of
the vectors also records the machine's load averages when its vectors were complete.

Medians of `--runs` runs. Prints a table per tree and writes bench/results/<out>.json
(default: cold_index.json with a baseline, cold_index_tiers.json without).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import copy_tree, isolate, proc_status_kb, table, unpack_mirror, write_json
from bench.search_latency import QUESTIONS, _pct, _unpack_wheel

HERE = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
FIRST_QUERY = QUESTIONS[1]  # what the first answer is asked
QUERIES = 64

# In-process search, timed in a process of its own: the tree's Index opened as an MCP
# server opens it, warmed, then each query once (spaces appended: no cached vector).
_CODEVEIL_SEARCH = r"""
import json, sys, time
from pathlib import Path
from retrieval import Index
repo, queries = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
with Index(repo) as idx:
    for q in queries[:8]:
        idx.search(q, k=10)
    times = []
    for i, q in enumerate(queries):
        t = time.perf_counter()
        idx.search(f"{q} {' ' * (i % 3)}", k=10)
        times.append((time.perf_counter() - t) * 1000)
print(json.dumps(times))
"""

# The peer's whole cold index in a fresh process, then its search on the same queries.
_PEER = r"""
import json, resource, sys, time
from pathlib import Path
start, root, model, qfile = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
from semble import ContentType, SembleIndex
idx = SembleIndex.from_path(root, model_path=model, content=list(ContentType))
seconds = time.time() - start
use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
cpu = sum(u.ru_utime + u.ru_stime for u in use)
peak = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0])
queries = json.loads(Path(qfile).read_text())
for q in queries[:8]:
    idx.search(q, top_k=10)
times = []
for i, q in enumerate(queries):
    t = time.perf_counter()
    idx.search(f"{q} {' ' * (i % 3)}", top_k=10)
    times.append((time.perf_counter() - t) * 1000)
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_rss_mb": peak / 1024,
                  "files": idx.stats.indexed_files, "chunks": idx.stats.total_chunks,
                  "search_ms": times}))
"""


def default_repo() -> Path:
    spec = importlib.util.find_spec("requests")
    assert spec and spec.origin
    return Path(spec.origin).parent


def materialize(spec: str, into: Path) -> tuple[Path, dict[str, str]]:
    """The tree `spec` names, as a folder (made under `into` unless it is one already),
    and where it came from (commits, a wheel's sha256) for the result file."""
    if spec.startswith("mirror:"):
        names = spec.removeprefix("mirror:").split(",")
        return into, {name: unpack_mirror(name, into / name.split("/")[1]) for name in names}
    if spec.startswith("wheel:"):
        wheel = Path(spec.removeprefix("wheel:"))
        into.mkdir(parents=True)
        sha = _unpack_wheel(wheel, into)
        for locale in sorted(into.rglob("locale"), reverse=True):
            if locale.is_dir():
                shutil.rmtree(locale)
        return into, {wheel.name: sha}
    return Path(spec).resolve(), {"folder": str(Path(spec).resolve())}


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


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _proc_cpu(pid: int) -> float | None:
    """User plus system seconds of a process that is not our child; None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _cli_source(code: Path) -> Path:
    """The command's module in a code tree, before or after retrieval's packages."""
    moved = code / "retrieval" / "faces" / "cli.py"
    return moved if moved.exists() else code / "retrieval" / "cli.py"


def _cli_module(env: dict[str, str]) -> str:
    """What `python -m` runs as the command for the tree on env's PYTHONPATH."""
    code = Path(env["PYTHONPATH"])
    return "retrieval" if (code / "retrieval" / "__main__.py").exists() else "retrieval.cli"


def _run(args: list[str], repo: Path, env: dict[str, str]) -> tuple[float, int, float, dict]:
    """A `codeveil` command: wall seconds, its peak RSS in kB, its CPU seconds, its JSON."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", _cli_module(env), *args], cwd=repo,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, proc_status_kb(proc.pid, "VmHWM") or 0)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed:\n{err[-2000:]}")
    return wall, peak, _children_cpu() - cpu0, json.loads(out)


def index_once(code: Path, src: Path, work: Path, models: Path) -> dict:
    """One cold blocking index with `code`: wall seconds, peak RSS, CPU and the report.
    (A tree from before the background builder blocks without `--wait`.)"""
    repo, env = _fresh(code, src, work, models)
    waits = "--wait" in _cli_source(code).read_text()
    wall, peak, cpu, report = _run(["index", *(["--wait"] if waits else []), "--json", "."],
                                   repo, env)
    return {"seconds": wall, "peak_rss_mb": peak / 1024, "cpu_s": cpu,
            "seconds_embed": report["seconds_embed"],
            "chunks_embedded": report["chunks_embedded"],
            "headers_embedded": report.get("headers_embedded", 0)}


def tiers_once(code: Path, src: Path, work: Path, models: Path,
               queries: Path | None, threads: int | None = None) -> tuple[dict, dict]:
    """One cold `codeveil index` that returns with the words: until it returns (and its
    first answer), and until its builder has every vector (and search latency then).
    Writes the search queries to `queries` when it is given. `threads`: the model's
    threads (CODEVEIL_EMBED_THREADS) for the command and its builder; None, their own."""
    repo, env = _fresh(code, src, work, models)
    if threads is not None:
        env["CODEVEIL_EMBED_THREADS"] = str(threads)
    t0 = time.perf_counter()
    wall, peak, cpu, report = _run(["index", "--json", "."], repo, env)
    pid = int(report["vectors"]["builder"]["pid"])
    first = _first_answer(repo, env)
    state = repo / ".codeveil" / "builder.json"
    builder_peak, builder_cpu = 0, 0.0
    while True:  # the builder is not our child: watch its pid and its state file
        builder_peak = max(builder_peak, proc_status_kb(pid, "VmHWM") or 0)
        builder_cpu = _proc_cpu(pid) or builder_cpu
        done = json.loads(state.read_text())
        if done["state"] not in ("starting", "running") and \
                proc_status_kb(pid, "VmHWM") is None:
            break
        time.sleep(0.1)
    complete = time.perf_counter() - t0
    if done["state"] != "done":
        raise SystemExit(f"the builder ended {done['state']}: {done.get('error')}")
    if queries is not None:
        queries.write_text(json.dumps(_queries(repo)))
    returns = {"seconds": wall, "peak_rss_mb": peak / 1024, "cpu_s": cpu,
               "chunks_embedded": 0, "chunks_total": report["chunks_total"],
               "files": report["files_scanned"], **first}
    vectors = {"seconds": complete, "peak_rss_mb": max(peak, builder_peak) / 1024,
               "builder_peak_rss_mb": builder_peak / 1024, "cpu_s": cpu + builder_cpu,
               "chunks_embedded": done["chunks_done"], "chunks_total": report["chunks_total"],
               "load": dict(zip(("1min", "5min", "15min"), os.getloadavg(), strict=True))}
    if queries is not None:
        vectors["search_ms"] = _codeveil_search(repo, env, queries)
    return returns, vectors


def _first_answer(repo: Path, env: dict[str, str]) -> dict:
    """A fresh `codeveil search` the moment the index returned: seconds to its answer."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", _cli_module(env), "search", "--json",
                          FIRST_QUERY], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"the first search failed:\n{out.stderr[-2000:]}")
    return {"first_answer_s": seconds, "first_answer_hits": len(json.loads(out.stdout)
                                                                 .get("hits", []))}


def _queries(repo: Path, seed: int = 0) -> list[str]:
    """Half symbol names sampled from the index, half short questions, shuffled."""
    db = sqlite3.connect(repo / ".codeveil" / "state.sqlite")
    symbols = sorted({s.split(" > ")[-1] for (s,) in db.execute(
        "SELECT symbol FROM chunks WHERE symbol != ''")})
    db.close()
    rng = random.Random(seed)
    names = rng.sample(symbols, min(len(symbols), QUERIES // 2))
    queries = [*names, *(QUESTIONS * QUERIES)[: QUERIES - len(names)]]
    rng.shuffle(queries)
    return queries


def _codeveil_search(repo: Path, env: dict[str, str], queries: Path) -> list[float]:
    out = subprocess.run([sys.executable, "-c", _CODEVEIL_SEARCH, str(repo), str(queries)],
                         cwd=HERE, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"in-process search failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_once(python: str, model: Path, src: Path, work: Path, queries: Path) -> dict:
    """The peer's whole cold index of a fresh copy of `src`, then its search latency."""
    shutil.rmtree(work, ignore_errors=True)
    repo = copy_tree(src, work / "repo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SEMBLE_CACHE_LOCATION": str(work / "cache")}
    env.pop("PYTHONPATH", None)
    cpu0 = _children_cpu()
    out = subprocess.run([python, "-c", _PEER, repr(time.time()), str(repo), str(model),
                          str(queries)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the peer failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["cpu_s_process"] = _children_cpu() - cpu0  # with its search, for a check
    return result


def export_graph(code: Path, into: Path) -> Path:
    """The default model's graph, exported once into `into`/models."""
    env = {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_CACHE_DIR": str(into)}
    subprocess.run([sys.executable, "-c", "from indexer.embedder_registry import "
                    "default_embedder; default_embedder().embed(['warm up'])"],
                   env=env, check=True)
    return into / "models"


def _row(name: str, rs: list[dict], ref: float) -> list[object]:
    med = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_rss_mb", "cpu_s")}
    times = [t for r in rs for t in r.get("search_ms", [])]
    first = [r["first_answer_s"] for r in rs if "first_answer_s" in r]
    return [name, med["seconds"], med["seconds"] / ref if ref else "", med["peak_rss_mb"],
            med["cpu_s"], _pct(times, 50) if times else "",
            statistics.median(first) if first else ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SPEC",
                        help="a tree to index: a folder, mirror:owner/name,... or wheel:PATH")
    parser.add_argument("--repo", type=Path, default=None, help="one folder (as --tree)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wait", action="store_true", help="also a blocking --wait index")
    parser.add_argument("--threads", default=None, metavar="N,N",
                        help="the model's thread counts to compare (CODEVEIL_EMBED_THREADS),"
                             " e.g. 1,2; default: codeveil's own choice")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another code tree (a checkout of the commit to compare with)")
    parser.add_argument("--peer", default=None, metavar="PYTHON",
                        help="a Python with `semble` installed: its cold index beside ours")
    parser.add_argument("--peer-model", type=Path, default=None,
                        help="the peer's static model (a model2vec folder)")
    parser.add_argument("--out", default=None, help="the result file's name")
    args = parser.parse_args()
    if args.peer and args.peer_model is None:
        parser.error("--peer needs --peer-model")
    specs = [t.split("=", 1) for t in args.tree] or \
        [["requests", str((args.repo or default_repo()).resolve())]]
    base = isolate()
    trees = {name: materialize(spec, base / "src" / name) for name, spec in specs}
    models = export_graph(HERE, base / "graph")
    counts = [int(n) for n in args.threads.split(",")] if args.threads else [None]
    tiers = {n: ("codeveil returns", "codeveil vectors complete") if n is None else
             (f"codeveil returns, {n} threads", f"codeveil vectors complete, {n} threads")
             for n in counts}
    names = [name for pair in tiers.values() for name in pair]
    names += ["codeveil --wait"] * args.wait + ["baseline"] * (args.baseline is not None)
    names += ["peer"] * bool(args.peer)
    runs: dict[str, dict[str, list[dict]]] = {tree: {name: [] for name in names}
                                              for tree in trees}
    for i in range(args.runs):
        for tree, (src, _) in trees.items():  # trees take turns too
            rs = runs[tree]
            queries = base / f"queries-{tree}.json"
            for n, (returns_row, vectors_row) in tiers.items():
                returns, vectors = tiers_once(HERE, src, base / "tiers", models, queries, n)
                rs[returns_row].append(returns)
                rs[vectors_row].append(vectors)
            if args.wait:
                rs["codeveil --wait"].append(index_once(HERE, src, base / "wait", models))
            if args.baseline is not None:
                rs["baseline"].append(index_once(args.baseline.resolve(), src,
                                                 base / "baseline", models))
            if args.peer:
                rs["peer"].append(peer_once(args.peer, args.peer_model.resolve(), src,
                                            base / "peer", queries))
            for name in names:
                shown = {k: v for k, v in rs[name][-1].items() if k != "search_ms"}
                print(f"run {i + 1}/{args.runs} {tree} {name}: {shown}", flush=True)
        # After every run, so that a long one cut short still leaves its numbers.
        report(args, specs, trees, runs, i + 1)


def report(args: argparse.Namespace, specs: list[list[str]],
           trees: dict[str, tuple[Path, dict[str, str]]],
           runs: dict[str, dict[str, list[dict]]], done: int) -> None:
    """Print each tree's table of medians so far and write the result file."""
    headers = ["tree / row", "seconds", "x peer", "peak RSS MB", "CPU s",
               "search p50 ms", "first answer s"]
    medians: dict[str, dict[str, dict[str, object]]] = {}
    for tree, rs in runs.items():
        ref = statistics.median(r["seconds"] for r in rs["peer"]) if args.peer else 0.0
        rows = [_row(name, r, ref) for name, r in rs.items()]
        medians[tree] = {str(row[0]): dict(zip(headers[1:], row[1:], strict=True))
                         for row in rows}
        first = next(iter(rs.values()))[0]  # the first "codeveil returns" row
        print(f"\n{tree} ({first['files']} files, {first['chunks_total']} chunks; "
              f"{', '.join(trees[tree][1])}): medians of {done} runs, interleaved")
        print(table(headers, rows))
    out = args.out or ("cold_index" if args.baseline is not None else "cold_index_tiers")
    path = write_json(out, {"trees": {t: {"spec": s, "sources": trees[t][1]} for t, s in specs},
                            "peer_model": str(args.peer_model), "baseline": str(args.baseline),
                            "runs_done": done, "runs": runs, "medians": medians})
    print(f"wrote {path}", flush=True)

if __name__ == "__main__":
    main()
