"""One query over several repositories: is each answer found as often as when its own
repository is searched alone?

    python bench/multi_repo.py [--trees psf/requests,pallets/flask,mwaskom/seaborn]
                               [--per-repo 40]

Each tree is a git mirror under /work/.mirror (read with `git archive HEAD`, the commit
recorded), unpacked as `<work>/<name>/<name>/` and indexed on its own with the default
embedder (cached in bench/.cache/multi_repo, so a rerun embeds nothing). Queries with a
known answer, written by the projects' authors: the first sentence of the docstring of a
Python function or class defined in exactly one file of its tree (at least four words;
sampled with a fixed seed), the answer being that file. Every query is searched with
`group="file"`, k=5, in its own repository alone (`Index`) and in all of them at once:
merged by fused score alone (the baseline), and as `MultiIndex` merges (fused score and
cosine, fused by reciprocal rank). Acc@5 counts the answer's file (in the answer's
repository) among the five. Queries are split in a tune and a report half by a hash of
repository and query: MultiIndex's merge settings were chosen on tune; report is the
figure. Writes bench/results/multi_repo.json.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import bench_cache, table, unpack_mirror, write_json  # noqa: E402


def unpack(name: str, into: Path) -> tuple[Path, str]:
    """The mirror's HEAD as `into/<repo>/<repo>/`; (the repository's root, its commit)."""
    short = name.split("/")[1]
    return into / short, unpack_mirror(name, into / short / short)


def docstring_queries(root: Path, n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(first docstring sentence, defining file) of up to `n` Python definitions whose
    name is defined in exactly one file of the tree."""
    found: list[tuple[str, str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node) or ""
                sentence = doc.strip().split("\n\n")[0].replace("\n", " ").split(". ")[0]
                if len(sentence.split()) >= 4:
                    found.append((node.name, sentence.strip().rstrip("."), rel))
    files_of = Counter(name for name, _ in {(name, rel) for name, _, rel in found})
    unique = [(s, rel) for name, s, rel in found if files_of[name] == 1]
    unique = sorted(set(unique))
    return rng.sample(unique, min(n, len(unique)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="psf/requests,pallets/flask,mwaskom/seaborn")
    parser.add_argument("--per-repo", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bench_cache("multi_repo")
    work = Path(tempfile.mkdtemp(prefix="codeveil-multi-"))
    from retrieval import Index, MultiIndex

    try:
        repos, commits, queries, chunks = [], {}, {}, {}
        rng = random.Random(args.seed)
        for name in args.trees.split(","):
            root, commits[name] = unpack(name, work)
            with Index(root) as idx:
                t0 = time.perf_counter()
                chunks[name] = idx.index(wait=True).chunks_total
                print(f"{name}: {chunks[name]} chunks in {time.perf_counter() - t0:.0f} s",
                      flush=True)
            repos.append((name, root))
            queries[name] = docstring_queries(root, args.per_repo, rng)
        from retrieval.faces.multi import MERGE_DEPTH

        counts: Counter[tuple[str, str, str]] = Counter()  # (half, repo, system)
        with MultiIndex([r for _, r in repos]) as many:
            for (name, _), idx in zip(repos, many.indexes, strict=True):
                for q, gold in queries[name]:
                    half = "tune" if int(hashlib.sha1(f"{name}:{q}".encode()).hexdigest(),
                                         16) % 2 else "report"
                    counts[half, name, "queries"] += 1
                    counts[half, name, "alone"] += gold in [
                        h.path for h in idx.search(q, k=5, group="file")]
                    union = [(h, str(j.root)) for j in many.indexes
                             for h in j.search(q, k=MERGE_DEPTH, group="file")]
                    union.sort(key=lambda pair: -pair[0].score)
                    counts[half, name, "by_score"] += any(
                        r == str(idx.root) and h.path == gold for h, r in union[:5])
                    counts[half, name, "merged"] += any(
                        h.repo == str(idx.root) and h.path == gold
                        for h in many.search(q, k=5, group="file"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for half in ("tune", "report"):
        for name in [*chunks, "all"]:
            names = list(chunks) if name == "all" else [name]
            n = sum(counts[half, x, "queries"] for x in names)
            if not n:
                continue
            acc = {s: round(sum(counts[half, x, s] for x in names) / n, 3)
                   for s in ("alone", "by_score", "merged")}
            rows.append({"half": half, "repo": name,
                         "chunks": sum(chunks[x] for x in names), "queries": n,
                         "acc5_alone": acc["alone"], "acc5_by_fused_score": acc["by_score"],
                         "acc5_merged": acc["merged"]})
    print(table(["half", "repository", "chunks", "queries", "Acc@5 alone",
                 "together, by fused score", "together, merged", "merged - alone"],
                [[r["half"], r["repo"], r["chunks"], r["queries"], r["acc5_alone"],
                  r["acc5_by_fused_score"], r["acc5_merged"],
                  round(r["acc5_merged"] - r["acc5_alone"], 3)] for r in rows]))
    path = write_json("multi_repo", {"trees": commits, "per_repo": args.per_repo,
                                     "seed": args.seed, "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
