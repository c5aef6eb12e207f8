"""The client's approximate vector index (`retrieval.indexes.local_vectors.approx`) against its
exact search, at sizes up to 1M chunks, side by side in one run: latency, recall@10, the
search process's memory, disk per chunk, build time, and a one-file edit.

    python bench/approx_vectors.py [--sizes 100000,300000,1000000] [--queries 200]

For each size, a real `.codeveil/state.sqlite` with that many chunks (files of 10
chunks, written through `LocalChunks.replace_files`) and the saved vector index of
synthetic vectors (`bench.synthetic_vectors.synthetic`, dim 384; the header plane is the
corpus shifted by 7 rows, as in `bench/local_vectors.py`), written by the store's own
writer with the chunk table's stamp and file list, so that the store finds it current.
(Filling the embedding cache with 2M vectors and reading them back costs ~20 min at 1M;
what is timed here starts where that ends.) Then two fresh processes, as a user's:

- the builder: opens the store, whose first `current()` starts the build of the
  approximate index in a process of its own; build_s until it is saved, that build
  process's peak RSS (build_process_peak_mb) and the opener's own (build_peak_mb);
- the searcher: opens the store with the approximate index saved (open_s, RSS), runs
  the queries through the approximate index alone (RSS after), then exact and
  approximate query by query, alternating which goes first (p50/p99 each; recall@10 of
  n=10 and recall@100 of n=100 against exact, by body and by header vectors), RSS after
  the exact scans, and last ten one-file edits: the edited file's vectors put in the
  embedding cache, `current()` (the refresh, its delta saved) and a search that must
  find the edited chunk first (edit_ms).

RSS is psutil's: `rss` counts the pages of the memory-mapped base that are mapped into
the process (`file`, clean and reclaimable) as well as its own memory (`anon`); both are
reported. Peak RSS is the kernel's high-water mark (VmHWM).

Prints a table; writes bench/results/approx_vectors.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Timer, isolate, proc_status_kb, table, write_json
from bench.local_vectors import FILES_PER_WRITE, MODEL, _file_chunks, pct
from bench.synthetic_vectors import DIM, PER_FILE, synthetic
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.location import ChunkLocation
from retrieval.indexes.derived.store import Saved, chunk_rows, read_files
from retrieval.indexes.local_vectors import LocalVectorIndex, LocalVectorStore, read_stamp
from retrieval.indexes.local_vectors.docs import VectorDocs
from retrieval.indexes.local_vectors.index import no_vectors

EDITS = 10


def digest(path: str, version: int) -> bytes:
    """A file's content digest: 16 bytes, as the real ones (xxh3-128) are."""
    return hashlib.blake2b(f"{path}:{version}".encode(), digest_size=16).digest()


# -- the parent: the repository and its saved index ---------------------------------------


def prepare(n: int, queries: int, root: Path) -> dict[str, float]:
    """The state database of `n` chunks and the saved exact index of their vectors."""
    (root / ".codeveil").mkdir(parents=True)
    db = open_state_db(root / ".codeveil" / "state.sqlite")
    lc = LocalChunks(db)
    files = n // PER_FILE
    with Timer() as t_fill:
        for start in range(0, files, FILES_PER_WRITE):
            batch = [_file_chunks(f) for f in range(start, min(files, start + FILES_PER_WRITE))]
            lc.replace_files([(cs[0].path, digest(cs[0].path, 0), cs) for cs in batch])
    with Timer() as t_synth:
        corpus, query = synthetic(n, queries, seed=n)
        np.save(root / "queries.npy", query)
        base = np.empty((2, n, DIM), dtype=np.float32)
        base[0] = corpus
        base[1] = np.roll(corpus, -7, axis=0)  # a chunk's header: another row's vector
        del corpus
    with Timer() as t_save:
        docs = [ChunkLocation(p, s, e, sym, lang, bytes(h)) for p, s, e, lang, sym, h
                in chunk_rows(db, "path, start_line, end_line, language, symbol, chunk_hash",
                              None, order="path, ordinal", ready_only=True)]
        assert len(docs) == n, (len(docs), n)
        index = LocalVectorIndex(base, VectorDocs.of(docs), np.zeros(n, dtype=bool),
                                 no_vectors(DIM), VectorDocs.empty(), 0)
        saved = Saved(index, read_stamp(db), read_files(db), secrets.token_bytes(8),
                      (MODEL, DIM), {})
        store = LocalVectorStore(root / ".codeveil" / "vectors")
        store._write(saved, None, base_changed=True)  # what a cold build's save writes
    db.close()
    return {"fill_s": round(t_fill.seconds, 1), "synthetic_s": round(t_synth.seconds, 1),
            "save_s": round(t_save.seconds, 1)}


def child(role: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", role, "--root", str(root),
                          "--queries", str(args.queries)],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "CODEVEIL_APPROX_MIN_CHUNKS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"the {role} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the children: a user's processes ---------------------------------------------------


def memory() -> dict[str, float]:
    """MB: psutil's RSS, of it the mapped file pages and the process's own, and the peak."""
    import psutil

    info = psutil.Process().memory_info()
    mb = 2**20
    peak_kb = proc_status_kb("self", "VmHWM") or -1
    return {"rss_mb": round(info.rss / mb, 1), "file_mb": round(info.shared / mb, 1),
            "anon_mb": round((info.rss - info.shared) / mb, 1),
            "peak_mb": round(peak_kb / 1024, 1)}


def open_repo(root: Path) -> tuple[Any, Any, LocalVectorStore]:
    from indexer.embed_cache import EmbeddingCache

    db = open_state_db(root / ".codeveil" / "state.sqlite")
    cache = EmbeddingCache(root / "cache.sqlite")
    return db, cache, LocalVectorStore(root / ".codeveil" / "vectors")


def run_builder(root: Path) -> dict[str, Any]:
    db, cache, store = open_repo(root)
    t0 = time.perf_counter()
    index = store.current(db, cache, MODEL, DIM)
    builder = store._builder
    assert index.approx is None and builder is not None
    # The build runs in a process of its own: its high-water mark, read until it ends.
    peak_kb = 0
    while builder.poll() is None:
        peak_kb = max(peak_kb, proc_status_kb(builder.pid, "VmHWM") or 0)
        time.sleep(0.1)
    store.wait_approx()
    build_s = time.perf_counter() - t0
    assert store.approx_builds == 1 and builder.returncode == 0
    return {"build_s": round(build_s, 1), "build_process_peak_mb": round(peak_kb / 1024, 1),
            **{f"build_{k}": v for k, v in memory().items()}}


def _keys(hits: list[tuple[ChunkLocation, float]]) -> set[tuple[str, int]]:
    return {(d.path, d.start_line) for d, _ in hits}


def run_searcher(root: Path, queries: np.ndarray) -> dict[str, Any]:
    db, cache, store = open_repo(root)
    at_start = memory()
    t0 = time.perf_counter()
    index = store.current(db, cache, MODEL, DIM)
    open_s = time.perf_counter() - t0
    assert index.approx is not None, "the builder saved the approximate index"
    after_open = memory()
    t0 = time.perf_counter()
    index.nearest(queries[0], 10)
    first_ms = (time.perf_counter() - t0) * 1000
    for q in queries:  # the approximate index alone: what a search process holds
        index.nearest(q, 100)
        index.nearest(q, 100, header=True)
    after_approx = memory()
    exact = LocalVectorIndex(index.base, index.base_docs, index.deleted, index.delta,
                             index.delta_docs, index.missing)  # the same rows, no IVF
    out: dict[str, Any] = {"open_s": round(open_s, 3), "first_search_ms": round(first_ms, 2)}
    for label, n, header in (("n10", 10, False), ("n100", 100, False),
                             ("header_n100", 100, True)):
        times: dict[str, list[float]] = {"exact": [], "approx": []}
        found = 0
        for i, q in enumerate(queries):
            got = {}
            for name in (("exact", "approx") if i % 2 else ("approx", "exact")):
                ix = exact if name == "exact" else index
                t = time.perf_counter()
                got[name] = ix.nearest(q, n, header=header)
                times[name].append((time.perf_counter() - t) * 1000)
            found += len(_keys(got["exact"]) & _keys(got["approx"]))
        for name, ts in times.items():
            out[f"{name}_{label}_p50_ms"] = round(pct(ts, 50), 2)
            out[f"{name}_{label}_p99_ms"] = round(pct(ts, 99), 2)
        out[f"recall_{label}"] = round(found / (n * len(queries)), 4)
    after_exact = memory()

    from indexer.chunk import Chunk
    from indexer.embed_cache import cache_key

    lc = LocalChunks(db)
    rng = np.random.default_rng(7)
    edits, modes = [], []
    for edit in range(EDITS):
        f = int(rng.integers(0, index.count // PER_FILE))
        cs: list[Chunk] = _file_chunks(f, version=edit + 1)
        fresh = rng.standard_normal((2 * PER_FILE, DIM)).astype(np.float32)
        fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
        cache.put_many([(cache_key(MODEL, c.embed_text), fresh[i]) for i, c in enumerate(cs)]
                       + [(cache_key(MODEL, c.header), fresh[PER_FILE + i])
                          for i, c in enumerate(cs)])
        lc.replace_files([(cs[0].path, digest(cs[0].path, edit + 1), cs)])
        t = time.perf_counter()
        index = store.current(db, cache, MODEL, DIM)
        hits = index.nearest(fresh[3], 10)  # the body vector of the edit's 4th chunk
        edits.append((time.perf_counter() - t) * 1000)
        modes.append(str(store.last_refresh["mode"]))
        assert (hits[0][0].path, hits[0][0].start_line) == (cs[3].path, cs[3].start_line)
    folder = root / ".codeveil" / "vectors"
    # base.npy, base.npz, approx.npy, approx-trained.npy, delta.npz
    sizes = {re.sub(r"-[0-9a-f]{16}", "", p.name): p.stat().st_size for p in folder.iterdir()}
    n_rows = index.count
    return {
        **out, "edit_p50_ms": round(pct(edits, 50), 1), "edit_max_ms": round(max(edits), 1),
        "edit_modes": modes, "edit_refresh": store.last_refresh,
        **{f"start_{k}": v for k, v in at_start.items()},
        **{f"open_{k}": v for k, v in after_open.items()},
        **{f"approx_{k}": v for k, v in after_approx.items()},
        **{f"exact_{k}": v for k, v in after_exact.items()},
        "disk_bytes": sizes,
        "bytes_per_chunk": round(sum(sizes.values()) / n_rows, 1),
        "approx_bytes_per_chunk": round(sizes.get("approx.npy", 0) / n_rows, 1),
    }


# -- one command ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30000,100000,300000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--child", choices=("builder", "searcher"))
    parser.add_argument("--root", type=Path)
    args = parser.parse_args()
    if args.child:
        queries = np.load(args.root / "queries.npy")
        result = (run_builder(args.root) if args.child == "builder"
                  else run_searcher(args.root, queries))
        print(json.dumps(result))
        return
    work = isolate()
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            root = work / f"repo{n}"
            row: dict[str, Any] = {"chunks": n, **prepare(n, args.queries, root)}
            row.update(child("builder", root, args))
            row.update(child("searcher", root, args))
            rows.append(row)
            shutil.rmtree(root, ignore_errors=True)
            print(f"{n} chunks: {json.dumps(row)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(
        ["chunks", "exact n=10 p50/p99 ms", "approx n=10 p50/p99 ms", "recall@10",
         "exact n=100 p50/p99", "approx n=100 p50/p99", "recall@100",
         "header n=100 exact/approx p50", "header recall@100"],
        [[r["chunks"],
          f"{r['exact_n10_p50_ms']:.1f}/{r['exact_n10_p99_ms']:.1f}",
          f"{r['approx_n10_p50_ms']:.1f}/{r['approx_n10_p99_ms']:.1f}", r["recall_n10"],
          f"{r['exact_n100_p50_ms']:.1f}/{r['exact_n100_p99_ms']:.1f}",
          f"{r['approx_n100_p50_ms']:.1f}/{r['approx_n100_p99_ms']:.1f}", r["recall_n100"],
          f"{r['exact_header_n100_p50_ms']:.1f}/{r['approx_header_n100_p50_ms']:.1f}",
          r["recall_header_n100"]] for r in rows]))
    print(table(
        ["chunks", "build s (builder peak RSS MB)", "open s", "RSS after open MB (file)",
         "RSS approx searches MB (file)", "RSS after exact scans MB (file)",
         "disk B/chunk (approx)", "edit p50/max ms"],
        [[r["chunks"], f"{r['build_s']} ({r['build_process_peak_mb']:.0f})", r["open_s"],
          f"{r['open_rss_mb']:.0f} ({r['open_file_mb']:.0f})",
          f"{r['approx_rss_mb']:.0f} ({r['approx_file_mb']:.0f})",
          f"{r['exact_rss_mb']:.0f} ({r['exact_file_mb']:.0f})",
          f"{r['bytes_per_chunk']:.0f} ({r['approx_bytes_per_chunk']:.0f})",
          f"{r['edit_p50_ms']:.0f}/{r['edit_max_ms']:.0f}"] for r in rows]))
    path = write_json("approx_vectors", {"queries": args.queries, "dim": DIM,
                                         "vectors": "synthetic (bench.query_latency)",
                                         "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
