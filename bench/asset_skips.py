"""What the default skips leave out of real trees, and what a cold index costs, this code
tree beside another.

    python bench/asset_skips.py --baseline DIR --repo PATH [--repo PATH ...] [--no-index]
                                [--name asset_skips]

For each `--repo` (a `git archive` of seaborn, flask, sphinx or astropy, say) and each code
tree (`--baseline`, a `git archive` of the commit before the change, and this one):

- the files indexed and the chunks they make (walk, read and chunk exactly as
  `codeveil index` does, run with that code tree on PYTHONPATH), the word pieces the
  model would read for them (its cost), chunks by file type, and the files left out
  per reason;
- the wall time of a cold `codeveil index --json` on a fresh copy, with the hashing
  embedder so that the time is the walk, chunking and storage (the model's own time
  grows with the chunks it embeds, shown beside it). `--no-index` leaves this out.

Prints the tables and writes bench/results/NAME.json (default asset_skips.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TOP_TYPES = 8  # file types shown per tree in the chunk table; the rest are "other"


def count(root: Path) -> dict:
    """Files and chunks the code on PYTHONPATH indexes under `root` (run in a subprocess,
    so that only that code tree is imported)."""
    from indexer.chunker import chunk_file
    from indexer.tokens import default_counter
    from indexer.walk import SourceFile, read_source, walk_repo

    counter = default_counter()
    walked = walk_repo(root)
    skipped = Counter(str(s.reason) for s in walked.skipped)
    chunks: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    files = 0
    for entry in walked.files:
        source = read_source(root, entry.path)
        if not isinstance(source, SourceFile):
            skipped[str(source.reason)] += 1
            continue
        files += 1
        name = entry.path.rsplit("/", 1)[-1].lower()
        kind = "." + name.rsplit(".", 1)[-1] if "." in name.lstrip(".") else "(no extension)"
        made = chunk_file(entry.path, source.text)
        chunks[kind] += len(made)
        tokens[kind] += sum(counter.count_batch([c.embed_text for c in made]))
    return {"files": files, "chunks": sum(chunks.values()), "tokens": sum(tokens.values()),
            "chunks_by_type": dict(chunks), "tokens_by_type": dict(tokens),
            "skipped": dict(skipped)}


def _env(code: Path, work: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code), "CODEVEIL_EMBEDDER": "hashing",
            "CODEVEIL_CONFIG_DIR": str(work / "config"), "CODEVEIL_CACHE_DIR": str(work / "cache")}


def count_with(code: Path, repo: Path, work: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--count", str(repo)], env=_env(code, work),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"counting {repo} with {code} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def cold_index(code: Path, repo: Path, work: Path) -> dict:
    """One `codeveil index --json` of a fresh copy of `repo` with `code`, from empty caches."""
    shutil.rmtree(work, ignore_errors=True)
    copy = work / "repo"
    shutil.copytree(repo, copy, symlinks=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "retrieval", "index", "--wait", "--json", "."],
                          cwd=copy, env=_env(code, work), capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"index of {repo} with {code} failed:\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {"seconds": wall, "seconds_chunk": report["seconds_chunk"],
            "chunks_embedded": report["chunks_embedded"], "files_scanned": report["files_scanned"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=Path, help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument("--baseline", type=Path, help="the code tree to compare with")
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="a tree to index (repeat)")
    parser.add_argument("--no-index", action="store_true", help="counts only, no cold index")
    parser.add_argument("--name", default="asset_skips",
                        help="results file: bench/results/NAME.json (default: %(default)s)")
    args = parser.parse_args()
    if args.count is not None:
        print(json.dumps(count(args.count)))
        return
    if args.baseline is None or not args.repo:
        parser.error("--baseline and at least one --repo are needed")

    sys.path.insert(0, str(HERE))
    from bench._common import table, write_json

    codes = {"before": args.baseline.resolve(), "after": HERE}
    work = Path(tempfile.mkdtemp(prefix="codeveil-asset-skips-"))
    results: dict[str, dict[str, dict]] = {}
    for repo in (r.resolve() for r in args.repo):
        results[repo.name] = {}
        for name, code in codes.items():
            measured = count_with(code, repo, work / "count")
            if not args.no_index:
                measured["index"] = cold_index(code, repo, work / name)
            results[repo.name][name] = measured
            print(f"{repo.name} {name}: {measured['files']} files, {measured['chunks']} chunks",
                  flush=True)
    shutil.rmtree(work, ignore_errors=True)

    rows = []
    for tree, by_code in results.items():
        before, after = by_code["before"], by_code["after"]
        row = [tree, before["files"], after["files"], before["chunks"], after["chunks"],
               f"{1 - after['chunks'] / max(before['chunks'], 1):.0%}",
               before["tokens"], after["tokens"],
               f"{1 - after['tokens'] / max(before['tokens'], 1):.0%}"]
        if not args.no_index:
            row += [before["index"]["seconds"], after["index"]["seconds"]]
        rows.append(row)
    headers = ["tree", "files before", "files after", "chunks before", "chunks after",
               "chunks saved", "tokens before", "tokens after", "tokens saved"]
    if not args.no_index:
        headers += ["cold index s before", "cold index s after"]
    print(table(headers, rows))

    for tree, by_code in results.items():
        columns = [by_code[code][f"{what}_by_type"] for what in ("chunks", "tokens")
                   for code in ("before", "after")]
        top = sorted(columns[0], key=lambda t: -columns[0][t])[:TOP_TYPES]
        type_rows: list[list[object]] = [[t, *(c.get(t, 0) for c in columns)] for t in top]
        rest = {t for c in columns for t in c} - set(top)
        type_rows.append(["other", *(sum(c.get(t, 0) for t in rest) for c in columns)])
        print(f"\n{tree}: chunks and word pieces by file type")
        print(table(["type", "chunks before", "chunks after", "tokens before", "tokens after"],
                    type_rows))
        reasons = by_code["after"]["skipped"]
        print(f"{tree}: files skipped now, by reason")
        print(table(["reason", "files"], sorted(reasons.items(), key=lambda r: -r[1])))

    path = write_json(args.name, {"baseline": str(codes["before"]),
                                      "repos": [str(r) for r in args.repo],
                                      "embedder": "hashing", "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
