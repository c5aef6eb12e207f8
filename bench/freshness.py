"""Freshness: how soon a change in the working tree is searchable with the daemon running.

    python bench/freshness.py [--files 10000] [--runs 5] [--switch-files 1000]
                              [--switch-runs 3] [--idle-seconds 60] [--real]

On a synthetic repo of `--files` Python files, with `codeveil daemon` running (started
with `codeveil daemon start`, default settings):

1. Save one file with a new function; time until a search for it returns it as the top
   hit (median of `--runs`). Also split into "until the daemon's sync started" (the
   debounce) and the sync itself.
2. Rewrite, add and delete `--switch-files` files at once (a simulated branch switch);
   time until the daemon has synced all of them, then check every changed file is
   searchable (in the top 5 for its own docstring) and no deleted file is returned.
3. Leave the daemon idle for `--idle-seconds`: its CPU use (from /proc/<pid>/stat) and
   resident memory (from /proc/<pid>/status).

The daemon and the searches use the hashing embedder unless `--real` (all-MiniLM-L6-v2):
the measure is the system around the model. Searches run in this process through one
long-lived `Index`, as an editor integration would. Prints a table and writes
bench/results/freshness.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import isolate, table, write_json
from indexer.embedder import Embedder, HashingEmbedder, SentenceTransformerEmbedder
from retrieval import Index
from sync.daemon import DaemonFiles, DaemonStatus, read_status

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Plain English words, so that both embedders (word pieces) see real tokens; every
# generated function gets three of them and a unique tag.
WORDS = [
    "anchor", "badge", "beacon", "bramble", "canyon", "cedar", "cobalt", "comet", "coral",
    "crater", "dagger", "delta", "dune", "ember", "falcon", "fern", "fjord", "flint",
    "forge", "galaxy", "garnet", "geyser", "glacier", "granite", "harbor", "hazel",
    "heron", "island", "ivory", "jasper", "kestrel", "lagoon", "lantern", "lava", "maple",
    "marble", "meadow", "meteor", "nebula", "nectar", "oasis", "onyx", "orchid", "otter",
    "pebble", "pepper", "pine", "prairie", "quartz", "quill", "raven", "reef", "saffron",
    "sapphire", "sequoia", "shadow", "spruce", "summit", "thistle", "thunder", "timber",
    "topaz", "tundra", "velvet", "violet", "walnut", "willow", "zephyr",
]


def cli(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH"))
                                        if p)
    proc = subprocess.run([sys.executable, "-m", "retrieval", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise SystemExit(f"codeveil {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def function_source(tag: str, rng: random.Random) -> tuple[str, str, str]:
    """A function with a distinctive name and docstring: (source, query, name).

    The query is what a user who knows the function would type: its name and what its
    docstring says.
    """
    a, b, c = rng.sample(WORDS, 3)
    name = f"{a}_{b}_{c}_{tag}"
    doc = f"Blend the {a} and {b} layers into the {c} map, variant {tag}."
    body = (f"\n\ndef {name}(source, target):\n    \"\"\"{doc}\"\"\"\n"
            f"    return [s + t for s, t in zip(source, target)]\n")
    return body, f"{name}: {doc}", name


def make_repo(root: Path, files: int, rng: random.Random) -> list[Path]:
    paths = []
    for i in range(files):
        path = root / f"pkg{i % 40:02d}" / f"sub{(i // 40) % 25:02d}" / f"mod_{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        body, _, _ = function_source(f"m{i}", rng)
        path.write_text(f'"""Module {i}."""\n' + body)
        paths.append(path)
    return paths


def wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def daemon_status(repo: Path) -> DaemonStatus:
    return read_status(DaemonFiles.for_root(repo)) or DaemonStatus()


def settled_after(repo: Path, wall: float) -> DaemonStatus | None:
    """The daemon's status once a sync that started after `wall` has finished, with no
    changes pending and nothing failed; else None."""
    s = daemon_status(repo)
    if ((s.last_sync_started or 0) > wall and s.state == "idle"
            and s.pending_changes == 0 and s.last_sync_ok):
        return s
    return None


def top_path(idx: Index, query: str, k: int = 1) -> list[tuple[str, str]]:
    return [(h.path, h.text) for h in idx.search(query, k=k)]


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--switch-files", type=int, default=1_000)
    parser.add_argument("--switch-runs", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--real", action="store_true", help="Use all-MiniLM-L6-v2.")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    work = isolate()
    if args.real:
        os.environ.pop("CODEVEIL_EMBEDDER", None)
        embedder: Embedder = SentenceTransformerEmbedder()
    else:
        os.environ["CODEVEIL_EMBEDDER"] = "hashing"
        embedder = HashingEmbedder()
    rng = random.Random(args.seed)
    repo = work / "repo"
    print(f"writing {args.files} files under {repo} ...", file=sys.stderr)
    paths = make_repo(repo, args.files, rng)

    t0 = time.perf_counter()
    report = Index(repo, embedder=embedder).index(wait=True)
    cold = time.perf_counter() - t0
    print(f"cold index: {report.files_changed} files, {report.chunks_total} chunks in"
          f" {cold:.1f} s", file=sys.stderr)

    started_wall = time.time()
    out = cli("daemon", "start", repo)
    print(out.stdout.strip(), file=sys.stderr)
    pid = int(daemon_status(repo).pid or 0)
    first = wait("the daemon's first sync", lambda: settled_after(repo, started_wall - 1), 600)
    periodic_sync = first["last_result"]["seconds"]
    idx = Index(repo, embedder=embedder)
    try:
        idx.search("warm up the searcher", k=1)
        results: dict[str, Any] = {
            "files": args.files, "embedder": "minilm" if args.real else "hashing",
            "cold_index_seconds": round(cold, 3),
            "no_change_sync_seconds": periodic_sync,
        }
        results["single_file"] = single_file_runs(repo, paths, idx, rng, args.runs)
        results["branch_switch"] = branch_switch_runs(
            repo, paths, idx, rng, args.switch_files, args.switch_runs
        )
    finally:
        idx.close()

    wait("the daemon to be idle", lambda: daemon_status(repo).state == "idle", 600)
    time.sleep(2)  # let the last status write and log line settle
    syncs_before = daemon_status(repo).syncs
    c0, w0 = proc_cpu_seconds(pid), time.monotonic()
    print(f"measuring the idle daemon for {args.idle_seconds:.0f} s ...", file=sys.stderr)
    time.sleep(args.idle_seconds)
    c1, w1 = proc_cpu_seconds(pid), time.monotonic()
    st = proc_status(pid)
    results["idle"] = {
        "seconds": round(w1 - w0, 1),
        "cpu_percent": round(100 * (c1 - c0) / (w1 - w0), 3),
        "cpu_seconds": round(c1 - c0, 3),
        "rss_mb": round(int(st["VmRSS"].split()[0]) / 1024, 1),
        "peak_rss_mb": round(int(st["VmHWM"].split()[0]) / 1024, 1),
        "threads": int(st["Threads"]),
        "syncs_during_idle": daemon_status(repo).syncs - syncs_before,
    }
    cli("daemon", "stop", repo)
    report_results(results)


def single_file_runs(repo: Path, paths: list[Path], idx: Index, rng: random.Random,
                     runs: int) -> dict[str, Any]:
    totals, debounces, syncs, searchable = [], [], [], []
    phases: dict[str, list[float]] = {}
    for run in range(runs):
        path = rng.choice(paths)
        rel = path.relative_to(repo).as_posix()
        body, query, name = function_source(f"s{run}", rng)
        text = path.read_text() + body
        wall, t0 = time.time(), time.perf_counter()
        path.write_text(text)

        def found(query: str = query, rel: str = rel, name: str = name) -> bool:
            hits = top_path(idx, query)
            return bool(hits) and hits[0][0] == rel and name in hits[0][1]

        wait(f"{name} to be the top hit", found, 120, interval=0.01)
        total = time.perf_counter() - t0
        s = wait("the daemon to settle", lambda w=wall: settled_after(repo, w), 120)
        totals.append(total)
        debounces.append(s["last_sync_started"] - wall)
        syncs.append(s["last_sync_seconds"])
        searchable.append(wall + total - s["last_sync_finished"])
        for key, value in s["last_result"].items():
            if key.startswith("seconds_"):
                phases.setdefault(key, []).append(value)
        print(f"  single file {run + 1}/{runs}: {total:.2f} s", file=sys.stderr)
        time.sleep(1.0)
    return {
        "runs": runs,
        "seconds": [round(x, 3) for x in totals],
        "median_seconds": round(statistics.median(totals), 3),
        "median_until_sync_start": round(statistics.median(debounces), 3),
        "median_sync_seconds": round(statistics.median(syncs), 3),
        # From the end of the daemon's sync to the first search that returned the hit.
        "median_search_after_sync": round(statistics.median(searchable), 3),
        # The sync's own breakdown (SyncReport): walk, chunk, embed, store round trips.
        "median_sync_phases": {k: round(statistics.median(v), 3) for k, v in phases.items()},
    }


def branch_switch_runs(repo: Path, paths: list[Path], idx: Index, rng: random.Random,
                       n: int, runs: int) -> dict[str, Any]:
    totals, after_write, sync_seconds, checked = [], [], [], []
    for run in range(runs):
        live = [p for p in paths if p.exists()]
        n_delete = n_add = n // 20
        touched = rng.sample(live, n - n_add)
        deleted, rewritten = touched[:n_delete], touched[n_delete:]
        added = [repo / f"branch{run}" / f"new_{i:05d}.py" for i in range(n_add)]
        expect: dict[str, tuple[str, str]] = {}
        plan: list[tuple[Path, str]] = []
        for i, path in enumerate(rewritten + added):
            body, query, name = function_source(f"b{run}x{i}", rng)
            plan.append((path, f'"""Branch {run} file {i}."""\n' + body))
            expect[path.relative_to(repo).as_posix()] = (query, name)
        gone = {p.relative_to(repo).as_posix() for p in deleted}

        t0 = time.perf_counter()
        for path in deleted:
            path.unlink()
        for path, text in plan:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        last_write, t1 = time.time(), time.perf_counter()
        s = wait("the daemon to sync the switch", lambda w=last_write: settled_after(repo, w), 600)
        done = time.perf_counter()
        total = done - t0
        paths.extend(added)
        # Every changed file must be findable by its own docstring, and no deleted file
        # may come back.
        ok = 0
        for rel, (query, name) in expect.items():
            hits = top_path(idx, query, k=5)
            ok += any(p == rel and name in t for p, t in hits)
            if any(p in gone for p, _ in hits):
                raise SystemExit(f"a deleted file was returned for {query!r}")
        totals.append(total)
        after_write.append(done - t1)
        sync_seconds.append(s["last_sync_seconds"])
        checked.append(ok / len(expect))
        print(f"  branch switch {run + 1}/{runs}: {total:.2f} s, {ok}/{len(expect)} searchable"
              f" ({s['syncs']} syncs so far)", file=sys.stderr)
        time.sleep(1.0)
    return {
        "runs": runs,
        "files_changed": n - n // 20 - n // 20,
        "files_added": n // 20,
        "files_deleted": n // 20,
        "seconds": [round(x, 3) for x in totals],
        "median_seconds": round(statistics.median(totals), 3),
        # From the last file written (writing 1,000 files takes a while itself).
        "median_after_last_write": round(statistics.median(after_write), 3),
        "median_sync_seconds": round(statistics.median(sync_seconds), 3),
        "searchable_fraction": [round(x, 4) for x in checked],
    }


def report_results(results: dict[str, Any]) -> None:
    single, switch, idle = results["single_file"], results["branch_switch"], results["idle"]
    rows = [
        ("one saved file -> top hit", single["median_seconds"],
         f"sync started after {single['median_until_sync_start']:.2f} s,"
         f" sync {single['median_sync_seconds']:.2f} s, found"
         f" {single['median_search_after_sync']:.2f} s after it"),
        (f"{switch['files_changed'] + switch['files_added'] + switch['files_deleted']}-file"
         " switch -> all synced", switch["median_seconds"],
         f"{switch['median_after_last_write']:.2f} s after the last write, sync"
         f" {switch['median_sync_seconds']:.2f} s; searchable:"
         f" {min(switch['searchable_fraction']):.1%} (worst run)"),
        ("sync with nothing changed", results["no_change_sync_seconds"],
         "what the periodic check costs"),
    ]
    print()
    print(f"{results['files']} files, {results['embedder']} embedder")
    print(table(["what", "median s", "detail"], rows))
    phases = ", ".join(f"{k.removeprefix('seconds_')} {v:.2f} s"
                       for k, v in single["median_sync_phases"].items())
    print(f"one-file sync, median by phase: {phases}")
    print()
    print(table(["idle daemon", "value"], [
        ("CPU % of one core", idle["cpu_percent"]),
        ("over seconds", idle["seconds"]),
        ("RSS MB", idle["rss_mb"]),
        ("peak RSS MB", idle["peak_rss_mb"]),
        ("threads", idle["threads"]),
    ]))
    path = write_json("freshness", results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
