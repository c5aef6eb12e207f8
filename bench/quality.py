"""Search quality: codeveil against BM25 and plain MiniLM, with an ablation, in one run.

    python bench/quality.py --data DIR --mirrors DIR [--datasets swebench,cosqa]
        [--repos requests,flask,...] [--split FILE] [--per-half N[,REPO=M]] [--per-repo N]
        [--ids FILE] [--cosqa-limit N] [--stage plan|warm|eval|all] [--header-ablation LIST]
        [--threads N] [--e2e N] [--latency CHUNKS] [--embedder NAME] [--no-plot]

SWE-bench instances come from the tune/report split `bench/swebench_split.tsv` (rule in
`bench/swebench_split.py`): settings are chosen on the tune half, numbers are published
from the report half, and the tables are printed for each half. `--per-half N` keeps the
first N instances of each repo's half in the split file's order (a fixed subset).

SWE-bench Verified and Lite (dev): issue text -> the files its fix edited; file-level Acc@1/3/5/10
(share of issues with a gold file among the top k distinct files). CoSQA (dev): web query
-> one function of a 6,267-function corpus (each function a file `corpus/<id>.py`);
MRR (rank cut at 100) and Recall@1/10, for each half of its dev queries (the same rule as the
SWE-bench split, over the query ids: `cosqa_halves`).

Systems, all over the same files (the ones `indexer.walk` keeps):

- BM25 files: `bm25s` over whole files, its own tokenizer, English stop words.
- MiniLM windows: all-MiniLM-L6-v2 over 40-line windows, the model's own truncation for
  windows and query, a file ranked by its best window.
- codeveil, built up one piece at a time (the ablation): syntax chunks embedded with
  their `path > symbol` header (`--header-ablation`: also without it, the lines alone);
  a long query split into parts; BM25 over the chunks fused by RRF; evidence from what
  the query names; then the fusion and file aggregation choices.
  These run the production ranking code (`retrieval.search.fusion.HybridRanker`,
  `retrieval.search.grouping`) over plain vectors in memory; `--e2e N` also runs N instances
  through `Index.search` (encrypted store, DCPE vectors) to show the same numbers hold.

Data lives under `--data` (never inside the project): `trees/` (exported repos, one
folder per commit), `chunks/` (chunk boundaries per commit), `cache/` (the embedding
cache: every text is embedded once, whatever the run). Missing trees are exported from
bare git mirrors under `--mirrors` (`<owner>+<name>/repo`) with the dataset's
`materialize.sh`. Prints tables; writes bench/results/quality.json and quality.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import RESULTS, save_figure, table, write_json

log = logging.getLogger("bench.quality")

SHARED = Path("/work/shared/bench")
REPO_NAMES = {
    "requests": "psf/requests", "flask": "pallets/flask", "pytest": "pytest-dev/pytest",
    "xarray": "pydata/xarray", "sphinx": "sphinx-doc/sphinx", "pylint": "pylint-dev/pylint",
    "astropy": "astropy/astropy", "seaborn": "mwaskom/seaborn", "sqlfluff": "sqlfluff/sqlfluff",
    "pvlib": "pvlib/pvlib-python", "astroid": "pylint-dev/astroid", "pydicom": "pydicom/pydicom",
    "marshmallow": "marshmallow-code/marshmallow",
}
HALVES = ("tune", "report")
WINDOW_LINES = 40
DEPTH_FILES = 50
ACC_KS = (1, 3, 5, 10)


# -- embedders ----------------------------------------------------------------------


def _embedders(name: str | None, threads: int | None = None):
    """(codeveil's cached embedder, plain truncating cached embedder). Imported late so
    that --data can point the embedding cache before it is opened. `name` pins an
    embedder of `indexer.embedder_registry.EMBEDDERS` (default: the one `codeveil index` uses)."""
    from indexer.embed_cache import CachedEmbedder, EmbeddingCache
    from indexer.embedder import Embedder, SentenceTransformerEmbedder
    from indexer.embedder_registry import EMBEDDERS, default_embedder

    if threads and (name or "minilm").startswith("minilm"):
        from indexer.embedder_registry import minilm_embedder

        name = name or "minilm"
        model = (SentenceTransformerEmbedder(threads=threads) if name == "minilm-torch"
                 else minilm_embedder("fp32" if name == "minilm-onnx" else "int8",
                                      threads=threads))
    else:
        model = EMBEDDERS[name]() if name else default_embedder()

    class Plain(Embedder):
        """The same model used the plain way: one text, one vector, truncated at the
        window by sentence-transformers (what a naive integration does)."""

        def __init__(self) -> None:
            self.model_id = model.model_id + ":truncate"
            self.dim = model.dim
            self.max_tokens = model.max_tokens

        def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
            if isinstance(model, SentenceTransformerEmbedder):
                return model.embed_batch(texts)  # sentence-transformers truncates
            # The ONNX backends refuse over-long texts: cut them at the window instead.
            return model.embed_batch([model.windows(t)[0] for t in texts])

    cache = EmbeddingCache()
    return CachedEmbedder(model, cache), CachedEmbedder(Plain(), cache)


EMBED_BATCH = 256


def embed_all(embedder, texts: Sequence[str], what: str) -> np.ndarray:
    """Vectors of `texts` through the cache, stored batch by batch so that a long run
    that is stopped keeps what it embedded."""
    t0 = time.perf_counter()
    parts = []
    embedded = 0
    for start in range(0, len(texts), EMBED_BATCH):
        out = embedder.embed(list(texts[start : start + EMBED_BATCH]))
        parts.append(out.vectors)
        embedded += out.embedded
    if embedded:
        log.info("  %s: %d texts, %d embedded in %.0fs", what, len(texts), embedded,
                 time.perf_counter() - t0)
    dim = embedder.dim
    return np.concatenate(parts) if parts else np.zeros((0, dim), dtype=np.float32)


class EmbedPlan:
    """What a run would embed, counted before it does: per repo the distinct texts (each
    counted where the run first meets it, as the cache will), those the cache lacks, and
    their word pieces; then a random sample of the lacking texts embedded and timed, so
    that the hours a warm run takes are measured, not guessed."""

    SAMPLE = 320
    COUNTS = ("instances", "versions", "texts", "pieces", "lacking_texts", "lacking_pieces")

    def __init__(self, enc, plain) -> None:
        from indexer.tokens import default_counter

        self.enc = enc
        self.embedders = {"codeveil": enc, "plain": plain}
        self.counter = default_counter()
        self.seen: set[bytes] = set()
        self.repos: dict[str, dict[str, int]] = {}
        self.sample: list[tuple[str, str, int]] = []  # (embedder, text, word pieces)
        self.lacking = 0
        self.rng = random.Random(0)

    def add(self, repo: str, corpus: Corpus, queries: Sequence[str], *,
            formats: Sequence[str], instances: int) -> None:
        from indexer.embed_cache import cache_key

        row = self.repos.setdefault(repo, dict.fromkeys(self.COUNTS, 0))
        row["instances"] += instances
        row["versions"] += 1
        work = embedding_work(corpus, queries, formats, self.counter,
                              self.enc.embedder.max_tokens)
        new: list[tuple[str, bytes, str]] = []
        for what, texts in work.items():
            which = "plain" if what.startswith("plain") else "codeveil"
            model_id = self.embedders[which].model_id
            for t in texts:
                key = cache_key(model_id, t)
                if key not in self.seen:
                    self.seen.add(key)
                    new.append((which, key, t))
        known = self.enc.cache.known([k for _, k, _ in new])
        cost = self.pieces(new)
        row["texts"] += len(new)
        row["pieces"] += sum(cost)
        for (which, key, text), n in zip(new, cost, strict=True):
            if key in known:
                continue
            row["lacking_texts"] += 1
            row["lacking_pieces"] += n
            # Reservoir sampling: every lacking text of the run equally likely.
            self.lacking += 1
            if len(self.sample) < self.SAMPLE:
                self.sample.append((which, text, n))
            elif (j := self.rng.randrange(self.lacking)) < self.SAMPLE:
                self.sample[j] = (which, text, n)

    def pieces(self, items: Sequence[tuple[str, bytes, str]]) -> list[int]:
        """Word pieces the model runs over for each text, [CLS]/[SEP] included: the plain
        baseline truncates at the window; codeveil embeds every window of a long text."""
        window = self.enc.embedder.max_tokens
        counts = self.counter.count_batch([t for _, _, t in items])
        return [min(n, window) + 2 if which == "plain" else n + 2 * max(1, -(-n // window))
                for (which, _, _), n in zip(items, counts, strict=True)]

    def report(self, threads: int | None) -> dict:
        """The counts, and the embedding rate measured on the sample (word pieces per
        second), hence the hours each repo's lacking texts take."""
        rate = None
        if self.sample:
            for embedder in self.embedders.values():  # load the model before the clock starts
                embedder.embedder.embed(["warm up"])
            t0 = time.perf_counter()
            for which, embedder in self.embedders.items():
                texts = [t for w, t, _ in self.sample if w == which]
                if texts:
                    embed_all(embedder, texts, f"timed sample ({which})")
            rate = sum(n for *_, n in self.sample) / (time.perf_counter() - t0)
        total = {k: sum(r[k] for r in self.repos.values()) for k in self.COUNTS}
        for row in [*self.repos.values(), total]:
            row["hours"] = row["lacking_pieces"] / rate / 3600 if rate else 0.0
        return {"threads": threads, "pieces_per_second": rate, "sample": len(self.sample),
                "repos": self.repos, "total": total}

    @staticmethod
    def table(report: dict) -> str:
        rate = report["pieces_per_second"]
        head = (f"\nWhat the run embeds: distinct texts, those the cache lacks, and the hours "
                f"they take at {rate or 0:,.0f} word pieces/s (measured on {report['sample']} "
                f"lacking texts, {report['threads'] or 'default'} thread(s))")
        rows = [[repo, r["instances"], r["versions"], f"{r['texts']:,}",
                 f"{r['lacking_texts']:,}", f"{r['lacking_pieces'] / 1e6:.1f}",
                 f"{r['hours']:.2f}"]
                for repo, r in [*report["repos"].items(), ("total", report["total"])]]
        return head + "\n" + table(["repo", "queries", "versions", "texts", "lacking",
                                     "lacking M pieces", "hours"], rows)


# -- corpora -------------------------------------------------------------------------


@dataclass
class Corpus:
    """One repo version (or the CoSQA corpus as a repo): files and codeveil chunks."""

    name: str
    files: dict[str, str]  # path -> text
    chunks: list = field(default_factory=list)  # indexer.chunk.Chunk
    _windows: list[tuple[str, str]] | None = field(default=None, repr=False)

    def windows(self) -> list[tuple[str, str]]:
        """(path, text) of 40-line windows of every file (the plain baseline's unit),
        cut once per corpus."""
        if self._windows is not None:
            return self._windows
        out = []
        for path, text in self.files.items():
            lines = text.splitlines(keepends=True)
            for start in range(0, len(lines), WINDOW_LINES):
                body = "".join(lines[start : start + WINDOW_LINES])
                if body.strip():
                    out.append((path, body))
        self._windows = out
        return out


def _chunker_fingerprint() -> str:
    """Changes whenever the chunking code does, so stale chunk caches are not used: the
    stamp the chunk table keeps (its modules, symbol names included, and grammars)."""
    from indexer.chunker_stamp import chunker_stamp

    return chunker_stamp().hex()[:16]


def load_tree(root: Path, name: str, chunk_cache: Path | None,
              include: str | None = None) -> Corpus:
    """Files of a tree as `codeveil index` would read them (those matching the glob
    `include`, if given), and their chunks."""
    import fnmatch

    from indexer.chunk import Chunk
    from indexer.chunker import chunk_file, split_lines
    from indexer.languages import language_for_path
    from indexer.walk import SourceFile, read_source, walk_repo

    files: dict[str, str] = {}
    for entry in walk_repo(root).files:
        if include and not fnmatch.fnmatch(entry.path, include):
            continue
        src = read_source(root, entry.path)
        if isinstance(src, SourceFile):
            files[entry.path] = src.text
    corpus = Corpus(name, files)
    fp = _chunker_fingerprint()
    if chunk_cache is not None and chunk_cache.exists():
        saved = json.loads(chunk_cache.read_text())
        if saved.get("fingerprint") == fp:
            lines_of = {p: split_lines(t) for p, t in files.items()}
            corpus.chunks = [
                Chunk(p, s, e, lang, sym, "".join(lines_of[p][s - 1 : e]))
                for p, s, e, lang, sym in saved["chunks"] if p in lines_of
            ]
            return corpus
    for path, text in files.items():
        corpus.chunks.extend(chunk_file(path, text, language=language_for_path(path)))
    if chunk_cache is not None:
        chunk_cache.parent.mkdir(parents=True, exist_ok=True)
        chunk_cache.write_text(json.dumps({
            "fingerprint": fp,
            "chunks": [[c.path, c.start_line, c.end_line, c.language, c.symbol]
                       for c in corpus.chunks],
        }))
    return corpus


def cosqa_corpus(path: Path) -> Corpus:
    from indexer.chunker import chunk_file

    files = {}
    for line in path.open():
        row = json.loads(line)
        files[f"corpus/{row['doc_id']}.py"] = row["code"] if row["code"].endswith("\n") \
            else row["code"] + "\n"
    corpus = Corpus("cosqa", files)
    for p, text in files.items():
        corpus.chunks.extend(chunk_file(p, text, language="python"))
    return corpus


# -- systems -------------------------------------------------------------------------


class Memo:
    """A `retrieval.indexes.lexical.Tokenizer` that remembers whole texts: repo versions share
    most of their chunks, so each distinct chunk is tokenized once per run."""

    def __init__(self) -> None:
        from retrieval.indexes.lexical import Tokenizer

        self.tok = Tokenizer()
        self.memo: dict[str, tuple] = {}

    def counts(self, text: str):
        got = self.memo.get(text)
        if got is None:
            got = self.memo[text] = self.tok.counts(text)
        return got


def lexical_index(docs: Sequence, texts: Sequence[str], memo: Memo):
    """A LexicalIndex over (ChunkLocation, text) pairs, tokenizing through `memo`."""
    from retrieval.indexes.lexical import LexicalIndex
    from retrieval.indexes.lexical.combine import assemble
    from retrieval.indexes.lexical.segments import _Counts

    counts = _Counts()
    for d, t in zip(docs, texts, strict=True):
        counts.add(d, memo.counts(t))
    return LexicalIndex(assemble(counts, None, 1.2, 0.75), tokenizer=memo.tok)


class VectorIndex:
    """Exact cosine search over plain vectors (what the store does, minus encryption)."""

    def __init__(self, docs: Sequence, vectors: np.ndarray) -> None:
        self.docs = list(docs)
        self.m = vectors

    headers = False  # one plane: the ranker casts no header vote from it

    def nearest_each(self, vs: np.ndarray, n: int, *, keep=None, header: bool = False):
        return [self.nearest(v, n, keep=keep) for v in vs]

    def nearest(self, v: np.ndarray, n: int, *, keep=None):
        s = self.m @ v.astype(np.float32)
        if keep is not None:  # not used by the benchmark's queries
            s = np.where([keep(d) for d in self.docs], s, -np.inf)
        n = min(n, len(s))
        top = np.argpartition(-s, n - 1)[:n]
        top = top[np.argsort(-s[top], kind="stable")]
        return [(self.docs[i], float(s[i])) for i in top]


def files_from_windows(hits: Iterable[tuple[str, float]], limit: int) -> list[str]:
    """Distinct paths in the order of their best window."""
    out: list[str] = []
    seen: set[str] = set()
    for path, _ in hits:
        if path not in seen:
            seen.add(path)
            out.append(path)
            if len(out) >= limit:
                break
    return out


@dataclass
class Prepared:
    """Everything a corpus needs for every system, built once."""

    corpus: Corpus
    bm25_files: Callable[[str], list[str]]
    code_bm25_files: Callable[[str], list[str]]
    windows: Callable[[str], list[str]]
    rankers: dict[str, object]  # chunk rendering -> HybridRanker over its vectors
    lexical: object
    imports: Callable[[str], list[str]]  # file -> the corpus files it imports


def embedded_first(corpus: Corpus, order: str, share: float,
                   recency: dict[str, int]) -> set[int]:
    """Indexes of the chunks a first index has embedded once `share` of them have their
    vectors: files in indexer.priority's order (`order` "priority": source, tests, then
    the rest, recently committed first) or in a random one ("random"), whole files at a
    time, as the indexer sends them. Seeded: the same chunks every run."""
    from indexer.priority import category

    files = sorted(corpus.files)
    random.Random(f"{corpus.name}:{order}").shuffle(files)
    if order == "priority":
        files.sort(key=lambda f: (category(f), -recency.get(f, 0)))
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(corpus.chunks):
        by_file[c.path].append(i)
    picked: set[int] = set()
    for f in files:
        if len(picked) >= share * len(corpus.chunks):
            break
        picked.update(by_file.get(f, ()))
    return picked


def mirror_recency(mirrors: Path | None, repo: str, commit: str) -> dict[str, int]:
    """indexer.priority.git_recency of the repo as it stood at `commit`, read from its
    mirror (the benchmark's trees are exported without their history)."""
    if mirrors is None:
        return {}
    from indexer.priority import GIT_COMMITS, parse_recency

    git = mirrors / repo.replace("/", "+") / "repo"
    proc = subprocess.run(
        ["git", "--git-dir", str(git), "log", f"-n{GIT_COMMITS}", "--no-renames",
         "--name-only", "--format=%x00%ct", commit], capture_output=True, text=True,
        check=False)
    return parse_recency(proc.stdout)


PARTIAL_SHARE = 0.5
PARTIAL_ORDERS = ("priority", "random")


def partial_key(fmt: str, order: str) -> str:
    return f"{fmt}@{order}"


def embedding_work(corpus: Corpus, query_texts: Sequence[str], formats: Sequence[str],
                   counter, max_tokens: int) -> dict[str, list[str]]:
    """Every text `prepare` embeds for a corpus, by what it is (the key says which
    embedder: "plain ..." is the plain baseline's, the rest codeveil's)."""
    from retrieval.search.query import split_query

    parts = [p for q in query_texts
             for p in split_query(q, counter.count, max_tokens, count_many=counter.count_batch)]
    work = {
        "plain queries": list(query_texts),
        "queries": [*parts, *query_texts],
        "plain windows": [t for _, t in corpus.windows()],
        # Vectors of each chunk's header alone (`path > symbol`: a few tokens each), the
        # second vector a chunk may carry.
        "chunk headers": [c.header for c in corpus.chunks],
    }
    for fmt in formats:
        work[f"chunks ({fmt})"] = [RENDERINGS[fmt](c) for c in corpus.chunks]
    return work


def bm25_file_ranker(files: dict[str, str], depth: int) -> Callable[[str], list[str]]:
    """BM25 over whole files (path -> text), the library's defaults and English stop
    words: a query's best `depth` paths."""
    import bm25s

    paths = list(files)
    tok = bm25s.tokenize([files[p] for p in paths], stopwords="en", return_ids=False,
                         show_progress=False)
    bm = bm25s.BM25()
    bm.index(tok, show_progress=False)

    def bm25_files(q: str) -> list[str]:
        qt = bm25s.tokenize([q], stopwords="en", return_ids=False, show_progress=False)
        qt = [[t for t in qt[0] if t in bm.vocab_dict]]
        if not qt[0]:
            return []
        docs, _ = bm.retrieve(qt, k=min(depth, len(paths)), show_progress=False)
        return [paths[i] for i in docs[0]]

    return bm25_files


def prepare(corpus: Corpus, enc, plain, memo: Memo, *, formats: Sequence[str],
            query_texts: Sequence[str], recency: dict[str, int] | None = None) -> Prepared:
    from indexer.location import ChunkLocation
    from indexer.tokens import default_counter
    from retrieval.indexes.lexical import lexical_text
    from retrieval.search.fusion import HybridRanker

    counter = default_counter()
    work = embedding_work(corpus, query_texts, formats, counter, enc.embedder.max_tokens)
    # Embed every query (its parts, the whole for split "none", the plain truncation) in
    # a few batches rather than one call per query.
    embed_all(plain, work["plain queries"], "plain queries")
    embed_all(enc, work["queries"], "queries")

    paths = list(corpus.files)
    bm25_files = bm25_file_ranker(corpus.files, DEPTH_FILES)

    # BM25 over whole files with codeveil's code-aware tokens (no chunks, no vectors).
    file_docs = [ChunkLocation(p, 1, 1, "", "") for p in paths]
    code_lex = lexical_index(file_docs, [p + "\n" + corpus.files[p] for p in paths], memo)

    def code_bm25_files(q: str) -> list[str]:
        return [paths[i] for i, _ in code_lex.top(q, DEPTH_FILES)]

    # Plain MiniLM over 40-line windows.
    wins = corpus.windows()
    wvec = embed_all(plain, work["plain windows"], "plain windows")
    wpaths = [p for p, _ in wins]

    def windows(q: str) -> list[str]:
        qv = embed_all(plain, [q], "plain query")[0]
        s = wvec @ qv
        order = np.argsort(-s, kind="stable")[: DEPTH_FILES * 20]
        return files_from_windows(((wpaths[i], s[i]) for i in order), DEPTH_FILES)

    chunks = corpus.chunks
    docs = [ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language) for c in chunks]
    lex = lexical_index(docs, [lexical_text(c) for c in chunks], memo)

    def embed_parts(parts: Sequence[str]) -> np.ndarray:
        return embed_all(enc, parts, "query parts")

    hvec = embed_all(enc, work["chunk headers"], "chunk headers")
    nearest_header = VectorIndex(docs, hvec).nearest
    rankers = {}
    from bench._common import static_embedder

    static = static_embedder()
    static_side = None
    if static is not None:  # the static tier, as `codeveil search` ranks with it
        static_side = VectorIndex(docs, static.embed([c.embed_text for c in chunks]))
    for fmt in formats:
        vectors = embed_all(enc, work[f"chunks ({fmt})"], f"chunks ({fmt})")
        rankers[fmt] = HybridRanker(lex, embed_parts, VectorIndex(docs, vectors).nearest,
                                    counter.count, enc.embedder.max_tokens,
                                    count_many=counter.count_batch,
                                    nearest_header=nearest_header)
        if static is not None:
            rankers[fmt].use_static(static_side, static.embed)
        if recency is None:
            continue
        # A first index half way: every chunk searchable by words, these by meaning too.
        for order in PARTIAL_ORDERS:
            have = sorted(embedded_first(corpus, order, PARTIAL_SHARE, recency))
            some = [docs[i] for i in have]
            rankers[partial_key(fmt, order)] = HybridRanker(
                lex, embed_parts, VectorIndex(some, vectors[have]).nearest,
                counter.count, enc.embedder.max_tokens, count_many=counter.count_batch,
                nearest_header=VectorIndex(some, hvec[have]).nearest)
    modules = module_files(corpus.files)
    import_memo: dict[str, list[str]] = {}

    def imports(path: str) -> list[str]:
        if path not in import_memo:
            import_memo[path] = imported_by(path, corpus.files.get(path, ""), modules)
        return import_memo[path]

    return Prepared(corpus, bm25_files, code_bm25_files, windows, rankers, lex, imports)


SHIPPED = "codeveil (shipped defaults)"
# (BM25 weight, peak ratio) tried for prose queries whose BM25 ranking is peaked, on the
# tune halves of CoSQA and the multi-language benchmark (SearchOptions.w_lexical_prose_peaked).
PEAK_GRID = ((0.5, 1.5), (0.5, 2.0), (0.5, 3.0), (1.0, 1.2), (1.0, 1.3), (1.0, 1.5),
             (1.0, 1.75), (1.0, 3.0), (1.5, 1.5), (2.0, 1.5), (2.0, 2.0))
# The ranking before the signals chosen on bench/multilang.py's tune half: Python's
# names only, every kind of file alike.
# The ranking as `codeveil search` printed it before the ten were scored as printed:
# no saturation, no path vote, every file beside the implementation alike. (Programs in a
# docs folder were docs then; that rule lives in indexer.kinds and is not switched here.)
PRINTED_BEFORE = {"saturation": 1.0, "file_first": False, "w_path": 0.0, "w_secondary": 1.0}
BEFORE_MULTILANG = {"identifier_refs": False, "w_non_code": 1.0,
                    "w_lexical_prose_peaked": None}


# What the model reads of a chunk: what `codeveil index` embeds (`Chunk.embed_text`,
# the `path > symbol` header line, then the lines), and the lines alone (the ablation).
RENDERINGS: dict[str, Callable] = {
    "header": lambda c: c.embed_text,
    "lines": lambda c: c.text,
}
SHIPPED_RENDERING = "header"


def renderings(ablation: bool) -> list[str]:
    """The chunk renderings to embed: the shipped one first, and with `ablation` the rest."""
    return [SHIPPED_RENDERING, *(f for f in RENDERINGS if ablation and f != SHIPPED_RENDERING)]


def codeveil_variants(ablation: bool) -> list[tuple[str, str, dict, str]]:
    """(name, chunk rendering, SearchOptions fields, file aggregation) of the codeveil rows.

    First the ablation ladder, each row adding one piece (options spelled out, so the
    ladder does not move when defaults change); then the shipped defaults; then the
    defaults with one choice changed. With `ablation`, also the rows of the other chunk
    rendering (`RENDERINGS`)."""
    from retrieval.search.grouping import DEFAULT_AGG

    agg = DEFAULT_AGG["file"]
    step = {"hybrid": False, "evidence": False, "split": "first", "w_file_lexical": 0.0,
            "w_lexical_prose": None, "max_query_terms": None, "w_lexical": 0.5,
            "stopwords": False, "code_term_weight": 1, "w_first_part": 1.0,
            "w_header_vector": 0.0, "w_header_vector_prose": 0.0,
            "w_lexical_prose_peaked": None}
    ladder = [
        ("chunks+header, vector, query cut", {}, "max"),
        ("+ whole query (windows averaged)", {"split": "none"}, "max"),
        ("+ query split (rrf)", {"split": "rrf"}, "max"),
        ("+ BM25 fusion", {"hybrid": True}, "max"),
        ("+ BM25 weight 0.25 for prose queries", {"w_lexical_prose": 0.25}, "max"),
        ("+ evidence", {"evidence": True}, "max"),
        ("+ file agg topm", {}, "topm"),
        ("+ BM25 over the 32 rarest query terms", {"max_query_terms": 32}, "topm"),
        ("+ BM25 weight 1", {"w_lexical": 1.0}, "topm"),
        ("+ BM25 stop words, code words x2", {"stopwords": True, "code_term_weight": 2},
         "topm"),
        (f"+ file agg {agg}", {}, agg),
        ("+ first part weight 2", {"w_first_part": 2.0}, agg),
        ("+ header vector 0.5", {"w_header_vector": 0.5}, agg),
        ("+ header vector 1", {"w_header_vector": 1.0}, agg),
        ("+ full BM25 vote for peaked prose rankings", {"w_lexical_prose_peaked": 1.0}, agg),
    ]
    fmt, *other = renderings(ablation)
    rows: list[tuple[str, str, dict, str]] = []
    for n, (name, change, a) in enumerate(ladder):
        step = {**step, **change}
        rows.append((name, fmt, dict(step), a))
        if n == 0:
            rows += [("chunks, no header, vector, query cut", o, dict(step), a) for o in other]
    rows.append((SHIPPED, fmt, {}, agg))
    rows.append(("defaults, before the multi-language signals", fmt, dict(BEFORE_MULTILANG), agg))
    rows.append(("defaults, prose BM25 weight whatever its ranking's shape", fmt,
                 {"w_lexical_prose_peaked": None}, agg))
    rows += [(f"defaults, peaked prose BM25 {w} at ratio {r}", fmt,
              {"w_lexical_prose_peaked": w, "prose_peak_ratio": r}, agg)
             for w, r in PEAK_GRID]
    rows.append(("defaults, prose BM25 weight 1.0", fmt, {"w_lexical_prose": 1.0}, agg))
    rows += [(f"defaults, vector weight {w}", fmt, {"w_vector": w}, agg) for w in (0.5, 0.25)]
    rows += [("defaults, no header", o, {}, agg) for o in other]
    rows += [("defaults, no BM25", fmt, {"hybrid": False}, agg)]
    rows += [(f"defaults, file agg {a}", fmt, {}, a)
             for a in ("max", "sum", "topm", "decay", "rrf") if a != agg]
    rows += [
        ("defaults, split max", fmt, {"split": "max"}, agg),
        ("defaults, split mean", fmt, {"split": "mean"}, agg),
        ("defaults, split none", fmt, {"split": "none"}, agg),
        ("defaults, first part weight 1", fmt, {"w_first_part": 1.0}, agg),
        ("defaults, rrf k=60", fmt, {"rrf_k": 60.0}, agg),
        ("defaults, BM25 weight 0.25", fmt, {"w_lexical": 0.25}, agg),
        ("defaults, BM25 weight 1", fmt, {"w_lexical": 1.0}, agg),
        ("defaults, BM25 weight 0.5", fmt, {"w_lexical": 0.5}, agg),
        ("defaults, prose queries' BM25 weight 0.5", fmt, {"w_lexical_prose": None}, agg),
        ("defaults, prose queries' BM25 weight 0.1", fmt, {"w_lexical_prose": 0.1}, agg),
        ("defaults, prose queries' BM25 weight 0", fmt, {"w_lexical_prose": 0.0}, agg),
        ("defaults, evidence weight 2", fmt, {"w_evidence": 2.0}, agg),
        ("defaults, no evidence", fmt, {"evidence": False}, agg),
        ("defaults, file BM25 weight 1", fmt, {"w_file_lexical": 1.0}, agg),
        ("defaults, file BM25 weight 0.5", fmt, {"w_file_lexical": 0.5}, agg),
        ("defaults, file BM25 weight 2", fmt, {"w_file_lexical": 2.0}, agg),
        ("defaults, depth 200", fmt, {"depth": 200}, agg),
        ("defaults, BM25 all repeats", fmt, {"dedupe_terms": False}, agg),
        ("defaults, BM25 rarest 32 terms", fmt, {"max_query_terms": 32}, agg),
        ("defaults, BM25 every query term", fmt, {"max_query_terms": None}, agg),
        ("defaults, BM25 stop words", fmt, {"stopwords": True}, agg),
        ("defaults, BM25 without stop words or code x2", fmt,
         {"stopwords": False, "code_term_weight": 1}, agg),
        ("defaults, file BM25 weight 0.25", fmt, {"w_file_lexical": 0.25}, agg),
        ("defaults, stop words, file BM25 0.25", fmt,
         {"stopwords": True, "w_file_lexical": 0.25}, agg),
        ("defaults, stop words, file BM25 0.5", fmt,
         {"stopwords": True, "w_file_lexical": 0.5}, agg),
        ("defaults, stop words, file BM25 1", fmt,
         {"stopwords": True, "w_file_lexical": 1.0}, agg),
        ("defaults, BM25 code words x2", fmt, {"code_term_weight": 2}, agg),
        ("defaults, stop words, code words x2", fmt,
         {"stopwords": True, "code_term_weight": 2}, agg),
        ("defaults, stop words, code x2, file BM25 0.5", fmt,
         {"stopwords": True, "code_term_weight": 2, "w_file_lexical": 0.5}, agg),
        ("defaults, file agg decay, file BM25 0.25", fmt, {"w_file_lexical": 0.25}, "decay"),
        ("defaults, BM25 weight 1, file BM25 0.25", fmt,
         {"w_lexical": 1.0, "w_file_lexical": 0.25}, agg),
        ("defaults, no header vector", fmt,
         {"w_header_vector": 0.0, "w_header_vector_prose": 0.0}, agg),
        ("defaults, header vector 0.25", fmt, {"w_header_vector": 0.25}, agg),
        ("defaults, header vector 0.5", fmt, {"w_header_vector": 0.5}, agg),
        ("defaults, header vector 2", fmt, {"w_header_vector": 2.0}, agg),
        ("defaults, prose queries' header vector 0.25", fmt, {"w_header_vector_prose": 0.25},
         agg),
        ("defaults, prose queries' header vector 0.5", fmt, {"w_header_vector_prose": 0.5},
         agg),
        # The static tier's vote beside every vector (retrieval.search.ranking_parts).
        *((f"defaults, static vote {w} beside the vectors", fmt, {"w_static_meaning": w}, agg)
          for w in (0.1, 0.25)),
        ("BM25 chunks only", fmt, {"w_vector": 0.0, "evidence": False,
                                   "w_file_lexical": 0.0}, agg),
        *((f"defaults + imports of top {top}, weight {w}", fmt, {IMPORTS_OPTION: (top, w)}, agg)
          for top in (1, 3) for w in (0.1, 0.25)),
    ]
    rows += [(f"defaults, no header, header vector {w}", o,
              {"w_header_vector": w, "w_header_vector_prose": w}, agg)
             for o in other for w in (0.0, 0.25, 1.0)]
    return rows


def partial_variants() -> list[tuple[str, str, dict, str]]:
    """The shipped defaults while a first index runs: the vector ranking's vote scaled
    by the share of chunks it covers, as retrieval.faces.api does (none: no vote at all)."""
    from retrieval.search.grouping import DEFAULT_AGG
    from retrieval.search.options import SearchOptions

    agg = DEFAULT_AGG["file"]
    header = SearchOptions().w_header_vector
    return [
        ("first index, no vectors yet", SHIPPED_RENDERING,
         {"w_vector": 0.0, "w_header_vector": 0.0}, agg),
        ("first index, no vectors yet, before the multi-language signals", SHIPPED_RENDERING,
         {"w_vector": 0.0, "w_header_vector": 0.0, **BEFORE_MULTILANG}, agg),
        *((f"first index, half the vectors, {order} order",
           partial_key(SHIPPED_RENDERING, order),
           {"w_vector": PARTIAL_SHARE, "w_header_vector": header * PARTIAL_SHARE}, agg)
          for order in PARTIAL_ORDERS),
    ]


def rank_files(prep: Prepared, q: str, variant: tuple[str, str, dict, str]) -> list[str]:
    from retrieval.search.fusion import group_ranking
    from retrieval.search.options import SearchOptions

    _name, fmt, opts, agg = variant
    opts = dict(opts)
    imports = opts.pop(IMPORTS_OPTION, None)
    ranking = prep.rankers[fmt].rank(q, replace(SearchOptions(), **opts))
    files = [g.key[0] for g in group_ranking(ranking, "file", agg)]
    if imports is not None:
        files = with_imports(files, prep.imports, *imports)
    return files[:DEPTH_FILES]


# -- structure: imports between files ------------------------------------------------------
# A re-ranking signal measured here before it reaches the product: the files that the top
# hits import get a vote, since an issue's fix often lies in a module its traceback's
# code calls into.

IMPORTS_OPTION = "_imports"  # variant option: (top files that vote, weight of a vote)
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)


def module_files(paths: Iterable[str]) -> dict[str, str]:
    """Dotted module name -> file, under every prefix a package may sit below (`src/`,
    `lib/`...): `a/b/c.py` is `a.b.c`, `b.c` and `c`; the shortest path wins a name."""
    out: dict[str, str] = {}
    for p in sorted(paths, key=lambda p: (p.count("/"), p)):
        if not p.endswith(".py"):
            continue
        parts = p[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(len(parts)):
            out.setdefault(".".join(parts[i:]), p)
    return out


def imported_by(path: str, text: str, modules: dict[str, str]) -> list[str]:
    """The corpus files `path`'s imports name, in the order they appear."""
    package = path.rsplit("/", 1)[0].replace("/", ".") if "/" in path else ""
    found: list[str] = []
    for m in _FROM.finditer(text):
        dots, base, names = m.group(1), m.group(2), m.group(3)
        if dots:  # relative: up len(dots) - 1 packages from this file's
            up = package.split(".") if package else []
            up = up[: len(up) - (len(dots) - 1)] if len(dots) > 1 else up
            base = ".".join([*up, base] if base else up)
        for name in (n.split(" as ")[0].strip(" \t\n\\")
                     for n in names.strip("()").replace("\n", ",").split(",")):
            if name and f"{base}.{name}" in modules:
                found.append(modules[f"{base}.{name}"])
        if base in modules:
            found.append(modules[base])
    for m in _IMPORT.finditer(text):
        for name in (n.strip().split(" ")[0] for n in m.group(1).split(",")):
            if name in modules:
                found.append(modules[name])
    return [f for f in dict.fromkeys(found) if f != path]


def with_imports(files: list[str], imports: Callable[[str], list[str]], top: int,
                 weight: float, k: float = 10.0) -> list[str]:
    """`files` re-ranked: each of the `top` first files votes `weight / (k + its rank)`
    for every file it imports, beside each file's own `1 / (k + rank)`."""
    score = {f: 1.0 / (k + r) for r, f in enumerate(files, start=1)}
    for r, f in enumerate(files[:top], start=1):
        for g in imports(f):
            score[g] = score.get(g, 0.0) + weight / (k + r)
    return sorted(score, key=lambda f: -score[f])


# -- SWE-bench -------------------------------------------------------------------------


def swebench_instances(paths: Sequence[Path], repos: Sequence[str], per_repo: int | None,
                       ids: Path | None = None, split: Path | None = None,
                       per_half: dict[str, int] | None = None) -> list[dict]:
    """The instances of `repos` (at most `per_repo` each), only those listed in the file
    `ids` (one instance id per line, `#` comments) if given. With `split` (the file of
    bench/swebench_split.py: id, repo, half), only the instances it lists, each tagged
    with its half, in the file's order; `per_half` keeps the first that many of each
    repo's half (key "": every repo not named; see `parse_per_half`)."""
    rows = [json.loads(line) for path in paths for line in path.open()]
    if ids is not None:
        keep = {line.split("#")[0].strip() for line in ids.read_text().splitlines()}
        rows = [r for r in rows if r["id"] in keep]
    if split is not None:
        halves = {}
        for line in split.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                iid, _repo, half = line.split("\t")
                halves[iid] = half
        order = {iid: n for n, iid in enumerate(halves)}
        rows = sorted((dict(r, half=halves[r["id"]]) for r in rows if r["id"] in halves),
                      key=lambda r: order[r["id"]])
        if per_half is not None:
            taken: dict[tuple[str, str], int] = defaultdict(int)
            kept = []
            for r in rows:
                limit = per_half.get(r["repo"], per_half.get("", 0))
                if taken[(r["repo"], r["half"])] < limit:
                    taken[(r["repo"], r["half"])] += 1
                    kept.append(r)
            rows = kept
    wanted = [REPO_NAMES.get(r, r) for r in repos]
    out = []
    for repo in wanted:
        mine = [r for r in rows if r["repo"] == repo]
        out += mine[:per_repo] if per_repo else mine
    return out


def parse_per_half(spec: str | None) -> dict[str, int] | None:
    """`--per-half`: "N" (every repo), or "N,REPO=M,..." where a named repo keeps M
    (e.g. "3,xarray=1": three a half from each repo, one from xarray's)."""
    if not spec:
        return None
    out: dict[str, int] = {}
    for item in spec.split(","):
        name, _, n = item.rpartition("=")
        if not n.strip().isdigit():
            raise SystemExit(f"--per-half: {item!r} is not N or REPO=N")
        out[REPO_NAMES.get(name.strip(), name.strip())] = int(n)
    return out


def tree_for(data: Path, mirrors: Path | None, repo: str, commit: str) -> Path:
    out = data / "trees" / repo.replace("/", "+") / commit[:12]
    if out.is_dir():
        return out
    if mirrors is None:
        raise SystemExit(f"no tree at {out} and no --mirrors to export it from")
    git = mirrors / repo.replace("/", "+") / "repo"
    script = SHARED / "swebench" / "materialize.sh"
    subprocess.run(["bash", str(script), str(git), commit, str(out)], check=True,
                   capture_output=True)
    return out


def mrr(ranks: Sequence[int | None]) -> float:
    """Mean reciprocal rank of the first gold file (0 past the depth)."""
    return sum(1 / r for r in ranks if r) / max(len(ranks), 1)


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def acc(ranks: Sequence[int | None], k: int) -> float:
    return sum(1 for r in ranks if r is not None and r <= k) / max(len(ranks), 1)


def first_gold(files: Sequence[str], gold: set[str]) -> int | None:
    for i, f in enumerate(files, start=1):
        if f in gold:
            return i
    return None


def run_swebench(args, enc, plain, memo: Memo, plan: EmbedPlan | None = None) -> dict:
    instances = swebench_instances(args.swebench, args.repos, args.per_repo, args.ids,
                                   args.split, args.per_half)
    by_version: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for inst in instances:
        by_version[(inst["repo"], inst["commit"])].append(inst)
    ablation = "swebench" in args.header_ablation
    variants = codeveil_variants(ablation)
    if args.partial:
        variants += partial_variants()
    systems = ["BM25 files", "BM25 files, code tokens", "MiniLM 40-line windows"] + [
        v[0] for v in variants]
    details = []
    for n, ((repo, commit), insts) in enumerate(by_version.items(), start=1):
        t0 = time.perf_counter()
        root = tree_for(args.data, args.mirrors, repo, commit)
        tag = hashlib.sha256(args.include.encode()).hexdigest()[:8]
        cache = args.data / "chunks" / repo.replace("/", "+") / f"{commit[:12]}-{tag}.json"
        corpus = load_tree(root, f"{repo}@{commit[:12]}", cache, args.include)
        log.info("[%d/%d] %s@%s: %d files, %d chunks", n, len(by_version), repo, commit[:12],
                 len(corpus.files), len(corpus.chunks))
        queries = [i["query"] for i in insts]
        if plan is not None:
            plan.add(repo, corpus, queries, formats=renderings(ablation), instances=len(insts))
            continue
        recency = mirror_recency(args.mirrors, repo, commit) if args.partial else None
        prep = prepare(corpus, enc, plain, memo, formats=renderings(ablation),
                       query_texts=queries, recency=recency)
        if args.stage == "warm":
            continue
        for inst in insts:
            q = inst["query"]
            gold = set(inst["gold_files"])
            results = {
                "BM25 files": prep.bm25_files(q),
                "BM25 files, code tokens": prep.code_bm25_files(q),
                "MiniLM 40-line windows": prep.windows(q),
            }
            for v in variants:
                results[v[0]] = rank_files(prep, q, v)
            row = {"id": inst["id"], "repo": repo, "half": inst.get("half", "all"),
                   "gold": sorted(gold)}
            for s, files in results.items():
                row[s] = first_gold(files, gold)
            details.append(row)
        log.info("  done in %.0fs", time.perf_counter() - t0)
    if args.stage in ("warm", "plan"):
        return {}
    out: dict = {"instances": len(details), "versions": len(by_version), "halves": {}}
    for half in sorted({d["half"] for d in details}, key=lambda h: (h != "tune", h)):
        mine = [d for d in details if d["half"] == half]
        repos = list(dict.fromkeys(d["repo"] for d in mine))
        out["halves"][half] = {
            "instances": len(mine),
            "systems": {s: {**{f"acc@{k}": acc([d[s] for d in mine], k) for k in ACC_KS},
                            "mrr": mrr([d[s] for d in mine])} for s in systems},
            "per_repo": {repo: {s: {f"acc@{k}": acc([d[s] for d in mine if d["repo"] == repo], k)
                                    for k in ACC_KS} for s in systems} for repo in repos},
            "repo_instances": {repo: sum(d["repo"] == repo for d in mine) for repo in repos},
        }
    out["details"] = details
    return out


# -- CoSQA ---------------------------------------------------------------------------------


def run_cosqa(args, enc, plain, memo: Memo, plan: EmbedPlan | None = None) -> dict:
    rows = [json.loads(line) for line in (args.cosqa / "dev.jsonl").open()]
    if args.cosqa_limit:
        rows = rows[: args.cosqa_limit]
    corpus = cosqa_corpus(args.cosqa / "corpus.jsonl")
    log.info("cosqa: %d queries, %d functions, %d chunks", len(rows), len(corpus.files),
             len(corpus.chunks))
    ablation = "cosqa" in args.header_ablation
    if plan is not None:
        plan.add("cosqa", corpus, [r["query"] for r in rows], formats=renderings(ablation),
                 instances=len(rows))
        return {}
    prep = prepare(corpus, enc, plain, memo, formats=renderings(ablation),
                   query_texts=[r["query"] for r in rows])
    # One window per function (functions are short): the plain baseline is the whole
    # function, truncated by the model.
    variants = codeveil_variants(ablation)
    # Queries are one short line: the query-splitting rows would repeat the others.
    variants = [v for v in variants if ("split" not in v[0] and "query" not in v[0][2:])
                or "query cut" in v[0]]
    if args.stage == "warm":
        return {}
    systems = ["BM25 files", "BM25 files, code tokens", "MiniLM 40-line windows"] + [
        v[0] for v in variants]
    ranks: dict[str, list[int | None]] = {s: [] for s in systems}
    for r in rows:
        q = r["query"]
        gold = {f"corpus/{r['gold_doc_id']}.py"}
        results = {
            "BM25 files": prep.bm25_files(q),
            "BM25 files, code tokens": prep.code_bm25_files(q),
            "MiniLM 40-line windows": prep.windows(q),
        }
        for v in variants:
            results[v[0]] = rank_files(prep, q, v)
        for s, files in results.items():
            ranks[s].append(first_gold(files[:100], gold))
    halves = cosqa_halves([r["id"] for r in rows])
    return {"queries": len(rows), "systems": mrr_summary(ranks),
            "halves": {h: {"queries": sum(x == h for x in halves),
                           "systems": mrr_summary({s: [x for x, hx in zip(r, halves, strict=True)
                                                       if hx == h] for s, r in ranks.items()})}
                       for h in HALVES}}


def next_step(systems: dict[str, dict[str, float]]) -> str | None:
    """The single change to the defaults that the tuning rule takes next: of the rows
    "defaults, ..." / "defaults + ...", the best by the mean of Acc@1/3/5/10, ties broken
    by MRR, if it beats the shipped defaults by that order; else None."""
    def score(s: str) -> tuple[float, float]:
        v = systems[s]
        return round(sum(v[f"acc@{k}"] for k in ACC_KS) / len(ACC_KS), 9), round(v["mrr"], 9)

    changes = [s for s in systems if s.startswith(("defaults,", "defaults +"))]
    best = max(changes, key=score, default=None)
    return best if best is not None and score(best) > score(SHIPPED) else None


def cosqa_halves(ids: Sequence[str]) -> list[str]:
    """The half of each CoSQA dev query, by the rule of bench/swebench_split.py: sorted by
    the SHA-256 of the id, the 1st, 3rd, ... are tune and the 2nd, 4th, ... report."""
    order = sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    half = {i: HALVES[n % 2] for n, i in enumerate(order)}
    return [half[i] for i in ids]


def mrr_summary(ranks: dict[str, list[int | None]]) -> dict[str, dict[str, float]]:
    """MRR, Recall@1 and Recall@10 per system, from the gold's rank per query."""
    return {
        s: {"mrr": sum(1 / x for x in r if x) / len(r), "recall@1": acc(r, 1),
            "recall@10": acc(r, 10)}
        for s, r in ranks.items()
    }


# -- end to end ----------------------------------------------------------------------------


def run_e2e(args, n: int) -> dict:
    """The first `n` SWE-bench instances through `Index.search` (encrypted round trip):
    a copy of each tree holding the files the other systems saw, indexed by the
    embedded store (vectors come from the cache), searched with group="file"."""
    import fnmatch
    import shutil
    import tempfile

    from retrieval import Index
    from retrieval.faces.api import ranking_depth
    from retrieval.search.options import SearchOptions

    instances = swebench_instances(args.swebench, args.repos, args.per_repo, args.ids,
                                   args.split, args.per_half)[:n]
    ranks: dict[str, list] = {"sealed": [], "server-search": []}
    with tempfile.TemporaryDirectory(prefix="codeveil-e2e-") as tmp:
        os.environ["CODEVEIL_CONFIG_DIR"] = str(Path(tmp) / "config")  # throwaway keys
        for inst in instances:
            src = tree_for(args.data, args.mirrors, inst["repo"], inst["commit"])
            root = Path(tmp) / inst["id"]

            def skip(folder: str, names: list[str], src: Path = src) -> list[str]:
                rel = Path(folder).relative_to(src)
                return [x for x in names if (Path(folder) / x).is_file()
                        and not fnmatch.fnmatch(str(rel / x), args.include)]

            # Both modes over the same tree (the second from the cache): search on the
            # client over exact vectors, and the server's ranking of encrypted ones.
            for mode, mode_ranks in ranks.items():
                shutil.copytree(src, root, ignore=skip)
                with Index(root) as idx:
                    idx.init(server_search=mode == "server-search")
                    idx.index(wait=True)
                    hits = idx.search(inst["query"], k=DEPTH_FILES, group="file")
                mode_ranks.append(first_gold([h.path for h in hits], set(inst["gold_files"])))
                shutil.rmtree(root)
                log.info("e2e %s (%s): gold rank %s", inst["id"], mode, mode_ranks[-1])
    return {"instances": len(instances), "ids": [i["id"] for i in instances],
            "depth": ranking_depth(SearchOptions().depth, DEPTH_FILES),
            "ranks": ranks["sealed"], "ranks_server_search": ranks["server-search"],
            **{f"acc@{k}": acc(ranks["sealed"], k) for k in ACC_KS},
            **{f"server_search_acc@{k}": acc(ranks["server-search"], k) for k in ACC_KS}}


def e2e_twin(details: Sequence[dict], depth: int) -> str | None:
    """The in-memory row that ranks as `Index.search` did for the end-to-end check: the
    shipped defaults, or the row that only reads each ranking `depth` deep."""
    from retrieval.search.options import SearchOptions

    row = SHIPPED if depth == SearchOptions().depth else f"defaults, depth {depth}"
    return row if details and row in details[0] else None


# -- latency ------------------------------------------------------------------------------


def run_latency(n_chunks: int, swebench: Path) -> dict:
    """Milliseconds per query that ranking adds besides the model and the store, at
    `n_chunks` chunks: BM25, evidence, fusion and grouping (median of the SWE-bench
    issue texts as queries, and of short queries)."""
    import glob
    import importlib.util
    import re
    import statistics

    from indexer.chunk import Chunk
    from indexer.location import ChunkLocation
    from indexer.tokens import default_counter
    from retrieval.indexes.lexical import LexicalIndex
    from retrieval.search.fusion import HybridRanker, group_ranking
    from retrieval.search.grouping import group
    from retrieval.search.options import SearchOptions, rrf
    from retrieval.search.query import extract_refs, lexical_terms

    spec = importlib.util.find_spec("numpy")
    assert spec and spec.origin
    site = Path(spec.origin).parent.parent
    chunks: list[Chunk] = []
    for f in sorted(glob.glob(str(site / "**" / "*.py"), recursive=True)):
        try:
            lines = Path(f).read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        rel = str(Path(f).relative_to(site))
        for start in range(0, len(lines), 30):
            body = "".join(lines[start : start + 30])
            m = re.search(r"(?:def|class) (\w+)", body)
            chunks.append(Chunk(rel, start + 1, start + 30, "python", m.group(1) if m else "",
                                body))
        if len(chunks) >= n_chunks:
            break
    chunks = chunks[:n_chunks]
    t0 = time.perf_counter()
    lex = LexicalIndex.from_chunks(chunks)
    build = time.perf_counter() - t0
    docs = [lex.doc(i) for i in range(len(lex))]
    rng = np.random.default_rng(0)

    def nearest(_v: np.ndarray, n: int) -> list[tuple[ChunkLocation, float]]:
        # Stands in for the store (timed elsewhere): a fixed-cost list of neighbours.
        picks = rng.integers(0, len(docs), size=n)
        return [(docs[i], 0.5) for i in picks]

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.ones((len(texts), 384), dtype=np.float32) / np.sqrt(384)

    counter = default_counter()
    # The header vectors' ranking too (its search, like the body's, is timed in
    # bench/local_vectors.py): here its list's share of the fusion.
    ranker = HybridRanker(lex, embed, nearest, counter.count, 254,
                          count_many=counter.count_batch, nearest_header=nearest)
    t0 = time.perf_counter()
    ranker.names()
    names_build = time.perf_counter() - t0
    issues = [json.loads(line)["query"] for line in swebench[0].open()][:30]
    short = ["retry failed uploads", "parse http header", "where is the config loaded",
             "Session.send timeout", "compare password digest", "fromRawHeaders",
             "Sinatra::Base", "how are the tests of the parser set up"] * 4
    before = replace(SearchOptions(), **BEFORE_MULTILANG)
    printed_before = replace(SearchOptions(), **PRINTED_BEFORE)
    # Before the words tier's file vote and question words (its stems cost nothing here:
    # a word's stem is computed once, when it is first split).
    words_before = replace(SearchOptions(), w_file_vote=0.0, question_words_out=False)
    out: dict = {"chunks": len(lex), "build_s": build, "names_build_s": names_build}
    for label, queries in (("short", short), ("issue", issues)):
        times: dict[str, list[float]] = defaultdict(list)
        for q in queries:
            t = time.perf_counter()
            bm = lex.top(q, 100)
            times["bm25"].append(time.perf_counter() - t)
            t = time.perf_counter()
            lex.file_top(lexical_terms(q), 100, dedupe=False)
            times["file_bm25"].append(time.perf_counter() - t)
            t = time.perf_counter()
            extract_refs(q)
            ranker._evidence_ranking(extract_refs(q), bm, None, 100)
            times["evidence"].append(time.perf_counter() - t)
            vec = [d.key for d, _ in nearest(np.zeros(1), 100)]
            t = time.perf_counter()
            fused = rrf([vec, [lex.doc(i).key for i, _ in bm]])
            ranking = [(docs[0], s) for s in sorted(fused.values(), reverse=True)]
            times["rrf"].append(time.perf_counter() - t)
            # The shipped ranking and the one before the multi-language signals, taking
            # turns going first.
            # The ten as printed (chunk level: diversity) are part of each one's cost.
            for name, opts in sorted((("rank_total", SearchOptions()),
                                      ("rank_printed_before", printed_before),
                                      ("rank_before_multilang", before),
                                      ("rank_before_file_vote", words_before)),
                                     reverse=len(times["bm25"]) % 2 == 0):
                t = time.perf_counter()
                got = ranker.rank(q, opts)
                group_ranking(got, "chunk")
                times[name].append(time.perf_counter() - t)
                if name == "rank_total":
                    r = got
            t = time.perf_counter()
            group(r.chunks, "file")
            group(r.chunks, "symbol")
            times["grouping"].append(time.perf_counter() - t)
            del ranking
        out[label] = {k: 1000 * statistics.median(v) for k, v in times.items()}
    return out


# -- output --------------------------------------------------------------------------------


BASELINES = ("BM25 files", "MiniLM 40-line windows")


def _bar_color(name: str) -> str:
    """Orange for what ships, dark grey for the baselines it must beat, blue for the
    ablation ladder, light grey for the variants of the defaults."""
    if name == SHIPPED:
        return "#e8710a"
    if name in BASELINES:
        return "#444444"
    if name.startswith(("+", "chunks", "BM25 chunks")):
        return "#3b7dd8"
    return "#aaaaaa"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if results.get("swebench"):
        halves = results["swebench"]["halves"]
        half = "report" if "report" in halves else next(iter(halves))
        panels.append((f"SWE-bench dev, {half} half: file Acc@5",
                        {s: v["acc@5"] for s, v in halves[half]["systems"].items()}))
    if results.get("cosqa"):
        panels.append(("CoSQA dev, report half: MRR",
                       {s: v["mrr"]
                        for s, v in results["cosqa"]["halves"]["report"]["systems"].items()}))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 7), squeeze=False)
    for ax, (title, values) in zip(axes[0], panels, strict=True):
        names = list(values)
        colors = [_bar_color(n) for n in names]
        ax.barh(names[::-1], [values[n] for n in names][::-1], color=colors[::-1])
        ax.set_title(title)
        ax.set_xlim(0, 1)
        for i, n in enumerate(names[::-1]):
            ax.text(values[n] + 0.01, i, f"{values[n]:.3f}", va="center", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    save_figure(fig, path.stem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="Folder for trees, chunk lists and the embedding cache.")
    parser.add_argument("--datasets", default="swebench,cosqa")
    parser.add_argument("--repos", default=",".join(REPO_NAMES))
    parser.add_argument("--per-repo", type=int, default=None,
                        help="At most this many SWE-bench instances per repo.")
    parser.add_argument("--ids", default="",
                        help="File of SWE-bench instance ids to keep, one per line (such as"
                        " bench/swebench_ids.txt); default '': every instance of --repos.")
    parser.add_argument("--split", default=str(Path(__file__).with_name("swebench_split.tsv")),
                        help="The tune/report split (bench/swebench_split.py); '' for none.")
    parser.add_argument("--per-half", type=parse_per_half, default=None, metavar="N[,REPO=M]",
                        help="At most N instances of each repo's half (M of a named repo's),"
                        " the first in the split file's (id-hash) order.")
    parser.add_argument("--threads", type=int, default=None,
                        help="Model threads (default: all cores).")
    parser.add_argument("--cosqa-limit", type=int, default=None)
    parser.add_argument("--swebench", default=",".join(
        str(SHARED / "swebench" / f) for f in ("verified_dev.jsonl", "lite_dev.jsonl")),
                        help="SWE-bench instance files, comma-separated.")
    parser.add_argument("--cosqa", type=Path, default=SHARED / "cosqa")
    parser.add_argument("--mirrors", type=Path, default=None)
    parser.add_argument("--include", default="*.py",
                        help="Glob of the SWE-bench files every system indexes (default: "
                        "Python files, where all gold files are; '*' for all files).")
    parser.add_argument("--stage", choices=("plan", "warm", "eval", "all"), default="all",
                        help="plan: count what the run would embed, what the cache lacks "
                        "and how long that takes (a sample embedded and timed); warm: only "
                        "embed (fill the cache); eval/all: measure.")
    parser.add_argument("--header-ablation", default="swebench,cosqa",
                        help="Datasets that also get the rows of chunks embedded without "
                        "their `path > symbol` header (it embeds every chunk a second "
                        "time); '' for none.")
    parser.add_argument("--e2e", type=int, default=0,
                        help="Also run this many instances through Index.search.")
    parser.add_argument("--latency", type=int, default=0, metavar="CHUNKS",
                        help="Also time ranking (BM25, evidence, fusion, grouping) at this "
                        "many chunks.")
    parser.add_argument("--embedder", default=None,
                        help="Pin an embedder by name (indexer.embedder_registry.EMBEDDERS);"
                        " default: the one `codeveil index` uses.")
    parser.add_argument("--partial", action="store_true",
                        help="SWE-bench: also rank as a first index half way would (no"
                             " vectors; half of them, in priority or random order)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--out", default="quality")
    parser.add_argument("--per-query", type=Path, default=None, metavar="FILE",
                        help="Also write each SWE-bench instance's row (the gold's rank in"
                             " every system) to FILE, one JSON object a line; not a result"
                             " file: keep it out of git.")
    args = parser.parse_args()
    args.repos = [r for r in args.repos.split(",") if r]
    args.ids = Path(args.ids) if args.ids else None
    args.split = Path(args.split) if args.split else None
    args.swebench = [Path(x) for x in args.swebench.split(",") if x]
    args.header_ablation = {d for d in args.header_ablation.split(",") if d}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    import bm25s  # noqa: F401  (it sets its logger to DEBUG on import; quiet it after)

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    os.environ.setdefault("CODEVEIL_CACHE_DIR", str(args.data / "cache"))
    if args.embedder:  # --e2e indexes through `Index`, which reads the model from here
        os.environ["CODEVEIL_EMBEDDER"] = args.embedder
    started = time.perf_counter()
    enc, plain = _embedders(args.embedder, args.threads)
    memo = Memo()
    results: dict = {"model": enc.model_id, "args": {
        k: str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set)
        else [str(x) for x in v] if isinstance(v, list) else v
        for k, v in vars(args).items()}}
    datasets = args.datasets.split(",")
    plan = EmbedPlan(enc, plain) if args.stage == "plan" else None
    if "cosqa" in datasets:
        results["cosqa"] = run_cosqa(args, enc, plain, memo, plan)
    if "swebench" in datasets:
        results["swebench"] = run_swebench(args, enc, plain, memo, plan)
    if plan is not None:
        report = plan.report(args.threads)
        report["seconds"] = time.perf_counter() - started
        print(plan.table(report))
        print(f"\nplanned in {report['seconds']:.0f} s (exports, chunking, counting, the "
              "timed sample)")
        print(f"wrote {write_json(args.out + '_plan', {**results, 'plan': report})}")
        return
    if args.e2e:
        results["e2e"] = run_e2e(args, args.e2e)
    if args.latency:
        results["latency"] = run_latency(args.latency, args.swebench)
    if args.stage == "warm":
        return
    if results.get("swebench"):
        sw = results["swebench"]
        for half, h in sw["halves"].items():
            print(f"\nSWE-bench dev, {half} half: {h['instances']} instances "
                  f"({sw['versions']} repo versions in the run): file-level Acc@k (%)")
            print(table(["system", *(f"Acc@{k}" for k in ACC_KS), "MRR"],
                        [[s, *(pct(v[f"acc@{k}"]) for k in ACC_KS), pct(v["mrr"])]
                         for s, v in h["systems"].items()]))
            repos = list(h["per_repo"])
            print(f"\nAcc@5 per repo, {half} half (%; instances: "
                  + ", ".join(f"{r.split('/')[-1]} {n}" for r, n in h["repo_instances"].items())
                  + ")")
            print(table(["system", *(r.split("/")[-1] for r in repos)],
                        [[s, *(pct(h["per_repo"][r][s]["acc@5"]) for r in repos)]
                         for s in (*BASELINES, SHIPPED)]))
        if "tune" in sw["halves"]:
            step = next_step(sw["halves"]["tune"]["systems"])
            sw["next_step"] = step
            print("\nThe rule's next step (tune half; mean of Acc@1/3/5/10, MRR breaks ties):"
                  + (f" {step}" if step else " none, no single change beats the defaults"))
    if results.get("cosqa"):
        cq = results["cosqa"]
        for half, h in cq["halves"].items():
            print(f"\nCoSQA dev, {half} half, {h['queries']} of {cq['queries']} queries")
            print(table(["system", "MRR", "R@1", "R@10"],
                        [[s, v["mrr"], v["recall@1"], v["recall@10"]]
                         for s, v in h["systems"].items()]))
    if results.get("e2e"):
        e2e = results["e2e"]
        rows = [["Index.search, sealed (search here)", *(e2e[f"acc@{k}"] for k in ACC_KS)],
                ["Index.search, server-search (DCPE, re-ranked)",
                 *(e2e[f"server_search_acc@{k}"] for k in ACC_KS)]]
        if results.get("swebench"):
            # The same instances through the in-memory ranking read as deep as the
            # product reads for this many results, for comparison.
            row = e2e_twin(results["swebench"]["details"], e2e["depth"])
            if row is not None:
                by_id = {d["id"]: d[row] for d in results["swebench"]["details"]}
                same = [by_id[i] for i in e2e["ids"] if i in by_id]
                rows.append([f"{row}, plain vectors", *(acc(same, k) for k in ACC_KS)])
                e2e["in_memory_row"] = row
                e2e["ranks_equal_in_memory"] = sum(
                    by_id.get(i) == r for i, r in zip(e2e["ids"], e2e["ranks"], strict=True))
        print(f"\nEnd to end, {e2e['instances']} SWE-bench instances: file-level Acc@k")
        print(table(["system", *(f"Acc@{k}" for k in ACC_KS)], rows))
    if results.get("latency"):
        lat = results["latency"]
        print(f"\nRanking latency at {lat['chunks']} chunks, ms per query (median)")
        parts = ["bm25", "file_bm25", "evidence", "rrf", "grouping", "rank_total"]
        print(table(["queries", *parts],
                    [[q, *(lat[q][p] for p in parts)] for q in ("short", "issue")]))
    results["seconds"] = time.perf_counter() - started
    print(f"\nwhole run: {results['seconds']:.0f} s")
    # Per-instance rows only on request (`--per-query`): thousands of lines a run.
    details = (results.get("swebench") or {}).get("details", [])
    if details:
        results["swebench"] = {k: v for k, v in results["swebench"].items() if k != "details"}
    if args.per_query is not None:
        with args.per_query.open("w") as f:
            for row in details:
                f.write(json.dumps(row) + "\n")
    path = write_json(args.out, results)
    print(f"\nwrote {path}")
    if not args.no_plot:
        png = RESULTS / f"{args.out}.png"
        plot(results, png)
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
