"""The lookups beside search: grep latency against a full scan, and definition Acc@1.

    python -m bench.agent_tools [--quick | --astropy | --grep-only]

grep. Trees: this repository (a `git archive` of HEAD) and a generated tree of 10,000
small files; with `--astropy` also astropy (1,866 indexed files, from the local git
mirrors under /work/.mirror), which adds about five minutes on a busy 2-core machine.
Each tree's client state is filled by the indexer's own components (walk, stat cache,
chunker with definitions, chunk table) without embedding: grep and definition read
nothing else. The files are dated a minute back, as in any tree not edited this very
second (a file written within the stat cache's 2 s racy margin is read by every grep,
whatever the index says). For every pattern: the grep's p50 over REPEATS warm calls
(BROAD_REPEATS for patterns that read most files), in process with the index in memory
and the freshness check included (on Linux the tool process watches the indexed files'
directories, so a warm call stats only the files changed since: retrieval.indexes.tree_watch);
for selective patterns also the p50 with every file stat'ed on every call ("unwatched",
as on the first call or without inotify); the full scan's time (every indexed file
read and searched line by line); the files read; and whether the two returned the same
lines (they must, always). Also the grep index's size on disk and build time.

definition. Names sampled from the Python repositories among the mirrors (plus this
one): ground truth from Python's own `ast` (each class, function and method, with its
qualified name and the line its `def`/`class` stands on), independent of tree-sitter.
Only names whose qualified form is unique in the repo are asked (`Class.method` or
`func`); a hit is right when its first candidate is that file and line. The mirrors
hold Python repositories only, so this measures Python; the other grammars are covered
by tests/test_symbols.py.

Writes bench/results/agent_tools.json (agent_tools_astropy.json with `--astropy`,
agent_tools_grep.json with `--grep-only`).
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

from bench._common import isolate, table, write_json

ROOT = Path(__file__).resolve().parent.parent
MIRRORS = Path("/work/.mirror")
DEF_REPOS = ("psf+requests", "pallets+flask", "mwaskom+seaborn")
MID_TREE = "astropy+astropy"
GENERATED_FILES = 10_000
REPEATS = 9
BROAD_REPEATS = 3  # patterns that read most of the files: slow, and their p50 is steady
SELECTIVE = 12  # sampled identifiers per tree
NAMES_PER_REPO = 150


def _archive(git_dir: Path | None, dest: Path) -> Path:
    """HEAD of the repository at `git_dir` (this one if None) as files under `dest`."""
    dest.mkdir(parents=True)
    where = ["--git-dir", str(git_dir)] if git_dir is not None else ["-C", str(ROOT)]
    archive = subprocess.run(["git", *where, "archive", "HEAD"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _age(root: Path) -> None:
    past = time.time() - 60
    for folder, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(folder, name), (past, past))


def _generate(dest: Path, n: int, rng: random.Random) -> Path:
    """n small Python and JavaScript files of made-up but code-like text."""
    words = [f"{a}{b}" for a in ("load", "save", "parse", "emit", "fetch", "merge", "split",
                                 "check", "build", "store")
             for b in ("Item", "User", "Order", "Cache", "Token", "Frame", "Batch", "Node")]
    for i in range(n):
        folder = dest / f"pkg{i % 100:02d}" / f"mod{(i // 100) % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        unique = f"handler_{i:05d}_{rng.randrange(10**6):06d}"
        body = [f"# module {i}", "import os", ""]
        for j in range(6):
            name = rng.choice(words)
            body += [f"def {name}_{j}(value, limit={rng.randrange(100)}):",
                     f"    total = {rng.choice(words)}(value) + {rng.randrange(1000)}",
                     "    if total > limit:",
                     f"        return {unique}(total)" if j == 0 else "        return total",
                     "    return None", ""]
        body += [f"def {unique}(x):", "    return x", ""]
        if i % 3 == 0:
            (folder / f"f{i}.js").write_text(
                f"export function {unique}(x) {{ return x * {i}; }}\n"
                f"const {rng.choice(words)} = () => {i};\n")
        else:
            (folder / f"f{i}.py").write_text("\n".join(body))
    return dest


def _fill_state(root: Path) -> tuple[float, int]:
    """Fill root's client state as an index would, minus the vectors: (seconds, files)."""
    from indexer.definitions import chunk_and_define
    from indexer.embedder import HashingEmbedder
    from indexer.local_chunks import LocalChunks, open_state_db
    from indexer.statcache import StatCache, scan
    from indexer.walk import SourceFile, walk_repo
    from retrieval import Index

    Index(root, embedder=HashingEmbedder()).init()  # `.codeveil/` and its config
    started = time.perf_counter()
    state = root / ".codeveil" / "state.sqlite"
    db = open_state_db(state)
    local = LocalChunks(db)
    cache = StatCache(state)
    batch: list[SourceFile] = []

    def write() -> None:
        items, defined = [], {}
        for source in batch:
            chunks, defined[source.path] = chunk_and_define(source.path, source.text)
            items.append((source.path, source.digest, chunks))
        local.replace_files(items, definitions=defined)
        batch.clear()

    def on_source(source: SourceFile) -> None:
        batch.append(source)
        if len(batch) >= 200:
            write()

    scan(root, walk_repo(root), cache, on_source=on_source)
    write()
    files = local.count_files()
    cache.close()
    db.close()
    return time.perf_counter() - started, files


def _patterns(root: Path, rng: random.Random) -> list[tuple[str, str]]:
    """(kind, pattern): selective identifiers sampled from the tree's definitions, a few
    regexes, a common word, and one that requires no trigram."""
    import sqlite3

    with sqlite3.connect(root / ".codeveil" / "state.sqlite") as db:
        names = [n for (n,) in db.execute(
            "SELECT name FROM definitions WHERE length(name) >= 8 GROUP BY name"
            " HAVING count(*) = 1")]
    rng.shuffle(names)
    out = [("selective", name) for name in names[:SELECTIVE]]
    if names:
        out.append(("regex", rf"def {names[0][:5]}\w*\("))
        out.append(("alternation", f"{names[1]}|{names[2]}" if len(names) > 2 else names[0]))
        out.append(("ignore-case", f"(?i){names[3].upper()}" if len(names) > 3 else names[0]))
    out.append(("common", "return"))
    out.append(("no trigram", r"^\s*@\w+"))
    return out


def _grep_bench(label: str, root: Path, rng: random.Random, repeats: int) -> dict:
    from retrieval.agent.agent_tools import AgentTools
    from retrieval.agent.grep import Freshness, full_scan, grep_files

    no_watch = Freshness(watch=False)
    seconds_state, files = _fill_state(root)
    tools = AgentTools(root)
    started = time.perf_counter()
    index = tools.trigrams(root).current(_db(root))
    build = time.perf_counter() - started
    size = sum(f.stat().st_size for f in (root / ".codeveil" / "trigrams").iterdir())
    paths = list(index.live_paths())
    rows, equal_all = [], True
    for kind, pattern in _patterns(root, rng):
        times, fresh = [], []
        for _ in range(repeats if kind in ("selective", "alternation", "ignore-case")
                       else min(repeats, BROAD_REPEATS)):
            t0 = time.perf_counter()
            result = tools.grep(pattern)
            times.append(time.perf_counter() - t0)
            fresh.append(result.seconds_freshness)
        unwatched = []
        if kind == "selective":  # the same grep, every file stat'ed on every call
            for _ in range(repeats):
                t0 = time.perf_counter()
                with closing(_db(root)) as db:
                    grep_files(root, db, tools.trigrams(root).current(db), pattern,
                               freshness=no_watch)
                unwatched.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        expected = full_scan(root, paths, pattern)
        scan_s = time.perf_counter() - t0
        equal = result.matches == expected
        equal_all = equal_all and equal
        rows.append({"kind": kind, "pattern": pattern, "p50_ms": statistics.median(times) * 1e3,
                     "freshness_p50_ms": statistics.median(fresh) * 1e3,
                     "unwatched_p50_ms": (statistics.median(unwatched) * 1e3
                                          if unwatched else None),
                     "full_scan_ms": scan_s * 1e3, "files_read": result.files_read,
                     "files": result.files_indexed, "lines": len(result.matches),
                     "equal": equal})
    selective = [r["p50_ms"] for r in rows if r["kind"] == "selective"]
    fresh_ms = [r["freshness_p50_ms"] for r in rows if r["kind"] == "selective"]
    unwatched_ms = [r["unwatched_p50_ms"] for r in rows if r["kind"] == "selective"]
    return {"tree": label, "files": files, "seconds_fill_state": round(seconds_state, 2),
            "index_build_s": round(build, 3), "index_bytes": size,
            "postings": index.postings, "selective_p50_ms": statistics.median(selective),
            "selective_freshness_p50_ms": statistics.median(fresh_ms),
            "selective_unwatched_p50_ms": statistics.median(unwatched_ms),
            "equal_all": equal_all, "patterns": rows}


def _db(root: Path):
    from indexer.local_chunks import open_state_db

    return open_state_db(root / ".codeveil" / "state.sqlite")


def _ast_definitions(root: Path) -> list[tuple[str, str, int]]:
    """(qualified name, path, line) of every class, function and method, by `ast`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "/." in f"/{rel}":
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue

        def visit(node: ast.AST, scope: tuple[str, ...], rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    qual = (*scope, child.name)
                    out.append((".".join(qual), rel, child.lineno))
                    visit(child, qual)
                elif not isinstance(child, ast.Lambda):
                    visit(child, scope)

        visit(tree, ())
    return out


def _definition_bench(label: str, root: Path, rng: random.Random, per_repo: int) -> dict:
    from indexer.walk import walk_repo
    from retrieval.agent.agent_tools import AgentTools

    if not (root / ".codeveil" / "state.sqlite").exists():
        _fill_state(root)
    indexed = {f.path for f in walk_repo(root).files}
    truth = [d for d in _ast_definitions(root) if d[1] in indexed]
    counts: dict[str, int] = {}
    for name, _, _ in truth:
        counts[name] = counts.get(name, 0) + 1
    unique = [d for d in truth if counts[d[0]] == 1]
    sample = rng.sample(unique, min(per_repo, len(unique)))
    tools = AgentTools(root)
    right, misses, times = 0, [], []
    for name, path, line in sample:
        t0 = time.perf_counter()
        hits = tools.definition(name, limit=1)
        times.append(time.perf_counter() - t0)
        if hits and (hits[0].path, hits[0].start_line) == (path, line):
            right += 1
        elif len(misses) < 5:
            misses.append({"name": name, "want": f"{path}:{line}",
                           "got": f"{hits[0].path}:{hits[0].start_line}" if hits else None})
    return {"repo": label, "names": len(sample), "acc_at_1": right / max(len(sample), 1),
            "p50_ms": statistics.median(times) * 1e3 if times else 0.0, "misses": misses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats, a 2,000-file generated tree")
    parser.add_argument("--astropy", action="store_true",
                        help="also grep and look up definitions in astropy (minutes more)")
    parser.add_argument("--grep-only", action="store_true",
                        help="the grep part only (writes agent_tools_grep.json)")
    args = parser.parse_args()
    isolate()
    rng = random.Random(29)
    work = Path(tempfile.mkdtemp(prefix="codeveil-agent-tools-"))
    repeats = 5 if args.quick else REPEATS
    try:
        trees: list[tuple[str, Path]] = [("codeveil", _archive(None, work / "codeveil"))]
        mid = MIRRORS / MID_TREE / "repo"
        if mid.is_dir() and args.astropy:
            trees.append((MID_TREE.split("+")[1], _archive(mid, work / "mid")))
        n = 2_000 if args.quick else GENERATED_FILES
        trees.append((f"generated-{n}", _generate(work / "generated", n, rng)))
        grep_rows = []
        for label, root in trees:
            _age(root)
            grep_rows.append(_grep_bench(label, root, rng, repeats))
        def_rows = ([] if args.grep_only
                    else [_definition_bench("codeveil", trees[0][1], rng, NAMES_PER_REPO)])
        for repo in ((*DEF_REPOS, *((MID_TREE,) if args.astropy else ()))
                     if not args.grep_only else ()):
            git_dir = MIRRORS / repo / "repo"
            if not git_dir.is_dir():
                continue
            name = repo.split("+")[1]
            root = next((r for label, r in trees if label == name), None)
            if root is None:
                root = _archive(git_dir, work / f"def-{name}")
            def_rows.append(_definition_bench(name, root, rng, NAMES_PER_REPO))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(table(["tree", "files", "index MB", "build s", "selective p50 ms",
                 "of which stat ms", "unwatched p50 ms", "slowest p50 ms", "its full scan ms",
                 "all equal"],
                [[g["tree"], g["files"], round(g["index_bytes"] / 2**20, 2),
                  g["index_build_s"], round(g["selective_p50_ms"], 2),
                  round(g["selective_freshness_p50_ms"], 2),
                  round(g["selective_unwatched_p50_ms"], 2),
                  round(max(r["p50_ms"] for r in g["patterns"]), 1),
                  round(max(g["patterns"], key=lambda r: r["p50_ms"])["full_scan_ms"], 1),
                  g["equal_all"]] for g in grep_rows]))
    print()
    for g in grep_rows:
        print(f"{g['tree']}:")
        print(table(["kind", "pattern", "p50 ms", "stat ms", "full scan ms", "files read",
                     "lines", "equal"],
                    [[r["kind"], r["pattern"][:40], round(r["p50_ms"], 2),
                      round(r["freshness_p50_ms"], 2),
                      round(r["full_scan_ms"], 1), f"{r['files_read']}/{r['files']}",
                      r["lines"], r["equal"]] for r in g["patterns"]]))
        print()
    total = sum(d["names"] for d in def_rows)
    overall = sum(d["acc_at_1"] * d["names"] for d in def_rows) / max(total, 1)
    print(table(["repo", "names", "Acc@1", "p50 ms"],
                [[d["repo"], d["names"], round(d["acc_at_1"], 3), round(d["p50_ms"], 2)]
                 for d in def_rows] + [["all", total, round(overall, 3), ""]]))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    name = ("agent_tools_grep" if args.grep_only
            else "agent_tools_astropy" if args.astropy else "agent_tools")
    path = write_json(name, {
        "command": " ".join([Path(sys.executable).name, "-m", "bench.agent_tools",
                             *sys.argv[1:]]),
        "commit": commit, "load": os.getloadavg()[0],
        "grep": grep_rows, "definition": def_rows, "definition_acc_at_1": overall,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
