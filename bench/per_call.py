"""What every call pays: whole-process times of the commands a user waits for.

    python bench/per_call.py [--repo PATH] [--runs 5] [--baseline DIR]

Each measure is a fresh `python -m retrieval.faces.cli ...` process, timed from outside
(interpreter start, imports, model load, work, exit), on a copy of `--repo` (default:
the installed `requests` package) with isolated config and cache dirs:

1. cold index on a machine with no exported ONNX graph: wall time, the peak memory of
   the indexing process itself and that of its biggest child (the export);
2. re-index with nothing changed (target < 0.5 s);
3. re-index after one file was edited (target < 1 s);
4. CLI search (`codeveil search QUERY -k 5`).

With `--baseline DIR` (a checkout of another commit, say `git archive` of the one
before a change), every measure is taken with both code trees, alternating run by run,
so that load on a shared machine falls on both alike. Medians of `--runs` runs. The
import share of each command comes from `-X importtime` (sum of the top-level imports).
Prints a table and writes bench/results/per_call.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import copy_tree, isolate, table, write_json

HERE = Path(__file__).resolve().parent.parent
QUERY = "retry the request when the connection fails"

# Runs the CLI in this process, then reports its own and its children's peak RSS.
_RUNNER = """
import json, resource, runpy, sys
sys.argv = ["codeveil", *sys.argv[1:]]
try:
    runpy.run_module("retrieval.faces.cli", run_name="__main__")
except SystemExit:
    pass
peak = {"self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}
print("PEAK " + json.dumps(peak), file=sys.stderr)
"""


def default_repo() -> Path:
    spec = importlib.util.find_spec("requests")
    assert spec and spec.origin
    return Path(spec.origin).parent


def run(code: Path, repo: Path, env: dict[str, str], *args: str,
        importtime: bool = False) -> tuple[float, dict, float]:
    """(wall seconds, peak RSS, seconds in top-level imports) of one CLI process."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", _RUNNER,
           *args]
    env = {**env, "PYTHONPATH": str(code)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    peak: dict = {}
    imports = 0.0
    for line in proc.stderr.splitlines():
        if line.startswith("PEAK "):
            peak = json.loads(line[5:])
        elif line.startswith("import time:") and "|" in line:
            _self_us, cumulative, name = line[12:].split("|")
            # Top-level imports are indented by exactly one space after the bar.
            if cumulative.strip().isdigit() and not name.startswith("  "):
                imports += int(cumulative) / 1e6
    return wall, peak, imports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another code tree to measure side by side")
    args = parser.parse_args()
    trees = {"codeveil": HERE}
    if args.baseline:
        trees["baseline"] = args.baseline.resolve()
    src = args.repo or default_repo()
    base = isolate()
    results: dict[str, dict] = {}
    rows = []
    for name, code in trees.items():
        env = dict(os.environ)
        # A user's install writes bytecode once; without it every process compiles its
        # sources again (0.3 s), which is this machine's setting, not a user's.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["CODEVEIL_CONFIG_DIR"] = str(base / name / "config")
        env["CODEVEIL_CACHE_DIR"] = str(base / name / "cache")
        # The default model, chosen as a user's install chooses it: by the workspace's
        # model id, not by CODEVEIL_EMBEDDER, whose explicit choice probes the backends
        # (onnx, onnxruntime's providers) on every call, work a user's call never does.
        env.pop("CODEVEIL_EMBEDDER", None)
        repo = copy_tree(src, base / name / "repo")
        wall, peak, _ = run(code, repo, env, "index", "--wait", "-q", ".")
        results[name] = {"env": env, "repo": repo, "cold": {"seconds": wall, **peak}}
    measures = {
        "no-change re-index": ("index", "--wait", "-q", "."),
        "one-file re-index": ("index", "--wait", "-q", "."),
        "CLI search": ("search", QUERY, "-k", "5"),
    }
    for measure, cli_args in measures.items():
        times: dict[str, list[float]] = {name: [] for name in trees}
        imports: dict[str, float] = {}
        for i in range(args.runs + 1):
            for name, code in trees.items():
                r = results[name]
                if measure == "one-file re-index":
                    victim = r["repo"] / "api.py" if (r["repo"] / "api.py").exists() else \
                        sorted(r["repo"].rglob("*.py"))[0]
                    with victim.open("a") as f:
                        f.write(f"\n\ndef added_for_bench_{i}():\n    return {i}\n")
                wall, _, imp = run(code, r["repo"], r["env"], *cli_args, importtime=i == 0)
                if i == 0:
                    imports[name] = imp  # the importtime run is slower: not timed
                else:
                    times[name].append(wall)
        for name in trees:
            med = statistics.median(times[name])
            results[name][measure] = {"median_s": med, "runs": times[name],
                                      "imports_s": imports[name]}
    for name in trees:
        r = results[name]
        rows.append([name, "cold index", r["cold"]["seconds"],
                     r["cold"]["self_kb"] / 1024, r["cold"]["children_kb"] / 1024, ""])
        for measure in measures:
            m = r[measure]
            rows.append([name, measure, m["median_s"], "", "", m["imports_s"]])
    print(f"repo: {src}; medians of {args.runs} runs, whole process")
    print(table(["code", "measure", "seconds", "peak MB (process)", "peak MB (child)",
                 "imports s"], rows))
    for r in results.values():
        r.pop("env")
        r["repo"] = str(r["repo"])
    path = write_json("per_call", {
        "repo": str(src),
        "query": QUERY,
        "targets": {"no-change re-index": 0.5, "one-file re-index": 1.0,
                    "cold index peak GB": 1.0},
        "semble": "not run: it loads its model from a model hub, which this machine "
                  "cannot reach",
        "results": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
