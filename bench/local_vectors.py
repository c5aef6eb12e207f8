"""The client's vector index (`retrieval.indexes.local_vectors`): search latency and the cost of
keeping it current, side by side at several sizes.

    python bench/local_vectors.py [--sizes 10000,100000] [--queries 200] [--n 10,100]

For each size, a real `.codeveil/state.sqlite` with that many chunks (files of 10
chunks, written through `LocalChunks.replace_files`) and a real embedding cache holding
two vectors per chunk (its body's and its header's). The vectors are synthetic
(`bench.synthetic_vectors.synthetic`: clustered unit vectors of dim 384 shaped like
all-MiniLM-L6-v2 embeddings of code): the latency of exact search depends on the count
and the dim, not on what the vectors mean.
Then, all in one run:

- cold_build_s: `current()` with no saved index (every chunk and vector read, saved);
- open_s: a new store (a new process) finding the saved index: mapped, checksummed;
- unchanged_ms: `current()` when nothing changed (p50 of 200 calls: one small query);
- one_file_ms: `current()` after one file of 10 chunks is rewritten (p50 of 10 edits:
  the file's chunks and vectors read, the delta saved, the base untouched);
- nearest p50/p95 for each n, without and with a filter that keeps 1% of the files:
  as a predicate (`keep1%`: the search widens until n kept hits are found) and as the
  `HitFilter` a `--path` gives (`mask1%`: only the kept rows are scored; `_cold` builds
  the filter's row set on every query, as a filter never seen before does), and by the
  header vectors (`header=True`, the second vector ranking a search makes);
- f16_max_cos_err: how far float16 storage would move a cosine (why it is float32).

Prints a table; writes bench/results/local_vectors.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Timer, isolate, table, write_json
from bench.synthetic_vectors import DIM, PER_FILE, synthetic
from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.location import ChunkLocation
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.local_vectors import LocalVectorStore

MODEL = "bench-model"
FILES_PER_WRITE = 1000


def _file_chunks(f: int, version: int = 0) -> list[Chunk]:
    path = f"pkg{f // 100}/mod{f:06d}.py"
    return [Chunk(path, 1 + 4 * i, 4 + 4 * i, "python", f"f{i}",
                  f"def f{i}_{f}_{version}(x):\n    y = x + {i}\n    return y * {f}\n\n")
            for i in range(PER_FILE)]


def put_vectors(cache: EmbeddingCache, corpus: np.ndarray, f: int, chunks: list[Chunk]) -> None:
    """The body and header vectors of file `f`'s chunks (a header's: another row of the
    corpus, so the two rankings differ)."""
    rows = [f * PER_FILE + i for i in range(len(chunks))]
    pairs = list(zip(chunks, rows, strict=True))
    cache.put_many([(cache_key(MODEL, c.embed_text), corpus[r]) for c, r in pairs]
                   + [(cache_key(MODEL, c.header), corpus[(r + 7) % len(corpus)])
                      for c, r in pairs])


def fill(lc: LocalChunks, cache: EmbeddingCache, corpus: np.ndarray) -> None:
    """Write the chunks (10 a file) and their vectors, a thousand files a transaction."""
    files = len(corpus) // PER_FILE
    for start in range(0, files, FILES_PER_WRITE):
        batch = [(f, _file_chunks(f)) for f in range(start, min(files, start + FILES_PER_WRITE))]
        for f, cs in batch:
            put_vectors(cache, corpus, f, cs)
        lc.replace_files([(cs[0].path, f"{f}:0".encode(), cs) for f, cs in batch])


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def run_size(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = work / f"repo{n}"
    (root / ".codeveil").mkdir(parents=True)
    db = open_state_db(root / ".codeveil" / "state.sqlite")
    cache = EmbeddingCache(root / "cache.sqlite")
    lc = LocalChunks(db)
    corpus, queries = synthetic(n, args.queries, seed=n)
    with Timer() as t_fill:
        fill(lc, cache, corpus)
    folder = root / ".codeveil" / "vectors"
    store = LocalVectorStore(folder)
    with Timer() as t_cold:
        index = store.current(db, cache, MODEL, DIM)
    cold = dict(store.last_refresh)
    assert index.count == n, (index.count, n)
    with Timer() as t_open:
        reopened = LocalVectorStore(folder).current(db, cache, MODEL, DIM)
    with Timer() as t_first:
        reopened.nearest(queries[0], 10)  # a new process's first search faults pages in

    unchanged = []
    for _ in range(200):
        t0 = time.perf_counter()
        store.current(db, cache, MODEL, DIM)
        unchanged.append((time.perf_counter() - t0) * 1000)
    one_file, modes = [], []
    rng = np.random.default_rng(1)
    for edit in range(10):
        f = int(rng.integers(0, n // PER_FILE))
        cs = _file_chunks(f, version=edit + 1)
        put_vectors(cache, corpus, f, cs)
        lc.replace_files([(cs[0].path, f"{f}:{edit + 1}".encode(), cs)])
        t0 = time.perf_counter()
        index = store.current(db, cache, MODEL, DIM)
        one_file.append((time.perf_counter() - t0) * 1000)
        modes.append(str(store.last_refresh["mode"]))

    def one_percent(d: ChunkLocation) -> bool:  # one file in a hundred
        return d.path.endswith("00.py")

    mask = HitFilter(path="*00.py")  # the same files, as `--path` gives it: a mask

    assert index.header_count == n, (index.header_count, n)
    searches: dict[str, float] = {}
    for k in args.n:
        for label, keep, header in (("", None, False), ("_keep1%", one_percent, False),
                                    ("_mask1%", mask, False), ("_mask1%_cold", mask, False),
                                    ("_header", None, True)):
            for q in queries[: args.warmup]:
                index.nearest(q, k, keep=keep, header=header)
            times = []
            for q in queries:
                if label.endswith("_cold"):
                    index._rows_kept.clear()  # a filter not seen before: its mask built
                t0 = time.perf_counter()
                hits = index.nearest(q, k, keep=keep, header=header)
                times.append((time.perf_counter() - t0) * 1000)
            assert len(hits) == min(k, index.count if keep is None else n // 100)
            searches[f"nearest{label}_n{k}_p50_ms"] = round(pct(times, 50), 2)
            searches[f"nearest{label}_n{k}_p95_ms"] = round(pct(times, 95), 2)

    # A long query (an issue text) is searched as parts: 4 parts by body one by one (the
    # ranking before header vectors), and by body and header with each plane's parts
    # scored in one pass (`nearest_each`, what a search does now).
    for label, run in (
        ("parts4_body_one_by_one", lambda qs: [index.nearest(q, 100) for q in qs]),
        ("parts4_body_and_header_one_by_one",
         lambda qs: [index.nearest(q, 100, header=h) for q in qs for h in (False, True)]),
        ("parts4_body_and_header_each",
         lambda qs: [index.nearest_each(qs, 100, header=h) for h in (False, True)]),
    ):
        times = []
        for start in range(0, len(queries) - 3, 4):
            t0 = time.perf_counter()
            run(queries[start : start + 4])
            times.append((time.perf_counter() - t0) * 1000)
        searches[f"{label}_n100_p50_ms"] = round(pct(times, 50), 2)

    f16 = corpus.astype(np.float16).astype(np.float32)
    err = np.abs(queries @ corpus.T - queries @ f16.T).max() if n <= 100_000 else np.nan
    disk = sum(p.stat().st_size for p in folder.iterdir())
    cache.close()
    db.close()
    return {
        "chunks": n, "fill_s": round(t_fill.seconds, 2),
        "cold_build_s": round(t_cold.seconds, 3), "cold_build": cold,
        "open_s": round(t_open.seconds, 4), "first_search_after_open_ms":
            round(t_first.seconds * 1000, 2),
        "unchanged_p50_ms": round(statistics.median(unchanged), 4),
        "one_file_p50_ms": round(statistics.median(one_file), 2),
        "one_file_max_ms": round(max(one_file), 2), "one_file_modes": modes,
        **searches, "disk_mb": round(disk / 2**20, 1),
        "f16_max_cos_err": float(err),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")],
                        default=[10, 100])
    args = parser.parse_args()
    work = isolate()
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            rows.append(run_size(n, args, work))
            print(f"{n} chunks done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    k = args.n[0]
    print(table(
        ["chunks", "cold build s", "open s", "unchanged ms", "one file ms",
         f"n={k} p50/p95 ms", f"n={k} keep 1% p50/p95", f"n={k} mask 1% p50/p95",
         f"n={k} mask 1% cold p50/p95", f"n={k} header p50/p95", "disk MB"],
        [[r["chunks"], r["cold_build_s"], r["open_s"], r["unchanged_p50_ms"],
          r["one_file_p50_ms"],
          f"{r[f'nearest_n{k}_p50_ms']:.1f}/{r[f'nearest_n{k}_p95_ms']:.1f}",
          f"{r[f'nearest_keep1%_n{k}_p50_ms']:.1f}/{r[f'nearest_keep1%_n{k}_p95_ms']:.1f}",
          f"{r[f'nearest_mask1%_n{k}_p50_ms']:.1f}/{r[f'nearest_mask1%_n{k}_p95_ms']:.1f}",
          f"{r[f'nearest_mask1%_cold_n{k}_p50_ms']:.1f}"
          f"/{r[f'nearest_mask1%_cold_n{k}_p95_ms']:.1f}",
          f"{r[f'nearest_header_n{k}_p50_ms']:.1f}/{r[f'nearest_header_n{k}_p95_ms']:.1f}",
          r["disk_mb"]] for r in rows]))
    print(table(
        ["chunks", "4 parts, body, one by one ms", "4 parts, body + header, one by one ms",
         "4 parts, body + header, each plane at once ms"],
        [[r["chunks"], r["parts4_body_one_by_one_n100_p50_ms"],
          r["parts4_body_and_header_one_by_one_n100_p50_ms"],
          r["parts4_body_and_header_each_n100_p50_ms"]] for r in rows]))
    path = write_json("local_vectors", {"queries": args.queries, "dim": DIM,
                                        "vectors": "synthetic (bench.query_latency)",
                                        "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
