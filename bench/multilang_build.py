"""The multi-language dev benchmark, built from what people wrote in public repositories.

    python bench/multilang_build.py --data DIR [--mirrors DIR] [--pin]

Each repository of `bench/multilang_repos.tsv` (owner/name, the commit it is pinned to, its
main language, its half) is exported from its git mirror at that commit, and three kinds of
queries are drawn from it, seeded by the repository's name so a rebuild draws the same ones:

1. symbol: a class, function or type name defined in exactly one code file (read with the
   chunker's own definitions); that file is gold.
2. doc: the first sentence of a doc comment or docstring (CodeSearchNet's construction);
   the defining file is gold, and the comment is cut out of the indexed tree so its words
   cannot be matched back.
3. commit: the subject line of a commit that touched 1-3 non-test code files that still
   exist at the pinned commit; those files are gold. The tree searched is the pinned one,
   not the commit's parent: one tree per repository keeps the embedding work bounded, at
   the cost of the gold files already holding the change (and what came after it).
4. module: the first sentence of the comment a code file opens with (a Python module
   docstring, a Go package comment, Rust's `//!`, a JSDoc or file header that is not a
   license); the file is gold and the comment is cut out. What "what is X for" and
   "how does X work" questions look like when people write them. Drawn with a generator
   of its own, so the other kinds' queries are the ones drawn before it existed.

The split is by repository: the first byte of sha256(owner/name), even is tune, odd is
report (`half_of`). Settings are chosen on tune; numbers are published from report.

Nothing drawn here is committed: queries and trees are rebuilt from the mirrors into
`--data` (`trees/<owner+name>/`, `queries.jsonl`). `--pin` writes the TSV from the mirrors'
current HEADs (for adding a repository; the pins are what make a rebuild identical).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIRRORS, ROOT, mirror_git_dir, unpack_mirror

REPOS_FILE = ROOT / "bench" / "multilang_repos.tsv"
KINDS = ("symbol", "doc", "commit", "module")
PER_KIND = {"symbol": 8, "doc": 8, "commit": 8, "module": 8}
MIN_SYMBOL_CHARS = 6
DOC_WORDS = (4, 30)
COMMIT_WORDS = (3, 20)
COMMITS_SCANNED = 3000

# The repositories, by main language (at least two per language where a small, well-known
# one exists). Chosen for size (a few hundred files at most, so the whole set embeds in
# well under an hour) and for a real commit history.
REPOS = (
    "pallets/itsdangerous", "python-attrs/attrs", "jazzband/tablib",
    "koajs/koa", "node-fetch/node-fetch", "nvm-sh/nvm",
    "sindresorhus/ky", "pmndrs/zustand", "unjs/h3", "unjs/ofetch", "pmndrs/jotai",
    "urfave/cli", "spf13/pflag", "go-chi/chi",
    "dtolnay/anyhow", "rust-lang/log", "tokio-rs/bytes",
    "square/javapoet", "google/gson",
    "DaveGamble/cJSON",
    "CLIUtils/CLI11", "gabime/spdlog",
    "serilog/serilog", "commandlineparser/commandline",
    "rack/rack", "thoughtbot/factory_bot", "jnunemaker/httparty",
    "slimphp/Slim", "guzzle/psr7", "Seldaek/monolog", "thephpleague/flysystem",
    "ajalt/clikt", "square/moshi",
    "SwiftyJSON/SwiftyJSON", "apple/swift-argument-parser",
    "scopt/scopt", "com-lihaoyi/os-lib", "com-lihaoyi/fastparse",
    "bats-core/bats-core",
    "Olivine-Labs/busted", "nvim-lua/plenary.nvim", "folke/lazy.nvim",
)


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    language: str
    half: str


@dataclass(frozen=True)
class Query:
    repo: str
    kind: str
    text: str
    gold: tuple[str, ...]
    language: str  # of the gold file(s): the language a query is counted under
    symbol: str = ""


def half_of(repo: str) -> str:
    return "tune" if hashlib.sha256(repo.encode()).digest()[0] % 2 == 0 else "report"


def git(repo: str, mirrors: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror_git_dir(repo, mirrors)), *args],
                          capture_output=True, text=True, check=True).stdout


def read_pins(path: Path = REPOS_FILE) -> list[Pin]:
    pins = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            repo, commit, language, half = line.split("\t")
            pins.append(Pin(repo, commit, language, half))
    return pins


def write_pins(mirrors: Path, path: Path = REPOS_FILE) -> list[Pin]:
    from indexer.languages import GRAMMAR_LANGUAGES, language_for_path

    pins = []
    for repo in REPOS:
        commit = git(repo, mirrors, "rev-parse", "HEAD").strip()
        langs = Counter(language_for_path(p) for p in
                        git(repo, mirrors, "ls-tree", "-r", "--name-only", commit).splitlines())
        language = max((n, lang) for lang, n in langs.items() if lang in GRAMMAR_LANGUAGES)[1]
        pins.append(Pin(repo, commit, language, half_of(repo)))
    lines = ["# owner/name\tcommit\tmain language\thalf (sha256(owner/name)[0] even: tune)"]
    lines += ["\t".join((p.repo, p.commit, p.language, p.half)) for p in pins]
    path.write_text("\n".join(lines) + "\n")
    return pins


# -- doc comments -----------------------------------------------------------------------

_SLASH_COMMENT = re.compile(r"^\s*(///?|/\*\*?|\*(?!/)|\*/)")
_HASH_COMMENT = re.compile(r"^\s*#(?!!)")
_DASH_COMMENT = re.compile(r"^\s*--")
_COMMENT_OF = {"ruby": _HASH_COMMENT, "bash": _HASH_COMMENT, "lua": _DASH_COMMENT}
_DOCSTRING_OPEN = re.compile(r'^\s*[rRuU]?("""|\'\'\')')
_ATTRIBUTE = re.compile(r"^\s*(@\w|#\[|\[\w)")  # decorators, Rust/C# attributes


@dataclass(frozen=True)
class DocComment:
    first: int  # 1-based lines of the comment, inclusive
    last: int
    sentence: str


def _clean_comment(lines: list[str]) -> str:
    out = []
    for line in lines:
        s = line.strip()
        s = re.sub(r'^(//!|///?|/\*\*?|\*/|\*|#+|--+|[rRuU]?"""|[rRuU]?\'\'\')\s?', "", s)
        s = re.sub(r'(\*/|"""|\'\'\')\s*$', "", s).strip()
        if s.startswith(("@", ":param", ":return", ":raises", "Args:", "Returns:", "<")):
            break  # tags and sections end the summary
        out.append(s)
    text = " ".join(out)
    text = re.sub(r"\s+", " ", text).strip()
    return text


def first_sentence(lines: list[str]) -> str:
    # The summary ends at the first blank line, then at the first full stop.
    para: list[str] = []
    for line in lines:
        if _clean_comment([line]) == "" and para:
            break
        para.append(line)
    text = _clean_comment(para)
    m = re.search(r"(?<=[.!?])\s", text)
    return (text[: m.start()] if m else text).strip()


def doc_comment(lines: list[str], start: int, language: str) -> DocComment | None:
    """The doc comment of the definition starting on 1-based line `start`: a docstring
    just inside it (Python), or the comment block just above it (and its attributes)."""
    if language == "python":
        i = start  # the line after the `def`/`class` line (0-based index `start`)
        while i < len(lines) and not lines[i - 1].rstrip().endswith(":"):
            i += 1  # a signature over several lines
        if i >= len(lines) or not _DOCSTRING_OPEN.match(lines[i]):
            return None
        quote = _DOCSTRING_OPEN.match(lines[i]).group(1)  # type: ignore[union-attr]
        j = i
        rest = lines[i].split(quote, 1)[1]
        if quote not in rest:
            j += 1
            while j < len(lines) and quote not in lines[j]:
                j += 1
        if j >= len(lines):
            return None
        return DocComment(i + 1, j + 1, first_sentence(lines[i : j + 1]))
    i = start - 2  # 0-based index of the line above the definition
    while i >= 0 and _ATTRIBUTE.match(lines[i]):
        i -= 1
    last = i
    comment = _COMMENT_OF.get(language, _SLASH_COMMENT)
    while i >= 0 and lines[i].strip() and comment.match(lines[i]):
        i -= 1
    if last - i == 0:
        return None
    block = lines[i + 1 : last + 1]
    return DocComment(i + 2, last + 1, first_sentence(block))


_LICENSE = re.compile(r"licen[cs]e|copyright|\(c\)|spdx|all rights reserved", re.I)
_SHEBANG_OR_TAG = re.compile(r"^\s*(#!|//go:build|// \+build|#\s*-\*-|# ?frozen_string_literal"
                             r"|#\s*(encoding|coding)[:=]|<\?php|'use strict'|\"use strict\")")


def module_comment(lines: list[str], language: str, def_starts: set[int]) -> DocComment | None:
    """The comment a file opens with, saying what the module is for: a Python module
    docstring, else the first comment block at the top (after a shebang, build tags or
    `<?php`), when it is not a license and not the doc comment of the definition right
    below it (a Go package comment sits above `package`, which defines nothing)."""
    i = 0
    while i < len(lines) and (not lines[i].strip() or _SHEBANG_OR_TAG.match(lines[i])):
        i += 1
    if i >= len(lines):
        return None
    if language == "python":
        if not _DOCSTRING_OPEN.match(lines[i]):
            return None
        quote = _DOCSTRING_OPEN.match(lines[i]).group(1)  # type: ignore[union-attr]
        j = i
        if quote not in lines[i].split(quote, 1)[1]:
            j += 1
            while j < len(lines) and quote not in lines[j]:
                j += 1
        if j >= len(lines):
            return None
        block, first, last = lines[i : j + 1], i + 1, j + 1
        if _LICENSE.search(" ".join(block)):
            return None
        return DocComment(first, last, first_sentence(block))
    comment = _COMMENT_OF.get(language, _SLASH_COMMENT)
    for _ in range(2):  # a license block first, then the module's own
        j = i
        if lines[i].lstrip().startswith("/*"):  # a block comment, to its end
            while j < len(lines) and "*/" not in lines[j]:
                j += 1
            j += 1
        else:
            while j < len(lines) and lines[j].strip() and comment.match(lines[j]):
                j += 1
        if j == i or j > len(lines):
            return None
        k = j
        while k < len(lines) and not lines[k].strip():
            k += 1
        block = lines[i:j]
        if not _LICENSE.search(" ".join(block)):
            if k + 1 in def_starts or (k < len(lines) and _ATTRIBUTE.match(lines[k])):
                return None  # the doc comment of the first definition
            return DocComment(i + 1, j, first_sentence(block))
        i = k
    return None


# -- the kinds -------------------------------------------------------------------------------


def _code_files(root: Path) -> dict[str, tuple[str, str]]:
    """path -> (text, language) of the non-test code files codeveil indexes."""
    from indexer.kinds import FileKind, file_kind
    from indexer.languages import GRAMMAR_LANGUAGES, language_for_path
    from indexer.walk import SourceFile, read_source, walk_repo

    out = {}
    for entry in walk_repo(root).files:
        lang = language_for_path(entry.path)
        if lang not in GRAMMAR_LANGUAGES or file_kind(entry.path) != FileKind.CODE:
            continue
        src = read_source(root, entry.path)
        if isinstance(src, SourceFile):
            out[entry.path] = (src.text, lang)
    return out


def _definitions(files: dict[str, tuple[str, str]]) -> dict[str, list]:
    from indexer.definitions import definitions_of

    return {p: definitions_of(text, lang) for p, (text, lang) in files.items()}


_SEARCHABLE_KINDS = frozenset({"class", "function", "method", "type", "struct", "enum",
                               "interface", "trait", "module"})


def symbol_queries(pin: Pin, files: dict, defs: dict, rng: random.Random) -> list[Query]:
    where: dict[str, set[str]] = defaultdict(set)
    kind_of: dict[str, str] = {}
    for path, ds in defs.items():
        for d in ds:
            where[d.names[-1]].add(path)
            kind_of.setdefault(d.names[-1], d.kind)
    names = sorted(n for n, paths in where.items()
                   if len(paths) == 1 and len(n) >= MIN_SYMBOL_CHARS
                   and kind_of[n] in _SEARCHABLE_KINDS and not n.startswith("_")
                   and not n.lower().startswith("test"))
    rng.shuffle(names)
    out = []
    for n in names[: PER_KIND["symbol"]]:
        (path,) = where[n]
        out.append(Query(pin.repo, "symbol", n, (path,), files[path][1], n))
    return out


def doc_queries(pin: Pin, files: dict, defs: dict, rng: random.Random
                ) -> tuple[list[Query], dict[str, list[tuple[int, int]]]]:
    """Queries, and per file the line ranges to cut from the indexed tree."""
    found = []
    for path in sorted(defs):
        text, lang = files[path]
        lines = text.splitlines()
        for d in defs[path]:
            if d.kind not in _SEARCHABLE_KINDS:
                continue
            doc = doc_comment(lines, d.start_line, lang)
            if doc is None:
                continue
            n_words = len(doc.sentence.split())
            if DOC_WORDS[0] <= n_words <= DOC_WORDS[1] and re.search(r"[a-zA-Z]{3}", doc.sentence):
                found.append((path, d, doc))
    rng.shuffle(found)
    out, cuts = [], defaultdict(list)
    seen_sentences: set[str] = set()
    for path, d, doc in found:
        if len(out) >= PER_KIND["doc"] or doc.sentence.lower() in seen_sentences:
            continue
        seen_sentences.add(doc.sentence.lower())
        out.append(Query(pin.repo, "doc", doc.sentence, (path,), files[path][1], d.symbol))
        cuts[path].append((doc.first, doc.last))
    return out, cuts


def module_queries(pin: Pin, files: dict, defs: dict, taken: set[str], rng: random.Random
                   ) -> tuple[list[Query], dict[str, list[tuple[int, int]]]]:
    """What a module is for: the first sentence of the comment a file opens with (its
    docstring, package comment, `//!` or file header), cut from the tree; the file is gold.
    `taken`: sentences other queries already use."""
    found = []
    for path in sorted(files):
        text, lang = files[path]
        doc = module_comment(text.splitlines(), lang, {d.start_line for d in defs[path]})
        if doc is None:
            continue
        n_words = len(doc.sentence.split())
        if (DOC_WORDS[0] <= n_words <= DOC_WORDS[1] and re.search(r"[a-zA-Z]{3}", doc.sentence)
                and "://" not in doc.sentence and doc.sentence.lower() not in taken):
            found.append((path, doc))
    rng.shuffle(found)
    out, cuts = [], defaultdict(list)
    for path, doc in found:
        if len(out) >= PER_KIND["module"] or doc.sentence.lower() in taken:
            continue
        taken.add(doc.sentence.lower())
        out.append(Query(pin.repo, "module", doc.sentence, (path,), files[path][1]))
        cuts[path].append((doc.first, doc.last))
    return out, cuts


_SUBJECT_NOISE = re.compile(r"^(merge|bump|release|revert|v?\d+\.\d+|chore\(deps|update "
                            r"(dependencies|deps|changelog|readme)|prepare|version)", re.I)


def commit_queries(pin: Pin, mirrors: Path, files: dict, rng: random.Random) -> list[Query]:
    log = git(pin.repo, mirrors, "log", "--no-merges", f"-n{COMMITS_SCANNED}", "--no-renames",
              "--name-only", "--format=%x00%s", pin.commit)
    found = []
    for entry in log.split("\x00")[1:]:
        subject, *paths = [x for x in entry.splitlines() if x.strip()]
        subject = re.sub(r"\s*\(#\d+\)\s*$", "", subject).strip()
        subject = re.sub(r"^\w+(\([\w./-]+\))?!?:\s*", "", subject)  # conventional prefix
        if not paths or len(paths) > 3 or _SUBJECT_NOISE.match(subject):
            continue
        if not all(p in files for p in paths):
            continue  # a test, doc or config file, or one gone since
        if not COMMIT_WORDS[0] <= len(subject.split()) <= COMMIT_WORDS[1]:
            continue
        found.append((subject, tuple(sorted(paths))))
    seen: set[str] = set()
    unique = []
    for subject, paths in found:
        if subject.lower() not in seen:
            seen.add(subject.lower())
            unique.append((subject, paths))
    rng.shuffle(unique)
    return [Query(pin.repo, "commit", s, g, files[g[0]][1])
            for s, g in unique[: PER_KIND["commit"]]]


def cut_lines(root: Path, cuts: dict[str, list[tuple[int, int]]]) -> None:
    """Remove the given 1-based line ranges from the files of the exported tree."""
    for path, ranges in cuts.items():
        p = root / path
        lines = p.read_text(encoding="utf-8").splitlines(keepends=True)
        drop = {i for a, b in ranges for i in range(a - 1, b)}
        p.write_text("".join(line for i, line in enumerate(lines) if i not in drop),
                     encoding="utf-8")


def export(pin: Pin, mirrors: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    unpack_mirror(pin.repo, dest, mirrors, pin.commit)


def tree_path(data: Path, repo: str) -> Path:
    return data / "trees" / repo.replace("/", "+")


def build(data: Path, mirrors: Path, pins: list[Pin]) -> list[Query]:
    queries: list[Query] = []
    for pin in pins:
        root = tree_path(data, pin.repo)
        export(pin, mirrors, root)
        files = _code_files(root)
        defs = _definitions(files)
        rng = random.Random(pin.repo)
        got = symbol_queries(pin, files, defs, rng)
        docs, cuts = doc_queries(pin, files, defs, rng)
        got += docs
        got += commit_queries(pin, mirrors, files, rng)
        # Its own generator: the other kinds draw what they drew before this kind existed.
        modules, module_cuts = module_queries(
            pin, files, defs, {q.text.lower() for q in docs}, random.Random(f"{pin.repo}/module"))
        got += modules
        for path, ranges in module_cuts.items():
            cuts[path] += ranges
        cut_lines(root, cuts)
        chunk_list = data / "chunks" / (pin.repo.replace("/", "+") + ".json")
        chunk_list.unlink(missing_ok=True)  # chunked from the tree before its cuts
        queries += got
        counts = Counter(q.kind for q in got)
        print(f"{pin.repo:36} {pin.language:10} {pin.half:6} files {len(files):4}  "
              + "  ".join(f"{k} {counts[k]}" for k in KINDS), flush=True)
    with (data / "queries.jsonl").open("w") as f:
        for q in queries:
            f.write(json.dumps(asdict(q)) + "\n")
    (data / "pins.json").write_text(json.dumps([asdict(p) for p in pins]))
    (data / "kinds.json").write_text(json.dumps(KINDS))
    return queries


def load(data: Path) -> tuple[list[Pin], list[Query]]:
    pins = [Pin(**p) for p in json.loads((data / "pins.json").read_text())]
    queries = [Query(**{**q, "gold": tuple(q["gold"])})
               for q in map(json.loads, (data / "queries.jsonl").open())]
    return pins, queries


def is_built(data: Path, pins: list[Pin]) -> bool:
    try:
        built, _ = load(data)
        kinds = tuple(json.loads((data / "kinds.json").read_text()))
    except (OSError, ValueError, TypeError):
        return False
    return built == pins and kinds == KINDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--mirrors", type=Path, default=MIRRORS)
    ap.add_argument("--pin", action="store_true", help="rewrite the pins from the mirrors' HEADs")
    args = ap.parse_args()
    pins = write_pins(args.mirrors) if args.pin else read_pins()
    queries = build(args.data, args.mirrors, pins)
    by = Counter((q.kind, {p.repo: p.half for p in pins}[q.repo]) for q in queries)
    langs = {p.language for p in pins}
    print(f"{len(pins)} repositories, {len(langs)} languages, {len(queries)} queries: "
          + ", ".join(f"{k}/{h} {n}" for (k, h), n in sorted(by.items())))


if __name__ == "__main__":
    main()
