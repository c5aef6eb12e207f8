"""`definition(name)` in every language, against an independent parser: Universal Ctags.

    python bench/definitions_multilang.py --data DIR [--per-repo N]

Trees: the multi-language benchmark's (bench/multilang_build.py, built into `--data`),
copied so that each gets its own client state, filled by the indexer's components without
embedding (bench/agent_tools.py `_fill_state`). Ground truth from `ctags` (not tree-sitter):
every class, function, method, type, struct, interface, enum, trait, module it tags in the
code files codeveil indexes (a grammar language), kept where the name is tagged exactly once
in the repo; N of those sampled per repository (seeded). A lookup is right when its first
candidate is that file and its lines hold the line ctags gives. Languages ctags does not
parse here (Swift, Scala) are left out and said so. Writes bench/results/
definitions_multilang.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import isolate, table, write_json
from bench.agent_tools import _fill_state
from bench.multilang_build import is_built, load, read_pins, tree_path

KINDS = frozenset({"class", "function", "method", "type", "struct", "interface", "enum",
                   "trait", "module", "typedef", "func", "singletonMethod", "implementation",
                   "union", "namespace", "object", "protocol", "subroutine", "macro"})
PER_REPO = 15
NAME = re.compile(r"[A-Za-z_$][\w$]*(?:[.:][A-Za-z_$][\w$]*)*[?!]?")
ANONYMOUS = ("AnonymousFunction", "__anon")
UNPARSED = frozenset({"swift", "scala"})  # no ctags parser for them in this build


def ctags_definitions(root: Path, indexed: set[str]) -> list[tuple[str, str, int, str]]:
    """(name, path, line, language) of each definition ctags tags in the indexed files."""
    proc = subprocess.run(["ctags", "-R", "--output-format=json", "--fields=+nKl", "-f", "-",
                           "."], cwd=root, capture_output=True, text=True, check=False)
    out = []
    for line in proc.stdout.splitlines():
        try:
            tag = json.loads(line)
        except ValueError:
            continue
        path = tag.get("path", "").removeprefix("./")
        if tag.get("_type") == "tag" and path in indexed and tag.get("kind") in KINDS:
            out.append((tag["name"], path, int(tag.get("line", 0)), tag.get("language", "")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--per-repo", type=int, default=PER_REPO)
    args = ap.parse_args()
    pins = read_pins()
    if not is_built(args.data, pins):
        raise SystemExit(f"build the benchmark first: python bench/multilang_build.py "
                         f"--data {args.data}")
    pins, _ = load(args.data)
    isolate()
    from indexer.languages import GRAMMAR_LANGUAGES, language_for_path
    from indexer.walk import walk_repo
    from retrieval.agent.agent_tools import AgentTools

    work = Path(tempfile.mkdtemp(prefix="codeveil-defs-"))
    rows, misses = [], []
    try:
        for pin in pins:
            if pin.language in UNPARSED:
                continue
            root = shutil.copytree(tree_path(args.data, pin.repo),
                                   work / pin.repo.replace("/", "+"))
            build_s, _files = _fill_state(root)
            # Code files only: ctags also tags JSON keys, Makefile variables and CSS rules.
            indexed = {f.path for f in walk_repo(root).files
                       if language_for_path(f.path) in GRAMMAR_LANGUAGES}
            truth = ctags_definitions(root, indexed)
            counts = Counter(name for name, *_ in truth)
            # Names a person would ask for: ctags also tags anonymous functions and
            # lambdas under made-up names, and shell assignments with their `=`.
            unique = sorted(d for d in truth if counts[d[0]] == 1 and len(d[0]) > 2
                            and NAME.fullmatch(d[0]) and not d[0].startswith(ANONYMOUS))
            sample = random.Random(pin.repo).sample(unique, min(args.per_repo, len(unique)))
            tools = AgentTools(root)
            right, times = 0, []
            for name, path, line, _lang in sample:
                t0 = time.perf_counter()
                hits = tools.definition(name, limit=1)
                times.append(time.perf_counter() - t0)
                if hits and hits[0].path == path and hits[0].start_line <= line <= hits[0].end_line:
                    right += 1
                elif len(misses) < 40:
                    misses.append({"repo": pin.repo, "name": name, "want": f"{path}:{line}",
                                   "got": f"{hits[0].path}:{hits[0].start_line}-"
                                          f"{hits[0].end_line}" if hits else None})
            langs = Counter(language_for_path(p) for _, p, _, _ in sample)
            rows.append({"repo": pin.repo, "language": pin.language, "names": len(sample),
                         "right": right, "acc_at_1": right / max(len(sample), 1),
                         "p50_ms": statistics.median(times) * 1e3 if times else 0.0,
                         "state_build_s": round(build_s, 1), "name_languages": dict(langs)})
            print(f"{pin.repo:34} {pin.language:10} {right}/{len(sample)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_lang: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        by_lang[r["language"]][0] += r["right"]
        by_lang[r["language"]][1] += r["names"]
    total = sum(n for _, n in by_lang.values())
    overall = sum(k for k, _ in by_lang.values()) / max(total, 1)
    print(table(["language", "names", "Acc@1"],
                [[lang, n, k / max(n, 1)] for lang, (k, n) in sorted(by_lang.items())]
                + [["all", total, overall]]))
    write_json("definitions_multilang", {
        "ground_truth": "Universal Ctags " + subprocess.run(
            ["ctags", "--version"], capture_output=True, text=True).stdout.split(",")[0],
        "left_out_languages": sorted(UNPARSED), "acc_at_1": overall, "names": total,
        "by_language": {lang: {"names": n, "acc_at_1": k / max(n, 1)}
                        for lang, (k, n) in sorted(by_lang.items())},
        "repos": rows, "misses": misses,
    })


if __name__ == "__main__":
    main()
