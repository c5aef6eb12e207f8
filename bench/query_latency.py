"""Search latency, recall and memory against workspace size, in-process and through the
server, with the query embedding a user waits for.

    python bench/query_latency.py [--sizes 10000,100000,1000000] [--queries 200] [--k 100]
        [--keep DIR]

For each size, a workspace of synthetic clustered unit vectors (dim 384, shaped like
all-MiniLM-L6-v2 embeddings of code, see `synthetic`) encrypted with `VectorCipher`
under a random key, written through the store's own `apply` in batches of 20,000
chunks (files of 10 chunks). Then, all in one run so that every number sees the same
machine:

- ingest_s: those applies, with the index kept in step and retrained as it grows;
- build_s: the index built from LanceDB alone (a restart that finds no snapshot);
- save_s, snapshot_mb: writing the snapshot (on close);
- open_s: a fresh store's first search when the snapshot is there (a restart);
- per query: the real model (the default backend, as `codeveil search` uses it) embeds
  a realistic query (`embed`) and the client
  encrypts it (`encrypt`); then, in a loop of their own (torch's threads keep spinning
  after a call and would slow whatever runs next), the store searches for k=100 as
  `retrieval` asks (`local`: in-process; `http`: `python -m sync.server.app` on loopback,
  keep-alive; the two alternate which goes first). `total` = embed + encrypt + http
  query by query: what a user of a server waits for. `sealed`: the same plain vectors
  in the client's own index (`retrieval.indexes.local_vectors`, what a sealed workspace
  searches), timed in the same loop (the three take turns going first), and
  `sealed_total` = embed + sealed. The search vector is a synthetic
  query of the corpus's distribution (a real query's vector would not relate to
  synthetic data);
- recall@10 and @100 of the answers against exact search over the same vectors;
- server RSS after the searches.

Prints a table; writes bench/results/query_latency.json and query_latency.png.
Needs about 6 GB of memory and 4 GB of disk at 1M.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Server, Timer, isolate, save_figure, table, write_json
from bench.synthetic_vectors import DIM, PER_FILE, synthetic
from sync.crypto.ciphers import VectorCipher
from sync.crypto.keys import WorkspaceKey
from sync.records import ChunkRecord, FileUpdate
from sync.store import SNAPSHOT, IndexPolicy, Store
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient

BATCH = 20_000  # chunks per apply: the store's limit
MODEL = "sentence-transformers/all-MiniLM-L6-v2:torch-fp32"

# What developers type into code search; embedded for real to time the model.
QUERIES = [
    "retry failed http requests with exponential backoff",
    "where is the connection pool closed",
    "parse multipart form data upload",
    "validate email field in model",
    "how are cookies stored between requests",
    "set request timeout",
    "convert numpy array to arrow table",
    "json encoder for datetime objects",
    "load model weights from checkpoint file",
    "tokenize text into word pieces",
    "progress bar for long running loop",
    "read yaml configuration file",
    "middleware that adds cors headers",
    "command line option with default value from environment variable",
    "verify tls certificate of the server",
    "stream response body in chunks",
    "encrypt data with aes gcm",
    "match file paths against gitignore patterns",
    "watch a directory for file changes",
    "shortest path in a weighted graph",
    "attention layer forward pass",
    "learning rate scheduler warmup",
    "serialize model to dict excluding unset fields",
    "server shutdown gracefully on sigterm",
    "exception handler returns json error",
    "why does the request hang when the server closes the connection early",
    "the function that decides which files are ignored when walking a repository",
    "handle keyboard interrupt and clean up temporary files",
    "thread safe lazy initialization of a global",
    "context manager that measures elapsed time",
]


# -- data -------------------------------------------------------------------------------


def chunk_ids(first: int, n: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(first, first + n)]


def fill(client: LocalClient, cipher: VectorCipher, corpus: np.ndarray) -> np.ndarray:
    """Write the corpus as files of PER_FILE chunks, BATCH chunks per apply; returns the
    encrypted vectors."""
    root = b"\x00" * 16
    encrypted = np.empty_like(corpus)
    for start in range(0, len(corpus), BATCH):
        stop = min(len(corpus), start + BATCH)
        ids = chunk_ids(start, stop - start)
        vectors = encrypted[start:stop] = cipher.encrypt(corpus[start:stop], ids)
        updates = []
        for f in range(start, stop, PER_FILE):
            n = min(PER_FILE, stop - f)
            area = (f // 5000).to_bytes(16, "big")  # one directory level, like src/<pkg>/
            chunks = tuple(
                ChunkRecord(ids[f - start + j], vectors[f - start + j], os.urandom(96))
                for j in range(n)
            )
            # Random-looking, as real keys (keyed hashes of paths) are: the store groups
            # a file's rows by its key's first 8 bytes, and refuses two keys that share
            # them (a counter's keys share all but their last bytes, and the root's).
            file_key = hashlib.blake2b(f.to_bytes(8, "big"), digest_size=16).digest()
            updates.append(FileUpdate(file_key, (root, b"\x01" + area[1:]), file_key, chunks))
        client.apply(updates, [])
    return encrypted


# -- measurement ------------------------------------------------------------------------


class SyncServer(Server):
    """`python -m sync.server.app` rather than the CLI, so RSS counts the server alone."""

    def arguments(self) -> list[str]:
        return ["-m", "sync.server.app", "--data", str(self.data_dir), "--port", str(self.port),
                "--log-level", "warning"]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def recall(found: list[list[bytes]], exact: np.ndarray, k: int) -> float:
    hits = [len(set(f[:k]) & set(chunk_ids_of(e[:k]))) / k for f, e in zip(found, exact,
                                                                          strict=True)]
    return float(np.mean(hits))


def chunk_ids_of(rows: np.ndarray) -> list[bytes]:
    return [int(r).to_bytes(16, "big") for r in rows]


def exact_neighbours(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    _dist, rows = index.search(queries, k)
    return rows


def sealed_index(folder: Path, corpus: np.ndarray) -> Any:
    """The client-side vector index (retrieval.indexes.local_vectors) over the plain vectors."""
    from bench.local_vectors import MODEL as LOCAL_MODEL
    from bench.local_vectors import fill as fill_local
    from indexer.embed_cache import EmbeddingCache
    from indexer.local_chunks import LocalChunks, open_state_db
    from retrieval.indexes.local_vectors import LocalVectorStore

    folder.mkdir(parents=True)
    db = open_state_db(folder / "state.sqlite")
    cache = EmbeddingCache(folder / "embeddings.sqlite")
    fill_local(LocalChunks(db), cache, corpus)
    return LocalVectorStore(folder / "vectors").current(db, cache, LOCAL_MODEL, DIM)


def run_size(n: int, args: argparse.Namespace, work: Path, embedder: Any) -> dict[str, Any]:
    rng_seed = n
    key = WorkspaceKey.generate()
    cipher = VectorCipher(key, DIM)
    corpus, plain_queries = synthetic(n, args.queries, seed=rng_seed)
    data = work / f"ws{n}" / "data"
    data.mkdir(parents=True)
    row: dict[str, Any] = {"rows": n}

    store = Store(data)
    _id, token = store.create_workspace(DIM, MODEL, key.key_check, workspace_id="bench")
    client = LocalClient(store, "bench")
    with Timer() as t:
        encrypted = fill(client, cipher, corpus)
    row["ingest_s"] = t.seconds
    here = sealed_index(work / f"ws{n}" / "client", corpus)  # what a sealed client searches
    del corpus
    gc.collect()
    store.close()
    snapshot = data / "workspaces" / "bench" / SNAPSHOT
    snapshot.unlink()

    with Timer() as t:  # a restart without a snapshot: LanceDB, then the index
        store = Store(data)
        client = LocalClient(store, "bench")
        client.search(encrypted[0], 1)
    row["build_s"] = t.seconds
    with Timer() as t:
        store.close()  # writes the snapshot
    row["save_s"] = t.seconds
    row["snapshot_mb"] = snapshot.stat().st_size / 1e6
    with Timer() as t:
        store = Store(data)
        client = LocalClient(store, "bench")
        client.search(encrypted[0], 1)
    row["open_s"] = t.seconds
    assert store.workspace("bench").index_events["loaded"] == 1
    row["index"] = client.info().extra.get("index")

    queries = np.stack([cipher.encrypt_query(q) for q in plain_queries])
    exact = exact_neighbours(encrypted, queries, args.k)
    del encrypted
    gc.collect()

    with Timer() as t:
        server = SyncServer(data)
    row["server_start_s"] = t.seconds
    http = HttpClient(server.url, "bench", token)
    with Timer() as t:
        http.search(queries[0], 1)
    row["server_open_s"] = t.seconds

    times: dict[str, list[float]] = {"embed": [], "encrypt": [], "local": [], "http": [],
                                     "sealed": []}
    found_local: list[list[bytes]] = []
    found_http: list[list[bytes]] = []
    for i in range(args.warmup):
        embedder.embed([QUERIES[i % len(QUERIES)] + " warm"])
        client.search(queries[i], args.k)
        http.search(queries[i], args.k)
    load_before = os.getloadavg()[0]
    # The model first, then the searches: torch's worker threads keep spinning for a
    # while after each call, and would otherwise take a core from the search measured
    # next. total_i = embed_i + encrypt_i + http_i.
    for i in range(len(queries)):
        t0 = time.perf_counter()
        vector = embedder.embed([QUERIES[i % len(QUERIES)]])[0]
        t1 = time.perf_counter()
        cipher.encrypt_query(vector)
        times["embed"].append(t1 - t0)
        times["encrypt"].append(time.perf_counter() - t1)
    time.sleep(1.0)
    for i, q in enumerate(queries):
        order = ("local", "http", "sealed")
        for which in order[i % 3:] + order[: i % 3]:  # each goes first a third of the time
            started = time.perf_counter()
            if which == "local":
                found_local.append([h.chunk_id for h in client.search(q, args.k)])
            elif which == "http":
                found_http.append([h.chunk_id for h in http.search(q, args.k)])
            else:
                here.nearest(plain_queries[i], args.k)
            times[which].append(time.perf_counter() - started)
    times["total"] = [e + c + h for e, c, h in zip(times["embed"], times["encrypt"],
                                                   times["http"], strict=True)]
    # A sealed workspace's search: the model, then the client's own exact search.
    times["sealed_total"] = [e + h for e, h in zip(times["embed"], times["sealed"],
                                                   strict=True)]
    row["load_avg"] = (load_before + os.getloadavg()[0]) / 2
    row["server_rss_mb"] = server.rss_mb()
    http.close()
    server.stop()
    store.close()

    for name, values in times.items():
        row[f"{name}_p50_ms"] = pct(values, 50)
        row[f"{name}_p99_ms"] = pct(values, 99)
    row["recall@10"] = recall(found_local, exact, 10)
    row[f"recall@{args.k}"] = recall(found_local, exact, args.k)
    row["http_equals_local"] = found_http == found_local
    row["disk_mb"] = sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 1e6
    return row


def crossover(sizes: list[int], queries: int, k: int) -> list[dict[str, Any]]:
    """Exact against IVF search alone (no store, no HTTP) at each size, alternating
    query by query: where exact search stops being cheap, i.e. the threshold."""
    import faiss

    from sync.store.embedded.vector_index import VectorIndex

    cipher = VectorCipher(WorkspaceKey.generate(), DIM)
    policy = IndexPolicy(exact_max_rows=1)  # IVF at every size
    out = []
    for n in sizes:
        corpus, plain = synthetic(n, queries, seed=n + 1)
        vectors = cipher.encrypt(corpus, chunk_ids(0, n))
        del corpus
        rids = np.arange(n, dtype=np.int64)
        queries_enc = np.stack([cipher.encrypt_query(q) for q in plain])
        exact = VectorIndex.exact(DIM, policy)
        exact.add(vectors, rids)
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        with Timer() as t:
            ivf = VectorIndex.build(DIM, n, lambda r=rids, v=vectors: iter([(r, v)]), policy)
        faiss.omp_set_num_threads(1)  # as the store searches
        times: dict[str, list[float]] = {"exact": [], "ivf": []}
        hits = 0
        for i, q in enumerate(queries_enc):
            found = {}
            for name in ("exact", "ivf") if i % 2 else ("ivf", "exact"):
                index = exact if name == "exact" else ivf
                started = time.perf_counter()
                _d, rows = index.search(q[None, :], k)
                times[name].append(time.perf_counter() - started)
                found[name] = set(rows[0, :10].tolist())
            hits += len(found["exact"] & found["ivf"])
        out.append({"rows": n, "exact_p50_ms": pct(times["exact"], 50),
                    "exact_p99_ms": pct(times["exact"], 99), "ivf_p50_ms": pct(times["ivf"], 50),
                    "ivf_p99_ms": pct(times["ivf"], 99), "ivf_build_s": t.seconds,
                    "ivf_recall@10": hits / (10 * len(queries_enc)), **ivf.describe()})
        print(f"crossover {n}: {out[-1]}", flush=True)
    return out


# -- report -----------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["rows"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, label, colour in (("local", "search, in-process", "C0"),
                                ("http", "search, HTTP", "C1"),
                                ("total", "embed + encrypt + HTTP search", "C2")):
        ax1.plot(sizes, [r[f"{name}_p50_ms"] for r in rows], marker="o", color=colour,
                 label=f"{label} p50")
        ax1.plot(sizes, [r[f"{name}_p99_ms"] for r in rows], marker="x", color=colour,
                 linestyle="--", label=f"{label} p99")
    ax1.set_ylabel("ms")
    ax1.set_title("query latency (k=100)")
    ax2.plot(sizes, [r["server_rss_mb"] for r in rows], marker="o", label="server RSS")
    ax2.plot(sizes, [r["snapshot_mb"] for r in rows], marker="o", label="index snapshot")
    ax2.set_ylabel("MB")
    ax2.set_title("memory and snapshot size")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("chunks in workspace")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, "query_latency")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--keep", type=Path, help="build under DIR and keep it")
    parser.add_argument("--crossover", default="10000,30000,60000,120000",
                        help="sizes for exact against IVF alone ('' to skip)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from indexer.embedder_registry import default_embedder

    work = args.keep or isolate()
    work.mkdir(parents=True, exist_ok=True)
    embedder = default_embedder()  # the model `codeveil search` embeds queries with
    embedder.embed(["load the model"])
    rows = []
    cross = crossover([int(s) for s in args.crossover.split(",") if s], 200, args.k)
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            rows.append(run_size(n, args, work, embedder))
            print(f"{n} rows done: {rows[-1]}", flush=True)
            if not args.keep:
                shutil.rmtree(work / f"ws{n}", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    headers = ["rows", "index", "embed p50", "local p50/p99", "http p50/p99",
               "total p50/p99", "sealed p50/p99", "sealed total p50/p99", "recall@10",
               f"recall@{args.k}", "RSS MB", "build s", "open s"]
    print(table(headers, [
        [r["rows"], _kind(r["index"]), r["embed_p50_ms"],
         f"{r['local_p50_ms']:.1f}/{r['local_p99_ms']:.1f}",
         f"{r['http_p50_ms']:.1f}/{r['http_p99_ms']:.1f}",
         f"{r['total_p50_ms']:.1f}/{r['total_p99_ms']:.1f}",
         f"{r['sealed_p50_ms']:.1f}/{r['sealed_p99_ms']:.1f}",
         f"{r['sealed_total_p50_ms']:.1f}/{r['sealed_total_p99_ms']:.1f}",
         r["recall@10"], r[f"recall@{args.k}"], r["server_rss_mb"], r["build_s"], r["open_s"]]
        for r in rows
    ]))
    if cross:
        print(table(["rows", "exact p50/p99 ms", "ivf p50/p99 ms", "ivf nlist/nprobe",
                     "ivf recall@10", "ivf build s"], [
            [c["rows"], f"{c['exact_p50_ms']:.1f}/{c['exact_p99_ms']:.1f}",
             f"{c['ivf_p50_ms']:.1f}/{c['ivf_p99_ms']:.1f}", f"{c['nlist']}/{c['nprobe']}",
             c["ivf_recall@10"], c["ivf_build_s"]] for c in cross
        ]))
    write_json("query_latency", {"k": args.k, "queries": args.queries,
                                 "policy": repr(IndexPolicy()), "crossover": cross,
                                 "results": rows})
    plot(rows)


def _kind(index: dict[str, Any] | None) -> str:
    if not index:
        return "?"
    if index["kind"] == "ivf":
        return f"ivf {index['nlist']}/{index['nprobe']}"
    return index["kind"]


if __name__ == "__main__":
    main()
