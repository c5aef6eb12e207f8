"""What a server that knows some of the code can learn from what it stores.

Builds a store from a real public tree plus a planted private module, then plays the
server: it holds the store's data dir, knows the embedding model and the chunker, and
knows the public part of the code (it chunks and embeds it itself). From the data dir
alone it runs:

    canaries        unique strings planted in the private module's code, names and path,
                    searched for in every byte of the data dir
    nearest         each stored vector labelled by its nearest public plain vector
    procrustes@k    k known (plain, stored) pairs; an orthogonal map with a scale fitted
                    to them, every other row mapped back and labelled by nearest neighbour
    ridge@k         the same with a ridge-regressed linear map
    seedless        no known pair: rows matched by their sorted distances to their
                    neighbours (scale-free), then Procrustes iterated on mutual matches
    id order        rows labelled by the rank of their row id against the sorted public
                    chunk list (a tree listing is enough for this)
    equal leaves    files with identical content that get identical leaf values
    query linking   a query sent twice, linked by distance and by its results; and the
                    query text picked out of a guess list with the best recovered map

    edit            one function of the private module edited and the repo indexed
                    again: rows of the file that come back with the id or bytes they had
                    (naming the edited chunk), and bytes of superseded rows still
                    anywhere in the data dir, read while the store is still open (as a
                    running server's) and again once it has closed; rows in pages
                    (sync.crypto.pages): also the superseded rows a kept page still holds, and
                    the pages the sync wrote and deleted, whose rows are all a server
                    can take for the file's (how many are, opened with the key)

The same tree is indexed twice, once per workspace mode: sealed (the default; each row
one envelope of vector and metadata, search on the client) and server-search. Each
attack is reported as a success rate beside its chance rate, for a plain-vector control
(what a server storing plain embeddings would give away), for the server-search store's
vectors at several betas (the stored beta is read back; other betas re-encrypt the same
plain vectors), and for the sealed store, whose rows hold no comparable vector (reported
at chance for every vector attack: there is nothing to compare; rows in pages name no
file, so the truth opens each with the key to learn its file). Beside each beta: the
recall the client keeps (encrypted top-100 re-ranked with the plain vectors, against
the plain top-10).

    structure       (--structure, a store behind `codeveil serve`, sealed or with
                    `--mode server-search`, no key and no vector needed) the stored
                    tree's shape, rows per file key, envelope lengths and row order
                    matched against the public tree chunked with our own chunker: public
                    files and chunks labelled, private files flagged, file category read
                    from the order; sealed, the store's cost (bytes held, requests and
                    bytes of a no-change and a one-file sync); a store whose rows are
                    in pages (sync.crypto.pages) is attacked as bench/privacy_pages.py says
    co-change       (--structure) an observer of many syncs: `--edits` times a random
                    file is edited and synced, the rows the store holds are listed after
                    each, and rows are grouped into files by the sync that added them

    python bench/privacy.py                      # the installed `requests` package
    python bench/privacy.py --tree PATH --betas 0.5,1,2,4,8
    python bench/privacy.py --structure          # the psf/requests mirror, hashing embedder
    python bench/privacy.py --structure --mode server-search
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import sqlite3
import sys
import textwrap
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Server, Timer, isolate, table, unpack_mirror, write_json
from bench.privacy_shapes import (
    PublicFile,
    Setup,
    StoredShape,
    ancestor_shapes,
    depths,
    narrow_one_to_one,
    public_shape,
    stored_node,
)

KNOWN_PAIRS = (10, 50, 100, 384)
BETAS = (0.5, 1.0, 2.0, 4.0, 8.0)
RERANK_CANDIDATES = 100
PROFILE_NEIGHBOURS = 48
SEEDLESS_ROUNDS = 12

# Plain-language searches a user of an HTTP library would run; also the attacker's
# guess list for recovering a query's text.
QUERIES = [
    "how are cookies persisted between requests",
    "retry a request when the connection fails",
    "set a timeout for the connection",
    "follow redirects and rebuild the authorization header",
    "encode form data for a POST body",
    "parse the content type header charset",
    "stream the response body in chunks",
    "verify TLS certificates with a custom CA bundle",
    "basic authentication with username and password",
    "digest authentication challenge",
    "read proxy settings from the environment",
    "raise an error for a 4xx or 5xx status code",
    "decode a JSON response",
    "build the full URL with query parameters",
    "merge session settings with request settings",
    "case insensitive dictionary for headers",
    "close the connection pool adapter",
    "guess the filename of an uploaded file object",
    "multipart file upload encoding",
    "detect the encoding of a response from its content",
    "prepare a request before sending it",
    "hooks called after a response arrives",
    "netrc file credentials lookup",
    "strip the authorization header on redirect to another host",
    "iterate over the lines of a streamed response",
    "convert a dictionary into a cookie jar",
    "mount a transport adapter for a URL prefix",
    "check whether a URL should bypass the proxy",
    "raise when too many redirects happen",
    "default user agent string",
]

PRIVATE_MODULE = '''
"""Internal billing reconciliation: not public code."""

import hashlib

{canary_const} = "{canary_value}"


class {canary_class}:
    """Reconciles invoices against the ledger of {canary_comment}."""

    def __init__(self, ledger, threshold=0.01):
        self.ledger = ledger
        self.threshold = threshold

    def {canary_func}(self, invoice):
        """Match an invoice to ledger entries and flag a mismatch above the threshold."""
        entries = [e for e in self.ledger if e.customer == invoice.customer]
        total = sum(e.amount for e in entries)
        if abs(total - invoice.amount) > self.threshold:
            return ("mismatch", invoice.number, total - invoice.amount)
        return ("ok", invoice.number, 0.0)

    def fingerprint(self, invoice):
        digest = hashlib.sha256(f"{{invoice.customer}}:{{invoice.number}}".encode())
        return digest.hexdigest()[:16]


def settle_quarter(accounts, rate):
    """Apply the quarterly interest rate to every overdue account."""
    for account in accounts:
        if account.overdue_days > 90:
            account.balance *= 1 + rate
    return accounts
'''


# -- the set-up (the client's side) ----------------------------------------------------


def default_tree() -> Path:
    import requests

    return Path(requests.__file__).resolve().parent


def build_repo(tree: Path, work: Path, *, server_search: bool,
               private_test: bool = False, server: tuple[str, Path] | None = None) -> Setup:
    """Index `tree` (as `<name>/`) plus a private module with canaries and a private copy
    of one public file, in the embedded store (or `server`: its URL and data dir), in the
    given mode; with `private_test` also a private file in the copied file's public
    directory."""
    from retrieval import Index
    from sync.checkout.config import load_config, store_path
    from sync.crypto.keys import load_key

    repo = work / ("repo-server-search" if server_search else "repo-sealed")
    prefix = tree.name
    shutil.copytree(tree, repo / prefix,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    tag = secrets.token_hex(6)
    canaries = [f"cvcanary{tag}{part}" for part in ("const", "value", "class", "func",
                                                    "comment", "path")]
    private = repo / "internal" / f"{canaries[5]}_billing.py"
    private.parent.mkdir(parents=True)
    private.write_text(textwrap.dedent(PRIVATE_MODULE).lstrip().format(
        canary_const=canaries[0].upper(), canary_value=canaries[1],
        canary_class=canaries[2].capitalize(), canary_func=canaries[3],
        canary_comment=canaries[4]))
    canaries[0], canaries[2] = canaries[0].upper(), canaries[2].capitalize()
    sources = sorted(p for p in (repo / prefix).rglob("*.py") if p.stat().st_size > 200)
    original = sources[len(sources) // 2]
    copy = repo / "internal" / f"vendored_{original.name}"
    shutil.copyfile(original, copy)
    beside = original.parent / f"test_{canaries[5]}.py"
    if private_test:
        beside.write_text(PRIVATE_TEST.lstrip())

    with Index(repo) as idx:
        idx.init(server_search=server_search, server=None if server is None else server[0])
        idx.index(wait=True)
    config = load_config(repo)
    return Setup(repo=repo, store_dir=store_path(repo) if server is None else server[1],
                 workspace_id=config.workspace_id,
                 key=load_key(config.workspace_id), canaries=canaries, public_prefix=prefix,
                 duplicate=(original.relative_to(repo).as_posix(),
                            copy.relative_to(repo).as_posix()),
                 private=private.relative_to(repo).as_posix(), sealed=config.sealed,
                 dim=config.dim,
                 private_test=beside.relative_to(repo).as_posix() if private_test else "")


def edit_and_reindex(setup: Setup, before: ServerView) -> dict[str, int]:
    """Edit one function of the private module, index again, and look at what the
    server can tell: rows of the file that kept their id or bytes, and superseded rows'
    bytes left anywhere in the data dir (rows in pages: `_edit_paged`)."""
    from bench.privacy_pages import is_paged
    from retrieval import Index

    if setup.sealed and is_paged(setup.store_dir):
        return _edit_paged(setup, before)
    from sync.crypto.ciphers import node_key
    from sync.store import fid_of

    fid = fid_of(node_key(setup.key, setup.private))
    old = [(c, m) for c, m, f in zip(before.chunk_ids, before.metas, before.fids, strict=True)
           if f == fid]
    _edit_the_private_module(setup)
    with Index(setup.repo) as idx:
        idx.index(wait=True)
        after = read_server(setup.store_dir)  # the store is still open here
        new = {(c, m) for c, m, f in zip(after.chunk_ids, after.metas, after.fids,
                                         strict=True) if f == fid}
        superseded = [m for c, m in old if (c, m) not in new]
        lingering_open = _lingering(setup.store_dir, superseded)
    kept_ids = len({c for c, _ in old} & {c for c, _ in new})
    kept_bytes = len({m for _, m in old} & {m for _, m in new})
    return {"file_rows_before": len(old), "file_rows_after": len(new),
            "rows_keeping_their_id": kept_ids, "rows_keeping_their_bytes": kept_bytes,
            "superseded_rows": len(superseded),
            "superseded_rows_on_disk_while_open": lingering_open,
            "superseded_rows_still_on_disk": _lingering(setup.store_dir, superseded)}


def _edit_the_private_module(setup: Setup) -> None:
    path = setup.repo / setup.private
    path.write_text(path.read_text().replace("account.balance *= 1 + rate",
                                             "account.balance *= 1 + rate / 4"))


def _edit_paged(setup: Setup, before: ServerView) -> dict[str, int]:
    """`edit_and_reindex` on a store whose rows are in pages (sync.crypto.pages). No leaf names
    the file's rows, so the truth opens every page row with the key (its file and
    version are inside); the server sees the file's leaf change and the pages the sync
    wrote and deleted, and takes the rows of the written pages for the file's."""
    from bench.privacy_pages import _opened, page_keys
    from retrieval import Index
    from sync.crypto.ciphers import node_key

    def file_rows(view: ServerView, value: bytes | None) -> list[tuple[bytes, bytes]]:
        """(row id, envelope) of the stored rows holding the private module's chunks
        (of the file version `value`, or any)."""
        at = {int(r): i for i, r in enumerate(view.rids)}
        return [(view.chunk_ids[at[rid]], view.metas[at[rid]])
                for rid, _, _, row in _opened(setup)
                if row is not None and row.meta.path == setup.private
                and (value is None or row.value == value)]

    leaf = node_key(setup.key, setup.private)  # type: ignore[arg-type]
    old = file_rows(before, None)
    pages_before = page_keys(setup.store_dir)
    _edit_the_private_module(setup)
    with Index(setup.repo) as idx:
        idx.index(wait=True)
        after = read_server(setup.store_dir)  # the store is still open here
        new = file_rows(after, after.leaves[leaf])
        pages_after = page_keys(setup.store_dir)
        # What the server groups: the rows of the pages this sync wrote, each opened.
        written = [row for _, page, _, row in _opened(setup)
                   if page in pages_after - pages_before]
        superseded = [m for c, m in old if (c, m) not in set(new)]
        lingering_open = _lingering(setup.store_dir, superseded)
    stored = set(after.metas)
    return {"file_rows_before": len(old), "file_rows_after": len(new),
            "rows_keeping_their_id": len({c for c, _ in old} & {c for c, _ in new}),
            "rows_keeping_their_bytes": len({m for _, m in old} & {m for _, m in new}),
            "superseded_rows": len(superseded),
            # Still rows of the store: a page is kept while any of its rows is live.
            "superseded_rows_still_stored": sum(1 for m in superseded if m in stored),
            "superseded_rows_on_disk_while_open": lingering_open,
            "superseded_rows_still_on_disk": _lingering(setup.store_dir, superseded),
            "pages_written": len(pages_after - pages_before),
            "pages_deleted": len(pages_before - pages_after),
            "rows_in_pages_written": len(written),
            "of_them_the_files": sum(1 for r in written
                                     if r is not None and r.meta.path == setup.private),
            "of_them_other_files": sum(1 for r in written
                                       if r is not None and r.meta.path != setup.private),
            "of_them_padding": sum(1 for r in written if r is None)}


def _lingering(store_dir: Path, superseded: list[bytes]) -> int:
    """How many of the `superseded` rows' bytes some file of the data dir still holds."""
    blobs = [f.read_bytes() for f in store_dir.rglob("*") if f.is_file()]
    return sum(1 for m in superseded if any(m[:48] in data for data in blobs))


# -- what the server holds -------------------------------------------------------------


@dataclass
class ServerView:
    rids: np.ndarray
    fids: list[int]  # the leaf each row is stored with: its file's, or its page's
    chunk_ids: list[bytes]
    vectors: np.ndarray | None  # None where rows hold nothing comparable
    metas: list[bytes]
    leaves: dict[bytes, bytes]  # node key -> value, files only


def read_server(store_dir: Path) -> ServerView:
    """The rows and leaves, read from the data dir's files as the server stores them: a
    sealed workspace's rows in its tree.sqlite, a server-search one's in LanceDB."""
    (ws_dir,) = [p for p in (store_dir / "workspaces").iterdir() if p.is_dir()]
    conn = sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro", uri=True)
    try:
        leaves = {stored_node(k): bytes(v) for k, v in conn.execute(
            "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")}
        sealed = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                              " AND name = 'rows'").fetchone() is not None
        stored = (conn.execute("SELECT rid, fid, chunk_id, meta FROM rows ORDER BY rid")
                  .fetchall() if sealed else [])
    finally:
        conn.close()
    if sealed:
        return ServerView(
            rids=np.asarray([r[0] for r in stored], dtype=np.int64),
            fids=[r[1] for r in stored], chunk_ids=[bytes(r[2]) for r in stored],
            vectors=None, metas=[bytes(r[3]) for r in stored], leaves=leaves)
    import lancedb

    rows = lancedb.connect(ws_dir).open_table("chunks").to_arrow()
    return ServerView(
        rids=np.asarray(rows.column("rid").to_pylist(), dtype=np.int64),
        fids=rows.column("fid").to_pylist(),
        chunk_ids=[bytes(c) for c in rows.column("chunk_id").to_pylist()],
        vectors=np.asarray(rows.column("vector").to_pylist(), dtype=np.float32),
        metas=[bytes(m) for m in rows.column("meta").to_pylist()],
        leaves=leaves)


# -- ground truth and the attacker's knowledge -----------------------------------------


@dataclass
class Truth:
    """Row i of the server view is public chunk labels[i] (or -1: private), with its
    plain vector plain[i]; `known` are the attacker's own embeddings of the public code."""

    labels: np.ndarray
    plain: np.ndarray
    known: np.ndarray
    known_files: list[str]
    row_files: list[str]
    public_order: list[int] = field(default_factory=list)


def ground_truth(setup: Setup, view: ServerView) -> Truth:
    from bench.privacy_pages import _opened
    from indexer.chunker import chunk_file
    from indexer.embed_cache import CachedEmbedder, EmbeddingCache
    from indexer.embedder_registry import default_embedder
    from sync.crypto.ciphers import open_meta

    embedder = CachedEmbedder(default_embedder(), EmbeddingCache())
    # A sealed row opens under the leaf it is stored with: its file's, or (rows in
    # pages) its page's; either way the row names its file inside.
    sealed = {rid: row for rid, _, _, row in _opened(setup)} if setup.sealed else {}
    chunks = []
    for path in sorted(setup.repo.rglob("*.py")):
        rel = path.relative_to(setup.repo).as_posix()
        if rel.startswith(".codeveil"):
            continue
        chunks.extend(chunk_file(rel, path.read_text()))
    vectors = embedder.embed([c.embed_text for c in chunks]).vectors
    by_hash = {(c.path, c.chunk_hash): i for i, c in enumerate(chunks)}
    public = [i for i, c in enumerate(chunks) if c.path.startswith(setup.public_prefix + "/")]
    public_index = {i: n for n, i in enumerate(public)}

    labels, plain, row_files = [], [], []
    for rid, cid, blob in zip(view.rids, view.chunk_ids, view.metas, strict=True):
        opened = sealed[int(rid)] if setup.sealed else None
        if setup.sealed and opened is None:  # a padding row: no chunk, no public label
            labels.append(-1)
            plain.append(np.zeros(setup.dim, np.float32))
            row_files.append("")
            continue
        meta = (opened.meta if opened is not None
                else open_meta(setup.key, setup.workspace_id, cid, blob))
        i = by_hash[(meta.path, meta.chunk_hash)]
        labels.append(public_index.get(i, -1))
        plain.append(vectors[i])
        row_files.append(meta.path)
    return Truth(labels=np.asarray(labels), plain=np.asarray(plain, dtype=np.float32),
                 known=np.asarray(vectors[public], dtype=np.float32),
                 known_files=[chunks[i].path for i in public], row_files=row_files,
                 public_order=sorted(range(len(public)),
                                     key=lambda n: (chunks[public[n]].path,
                                                    chunks[public[n]].start_line)))


# -- the attacks -----------------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _nearest(estimates: np.ndarray, known: np.ndarray) -> np.ndarray:
    return np.argmax(_unit(estimates) @ _unit(known).T, axis=1)


def _accuracy(pred: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> float:
    return float(np.mean(pred[rows] == labels[rows])) if len(rows) else 0.0


def attack_nearest(stored: np.ndarray, t: Truth) -> float:
    public = np.flatnonzero(t.labels >= 0)
    return _accuracy(_nearest(stored, t.known), t.labels, public)


def _procrustes(plain: np.ndarray, stored: np.ndarray) -> tuple[np.ndarray, float]:
    """Q orthogonal and s > 0 minimising |s plain Q - stored|."""
    u, sigma, vt = np.linalg.svd(plain.T @ stored)
    q = u @ vt
    return q, float(sigma.sum() / max((plain**2).sum(), 1e-12))


def attack_known_pairs(stored: np.ndarray, t: Truth, k: int, method: str,
                       rng: np.random.Generator) -> tuple[float | None, float | None]:
    """(labelling accuracy on the other public rows, mean cosine of the recovered private
    vectors to the truth) with k known pairs; None when k leaves no other public row."""
    public = np.flatnonzero(t.labels >= 0)
    if k >= len(public):
        return None, None
    seeds = rng.choice(public, size=min(k, len(public)), replace=False)
    others = np.setdiff1d(public, seeds)
    plain, enc = t.known[t.labels[seeds]], stored[seeds]
    if method == "procrustes":
        q, s = _procrustes(plain, enc)
        estimates = stored @ q.T / s
    else:
        scale = float(np.median(np.linalg.norm(stored, axis=1)))
        x = enc / scale
        alpha = 1e-2 * max(float(np.trace(x.T @ x)) / x.shape[1], 1e-12)
        w = np.linalg.solve(x.T @ x + alpha * np.eye(x.shape[1]), x.T @ plain)
        estimates = (stored / scale) @ w
    acc = _accuracy(_nearest(estimates, t.known), t.labels, others)
    return acc, _private_cosine(estimates, t)


def _private_cosine(estimates: np.ndarray, t: Truth) -> float:
    private = np.flatnonzero(t.labels < 0)
    if not len(private):
        return 0.0
    return float(np.mean(np.sum(_unit(estimates[private]) * _unit(t.plain[private]), axis=1)))


def _profiles(x: np.ndarray) -> np.ndarray:
    """Each row's sorted distances to its nearest neighbours, over the set's median
    distance: invariant to rotation and scale, blurred only by the perturbation."""
    sq = np.sum(x**2, axis=1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0))
    np.fill_diagonal(d, np.inf)
    near = np.sort(d, axis=1)[:, :PROFILE_NEIGHBOURS]
    return near / np.median(d[np.isfinite(d)])


def attack_seedless(stored: np.ndarray, t: Truth) -> tuple[float, float, np.ndarray]:
    """No known pair. Returns (accuracy, private cosine, the recovered map's estimates)."""
    public = np.flatnonzero(t.labels >= 0)
    ps, pk = _profiles(stored), _profiles(t.known)
    cost = (np.sum(ps**2, axis=1)[:, None] + np.sum(pk**2, axis=1)[None, :]
            - 2 * ps @ pk.T)
    guess = np.argmin(cost, axis=1)
    part = np.partition(cost, 1, axis=1)
    margin = part[:, 1] - part[:, 0]
    seeds = np.argsort(-margin)[: max(len(stored) // 4, 8)]
    estimates = stored
    for _ in range(SEEDLESS_ROUNDS):
        q, s = _procrustes(t.known[guess[seeds]], stored[seeds])
        estimates = stored @ q.T / s
        sim = _unit(estimates) @ _unit(t.known).T
        guess = np.argmax(sim, axis=1)
        back = np.argmax(sim, axis=0)
        mutual = np.flatnonzero(back[guess] == np.arange(len(stored)))
        if len(mutual) < 8:
            break
        seeds = mutual
    return _accuracy(guess, t.labels, public), _private_cosine(estimates, t), estimates


def attack_id_order(view: ServerView, t: Truth) -> tuple[float, float]:
    """Rows sorted by id against the sorted public chunk list: (chunk, file) accuracy."""
    public = np.flatnonzero(t.labels >= 0)
    order = np.argsort(view.rids)
    n, m = len(order), len(t.public_order)
    pred = np.full(n, -1)
    for rank, row in enumerate(order):
        pred[row] = t.public_order[min(m - 1, rank * m // n)]
    chunk = _accuracy(pred, t.labels, public)
    files = float(np.mean([t.known_files[pred[r]] == t.row_files[r] for r in public]))
    return chunk, files


def id_order_file_chance(t: Truth) -> float:
    """The file accuracy of labelling by id order when rows are in random order: a row of
    file f is labelled with f as often as f's share of the chunk list."""
    from collections import Counter

    listed = Counter(t.known_files)
    public = np.flatnonzero(t.labels >= 0)
    return float(np.mean([listed[t.row_files[r]] / len(t.known_files) for r in public]))


def attack_equal_leaves(setup: Setup, view: ServerView) -> tuple[int, int, bool]:
    """(groups of identical files, of them with identical leaf values, planted copy named)."""
    import xxhash

    from sync.crypto.ciphers import node_key

    groups: dict[bytes, list[str]] = defaultdict(list)
    for path in setup.repo.rglob("*"):
        rel = path.relative_to(setup.repo).as_posix()
        if path.is_file() and not rel.startswith(".codeveil"):
            groups[xxhash.xxh3_128_digest(path.read_bytes())].append(rel)
    dupes = [paths for paths in groups.values() if len(paths) > 1]

    def value(rel: str) -> bytes | None:
        return view.leaves.get(node_key(setup.key, rel))

    linked = sum(1 for paths in dupes if len({value(p) for p in paths}) == 1
                 and value(paths[0]) is not None)
    a, b = setup.duplicate
    return len(dupes), linked, value(a) is not None and value(a) == value(b)


def attack_queries(stored: np.ndarray, t: Truth, encrypt, queries: np.ndarray,
                   decrypt) -> dict[str, float]:
    """A query sent twice, linked by distance and by top-10 results; its text recovered
    from a guess list with the attacker's best map (`decrypt`, or None)."""
    first = np.stack([encrypt(q) for q in queries])
    second = np.stack([encrypt(q) for q in queries])
    d = np.linalg.norm(first[:, None, :] - second[None, :, :], axis=2)
    by_distance = float(np.mean(np.argmin(d, axis=1) == np.arange(len(queries))))

    def top(x: np.ndarray) -> list[set[int]]:
        dist = np.linalg.norm(x[:, None, :] - stored[None, :, :], axis=2)
        return [set(np.argsort(row)[:10].tolist()) for row in dist]

    a, b = top(first), top(second)
    overlap = np.array([[len(x & y) / len(x | y) for y in b] for x in a])
    by_results = float(np.mean(np.argmax(overlap, axis=1) == np.arange(len(queries))))
    guessed = 0.0
    if decrypt is not None:
        guessed = float(np.mean(_nearest(decrypt(first), queries) == np.arange(len(queries))))
    return {"link_distance": by_distance, "link_results": by_results, "query_text": guessed}


def client_recall(stored: np.ndarray, t: Truth, encrypt, queries: np.ndarray) -> float:
    """Plain top-10 found by the encrypted top-100 re-ranked with the plain vectors."""
    hits = 0
    for q in queries:
        truth = set(np.argsort(-(t.plain @ q))[:10].tolist())
        enc = encrypt(q)
        candidates = np.argsort(np.linalg.norm(stored - enc, axis=1))[:RERANK_CANDIDATES]
        reranked = candidates[np.argsort(-(t.plain[candidates] @ q))][:10]
        hits += len(truth & set(reranked.tolist()))
    return hits / (10 * len(queries))


def scan_canaries(store_dir: Path, canaries: list[str]) -> int:
    needles = [n for c in canaries
               for n in (c.encode(), c.lower().encode(), c.encode("utf-16-le"))]
    hits = 0
    for path in store_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += sum(data.count(n) for n in needles)
    return hits


# -- the structure attack: no key, no vector, only the shape of what is stored ----------


def read_shape(store_dir: Path, *, sealed: bool = True) -> StoredShape:
    """The tree from tree.sqlite; the rows from it too (sealed) or from the LanceDB
    table (server-search), in rid order: the order the server took them in."""
    from sync.store import fid_of

    (ws_dir,) = [p for p in (store_dir / "workspaces").iterdir() if p.is_dir()]
    conn = sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro", uri=True)
    try:
        nodes = [(stored_node(k), None if p is None else stored_node(p), bool(d))
                 for k, p, d in conn.execute("SELECT key, parent, is_dir FROM nodes")]
        stored = (conn.execute("SELECT rid, fid, length(meta) FROM rows ORDER BY rid")
                  .fetchall() if sealed else [])
    finally:
        conn.close()
    if not sealed:
        stored = sorted((rid, fid, len(meta)) for rid, fid, _, meta in _lance_rows(ws_dir))
    by_fid = {fid_of(k): k for k, _, d in nodes if not d}
    rows: dict[bytes, list[tuple[int, int]]] = {k: [] for k, _, d in nodes if not d}
    for rid, fid, length in stored:
        rows[by_fid[fid]].append((int(rid), int(length)))
    return StoredShape(parent={k: p for k, p, _ in nodes}, is_dir={k: d for k, _, d in nodes},
                       rows=rows)


def _lance_rows(ws_dir: Path) -> list[tuple[int, int, bytes, bytes]]:
    """A server-search workspace's rows as stored: (rid, fid, chunk id, meta)."""
    import lancedb

    rows = lancedb.connect(ws_dir).open_table("chunks").to_arrow()
    return list(zip(rows.column("rid").to_pylist(), rows.column("fid").to_pylist(),
                    [bytes(c) for c in rows.column("chunk_id").to_pylist()],
                    [bytes(m) for m in rows.column("meta").to_pylist()], strict=True))


def public_files(repo: Path, private: set[str], dim: int, *,
                 sealed: bool = True, paged: bool = False) -> dict[str, PublicFile]:
    """The attacker's side: the public files as our walker and chunker see them, each
    chunk's envelope length from sealing its metadata under a key of its own (the length
    does not depend on the key): a sealed row's envelope (`paged`: a page row's), or a
    server-search row's metadata envelope."""
    from indexer.definitions import chunk_and_define
    from indexer.walk import SourceFile, read_source, walk_repo
    from sync.crypto.ciphers import ChunkMeta, seal_meta
    from sync.crypto.keys import WorkspaceKey
    from sync.crypto.sealed_rows import RowSealer

    own = WorkspaceKey(os.urandom(32))
    sealer = RowSealer(own, "attacker", dim)
    zero = np.zeros(dim, np.float32)

    def length(meta: ChunkMeta) -> int:
        if paged:
            return len(sealer.seal_in_page(bytes(16), bytes(16), bytes(16), meta, zero))
        return len(sealer.seal(bytes(16), bytes(16), meta, zero) if sealed
                   else seal_meta(own, "attacker", bytes(16), meta))

    out: dict[str, PublicFile] = {}
    for entry in walk_repo(repo).files:
        if entry.path in private or entry.path.startswith(".codeveil"):
            continue
        source = read_source(repo, entry.path)
        if not isinstance(source, SourceFile):
            continue
        chunks, _ = chunk_and_define(entry.path, source.text)
        lengths = [length(ChunkMeta(
            path=c.path, start_line=c.start_line, end_line=c.end_line, symbol=c.symbol,
            language=c.language, chunk_hash=c.chunk_hash)) for c in chunks]
        out[entry.path] = PublicFile(entry.path, lengths,
                                     [(c.chunk_hash, c.start_line) for c in chunks])
    return out


def _rows_for(n: int) -> int:
    """How many rows the store holds for a file of n chunks (its padding, if any)."""
    from sync.crypto import sealed_rows
    pad = getattr(sealed_rows, "padded_row_count", None)
    return n if pad is None else int(pad(n))


def attack_structure(shape: StoredShape, public: dict[str, PublicFile],
                     truth: dict[bytes, str], row_truth: dict[bytes, list[int]],
                     rows_for: Callable[[int], int] | None = None) -> dict[str, object]:
    """Label the stored files and rows with public ones from structure alone.

    A stored file's candidates are the public files whose rows it could be: as many rows
    as the file's chunks take in the store, each chunk's envelope length among the
    stored ones, at the same depth (where stored files differ in depth); narrowed to
    those under directories of the same shape (files and directories per directory, up
    to the root) where any are; then a
    file that is the only candidate left for some stored file is taken off the others'
    lists, until nothing changes. A file with no candidate is flagged as not public.
    Rows are labelled within a labelled file by their rank (upload order) or by their
    length, whichever labels more. Rates are expected values (a guess among k is right
    1/k of the time; `row_truth` is, per stored file, the chunk index each row in rid
    order holds, -1 for padding). The file category is read off the upload order: files sorted by
    their first row, cut where the public counts of source, tests and other fall.
    `rows_for`: how many rows the store holds for a file of n chunks (default: the
    sealed padding)."""
    from collections import Counter

    from indexer.priority import category

    s_parent, s_dir = shape.parent, shape.is_dir
    p_parent, p_dir = public_shape(sorted(public))
    s_depth, p_depth = depths(s_parent), depths(p_parent)
    s_anc, p_anc = ancestor_shapes(s_parent, s_dir), ancestor_shapes(p_parent, p_dir)
    stored_files = [k for k, d in s_dir.items() if not d]
    p_counts = {p: Counter(f.lengths) for p, f in public.items()}
    by_rows: dict[int, list[str]] = defaultdict(list)
    for p, f in public.items():
        by_rows[(rows_for or _rows_for)(len(f.lengths))].append(p)

    # Where every stored file sits at one depth, the depth says nothing of the path.
    by_depth = len({s_depth[s] for s in stored_files}) > 1
    cands: dict[bytes, set[str]] = {}
    for s in stored_files:
        lengths = Counter(length for _, length in shape.rows[s])
        fit = {p for p in by_rows.get(len(shape.rows[s]), [])
               if (p_depth[p] == s_depth[s] or not by_depth) and not p_counts[p] - lengths}
        exact = {p for p in fit if p_anc[p] == s_anc[s]}
        cands[s] = exact or fit
    # Flagged: no public file fits at all (before the one-to-one step below, whose
    # guesses can leave a public file without candidates too).
    unfit = {s for s, c in cands.items() if not c}
    narrow_one_to_one(cands)

    public_keys = [s for s in stored_files if truth.get(s) in public]
    private_keys = [s for s in stored_files if s in truth and truth[s] not in public]

    def file_score(s: bytes) -> float:
        return 1.0 / len(cands[s]) if truth[s] in cands[s] else 0.0

    chunk_hits = {"order": 0.0, "length": 0.0}
    chunks_multi = {"order": 0.0, "length": 0.0}
    n_chunks = n_multi = 0
    for s in public_keys:
        f = public[truth[s]]
        n_real = len(f.lengths)
        n_chunks += n_real
        n_multi += n_real if n_real > 1 else 0
        p_file = file_score(s)
        if not p_file:
            continue
        per_length = Counter(f.lengths)
        # By upload order: the k-th row by rid taken for the k-th chunk. By length: a
        # row taken for one of the chunks of its envelope length.
        by_order = sum(1 for k, chunk in enumerate(row_truth[s]) if chunk == k)
        by_length = sum(1.0 / per_length[f.lengths[chunk]] for chunk in row_truth[s]
                        if chunk >= 0)
        for name, hits in (("order", by_order), ("length", by_length)):
            chunk_hits[name] += p_file * hits
            if n_real > 1:
                chunks_multi[name] += p_file * hits
    files_multi = [s for s in public_keys if len(public[truth[s]].lengths) > 1]
    flagged_private = sum(1 for s in private_keys if s in unfit)
    flagged_public = sum(1 for s in public_keys if s in unfit)
    copy_candidates = {truth[s]: len(cands[s]) for s in private_keys if cands[s]}

    # Category from upload order.
    firsts = sorted((min(r for r, _ in shape.rows[s]), s) for s in public_keys
                    if shape.rows[s])
    cats = Counter(category(p) for p in public)
    cut, guess = 0, {}
    ordered = [s for _, s in firsts]
    for c in sorted(cats):
        share = round(cats[c] * len(ordered) / max(sum(cats.values()), 1))
        for s in ordered[cut: cut + share]:
            guess[s] = c
        cut += share
    for s in ordered[cut:]:
        guess[s] = max(cats)
    cat_right = float(np.mean([guess[s] == category(truth[s]) for s in ordered]))
    shares = np.array([cats[c] / sum(cats.values()) for c in cats])
    return {
        "stored_files": len(stored_files), "public_files": len(public_keys),
        "private_files": len(private_keys), "public_chunks": n_chunks,
        "file_labelled": float(np.mean([file_score(s) for s in public_keys])),
        "file_labelled_multi": float(np.mean([file_score(s) for s in files_multi]))
        if files_multi else 0.0,
        "files_multi": len(files_multi),
        "file_chance": 1.0 / len(public), "file_chance_multi": 1.0 / max(len(files_multi), 1),
        "chunk_labelled": max(chunk_hits.values()) / max(n_chunks, 1),
        "chunk_labelled_by": max(chunk_hits, key=lambda k: chunk_hits[k]),
        "chunk_labelled_multi": max(chunks_multi.values()) / max(n_multi, 1),
        "chunk_chance": 1.0 / max(n_chunks, 1), "chunk_chance_multi": 1.0 / max(n_multi, 1),
        "private_flagged": flagged_private, "public_flagged": flagged_public,
        "private_flag_rate": flagged_private / max(len(private_keys), 1),
        "public_flag_rate": flagged_public / max(len(public_keys), 1),
        "private_copy_candidates": copy_candidates,
        "category_from_order": cat_right, "category_chance": float(np.sum(shares**2)),
        "max_depth": max(s_depth.values()),
        "root_children": sum(1 for p in s_parent.values() if p is not None
                             and s_parent[p] is None),
    }


def structure_truth(setup: Setup, public: dict[str, PublicFile]
                    ) -> tuple[dict[bytes, str], dict[bytes, list[int]]]:
    """With the key: each stored file's path, and the public chunk index each of its rows
    holds in rid order (-1 for a private chunk or a padding row)."""
    from indexer.walk import walk_repo
    from sync.crypto.ciphers import node_key, open_meta
    from sync.crypto.sealed_rows import RowSealer
    from sync.store import fid_of

    paths = {node_key(setup.key, e.path): e.path for e in walk_repo(setup.repo).files}
    by_fid = {fid_of(k): k for k in paths}
    sealer = RowSealer(setup.key, setup.workspace_id, setup.dim)
    (ws_dir,) = [p for p in (setup.store_dir / "workspaces").iterdir() if p.is_dir()]
    if setup.sealed:
        with contextlib.closing(sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro",
                                                uri=True)) as conn:
            stored = conn.execute("SELECT chunk_id, fid, meta FROM rows ORDER BY rid"
                                  ).fetchall()
    else:
        stored = [(c, f, m) for _, f, c, m in sorted(_lance_rows(ws_dir))]
    rows: dict[bytes, list[int]] = defaultdict(list)
    index = {p: {c: i for i, c in enumerate(f.chunks)} for p, f in public.items()}
    for cid, fid, blob in stored:
        key = by_fid[fid]
        if setup.sealed:
            meta = getattr(sealer.open(bytes(cid), key, bytes(blob)), "meta", None)
        else:
            meta = open_meta(setup.key, setup.workspace_id, bytes(cid), bytes(blob))
        rows[key].append(-1 if meta is None else
                         index.get(meta.path, {}).get((meta.chunk_hash, meta.start_line), -1))
    return paths, rows


def padding_schemes(public: dict[str, PublicFile]) -> list[dict[str, object]]:
    """What other row buckets would cost and leave: for each scheme, the rows stored per
    chunk, and the share of files (of files with more than one chunk) an attacker labels
    from the row count alone (a file among k of the same count: 1/k)."""
    from collections import Counter

    from sync.crypto import sealed_rows
    counts = [len(f.lengths) for f in public.values()]
    top = max(counts)

    def geometric(ratio: float):
        def pad(n: int) -> int:
            size = 1
            while size < n:
                size = max(size + 1, int(size * ratio))
            return size
        return pad

    schemes = {"none": lambda n: n}
    if hasattr(sealed_rows, "padded_row_count"):  # the codeveil measured pads rows
        schemes["ROW_BUCKETS (steps of 1.5x)"] = sealed_rows.padded_row_count
    schemes.update({"powers of 2": geometric(2), "powers of 4": geometric(4),
                    "every file as the largest": lambda n: top})
    out = []
    for name, pad in schemes.items():
        padded = [max(pad(n), 1) for n in counts]
        same = Counter(padded)
        multi = [s for s, n in zip(padded, counts, strict=True) if n > 1]
        out.append({"scheme": name, "rows_per_chunk": sum(padded) / max(sum(counts), 1),
                    "file_labelled": float(np.mean([1 / same[s] for s in padded])),
                    "file_labelled_multi": float(np.mean([1 / same[s] for s in multi]))
                    if multi else 0.0})
    return out


def stored_rows(setup: Setup) -> dict[int, tuple[int, bytes]]:
    """rid -> the file version the row belongs to, (fid, blob value), as the store records
    it (the truth the co-change attack is scored against); server-search rows have no
    blob, and a file's rows leave when it is sent again: (fid, b"")."""
    (ws_dir,) = [p for p in (setup.store_dir / "workspaces").iterdir() if p.is_dir()]
    if not setup.sealed:
        return {int(rid): (int(fid), b"") for rid, fid, _, _ in _lance_rows(ws_dir)}
    with contextlib.closing(sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro",
                                            uri=True)) as conn:
        return {int(rid): (int(fid), bytes(value or b"")) for rid, fid, value in
                conn.execute("SELECT rid, fid, value FROM rows")}


def current_versions(setup: Setup) -> set[tuple[int, bytes]]:
    """The file versions some leaf names now (sealed: blobs not orphaned)."""
    (ws_dir,) = [p for p in (setup.store_dir / "workspaces").iterdir() if p.is_dir()]
    if not setup.sealed:
        return {(int(fid), b"") for _, fid, _, _ in _lance_rows(ws_dir)}
    with contextlib.closing(sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro",
                                            uri=True)) as conn:
        return {(int(fid), bytes(value)) for fid, value in
                conn.execute("SELECT fid, value FROM blobs WHERE orphaned IS NULL")}


def attack_cochange(setup: Setup, editable: list[str], edits: int, seed: int, *,
                    paged: bool = False) -> dict[str, object]:
    """An observer of many syncs: `edits` times, a random file of `editable` gets a line
    appended and the repo is synced; after each sync the observer lists the row ids the
    store holds, and groups the rows it ends with by the sync that added them (rows that
    came in together are taken for one file). Scored against the file versions the rows
    belong to: the share of current files whose row set is one group exactly, and
    pairwise (of the row pairs put together, the share that are one file's; of one
    file's pairs, the share put together), beside chance (a pair of rows picked at
    random is one file's). Also the same scores for grouping by the columns a row
    carries (its fid, and in a sealed store its blob value): what the observer needs no
    sync for. `paged` (sync.crypto.pages): the truth is each row's file version opened with the
    key; padding rows and rows of superseded versions a kept page still holds belong to
    no file and are left out of the scores (the observer cannot tell them, so this
    favours it); the pages each sync writes and deletes are counted."""
    import random

    from bench.privacy_pages import (
        current_file_versions,
        page_keys,
        paths_in,
        row_columns,
        row_kinds,
        row_versions,
    )
    from retrieval import Index
    from sync.crypto.pages import PAGE_ROWS

    def observe() -> dict[int, tuple[int, bytes]]:
        return row_columns(setup.store_dir) if paged else stored_rows(setup)

    rng = random.Random(seed)
    seen = observe()
    added_in = dict.fromkeys(seen, 0)
    edited: set[str] = set()
    written: list[int] = []
    deleted: list[int] = []
    # Of the rows in the pages a one-file sync writes: the edited file's, the others'.
    own_rows: list[int] = []
    other_rows: list[int] = []
    pages = page_keys(setup.store_dir) if paged else set()
    with Index(setup.repo) as idx:
        for n in range(1, edits + 1):
            path = rng.choice(editable)
            target = setup.repo / path
            target.write_text(target.read_text() + f"\n# edit {n}\n")
            idx.index(wait=True)
            edited.add(path)
            now = observe()
            added_in.update(dict.fromkeys(now.keys() - seen.keys(), n))
            seen = now
            if paged:
                after = page_keys(setup.store_dir)
                written.append(len(after - pages))
                deleted.append(len(pages - after))
                held = paths_in(setup, after - pages)
                own_rows.append(sum(1 for p in held if p == path))
                other_rows.append(sum(1 for p in held if p is not None and p != path))
                pages = after
    if paged:
        truth = {rid: v for rid, v in row_versions(setup).items() if v is not None}
        current = set(truth.values())
        files_current = len(current_file_versions(setup))
    else:
        truth, current = seen, current_versions(setup)
        files_current = len(current)
    by_sync: dict[int, set[int]] = defaultdict(set)
    for rid in seen:
        by_sync[added_in[rid]].add(rid)
    by_columns: dict[object, set[int]] = defaultdict(set)
    for rid, version in seen.items():
        by_columns[version if setup.sealed else version[0]].add(rid)
    out: dict[str, object] = {
        "edits": edits, "files_edited": len(edited), "files_current": files_current,
        "files_with_rows": len(current), "rows": len(seen), "rows_scored": len(truth),
        "syncs_with_new_rows": len(by_sync) - (0 in by_sync),
        "by_cochange": _grouping_scores(truth, current, list(by_sync.values())),
        "by_row_columns": _grouping_scores(truth, current, list(by_columns.values()))}
    if paged:
        out.update({"pages_at_the_end": len(pages), "rows_at_the_end": row_kinds(setup),
                    "pages_written_per_sync": {"mean": float(np.mean(written)),
                                               "max": max(written), "min": min(written)},
                    "pages_deleted_per_sync": {"mean": float(np.mean(deleted)),
                                               "max": max(deleted), "min": min(deleted)},
                    # What linking a sync's changed leaf to the pages it writes gives.
                    "rows_in_new_pages": {
                        "edited_file": sum(own_rows), "other_files": sum(other_rows),
                        "padding": PAGE_ROWS * sum(written) - sum(own_rows) - sum(other_rows),
                        "syncs_holding_only_the_edited_file":
                            sum(1 for n in other_rows if n == 0),
                        "syncs_writing_ceil_of_the_file_rows_pages": sum(
                            1 for w, n in zip(written, own_rows, strict=True)
                            if w == -(-n // PAGE_ROWS))}})
    return out


def _grouping_scores(rows: dict[int, tuple[int, bytes]], current: set[tuple[int, bytes]],
                     groups: list[set[int]]) -> dict[str, float]:
    """How well `groups` (a partition of the rows) recovers the file versions of `rows`;
    a row of a group that `rows` lacks (one of no file) is left out of it."""
    from collections import Counter

    groups = [g & rows.keys() for g in groups]
    groups = [g for g in groups if g]
    truth: dict[tuple[int, bytes], set[int]] = defaultdict(set)
    for rid, version in rows.items():
        truth[version].add(rid)
    as_sets = {frozenset(g) for g in groups}
    exact = sum(1 for v in current if frozenset(truth[v]) in as_sets)

    def pairs(n: int) -> int:
        return n * (n - 1) // 2

    together = sum(pairs(len(g)) for g in groups)
    same = sum(pairs(len(t)) for t in truth.values())
    both = sum(pairs(c) for g in groups for c in Counter(rows[r] for r in g).values())
    return {"files_exact": exact / max(len(current), 1),
            "pair_precision": both / max(together, 1),
            "pair_recall": both / max(same, 1),
            "pair_chance": same / max(pairs(len(rows)), 1)}


PRIVATE_TEST = '''
"""Tests of the internal billing reconciliation."""


def test_settle_quarter_leaves_recent_accounts():
    assert settle_quarter([], 0.02) == []
'''


def run_structure(args: argparse.Namespace) -> int:
    """The structure attack on a store (sealed, or server-search with `--mode`) of a
    public tree with private files in it; the co-change attack of an observer of many
    syncs; and, sealed, what the store costs: its bytes, and the requests and bytes of
    the syncs a user runs most (nothing changed; one file edited)."""
    from bench.privacy_pages import attack_paged_structure, is_paged, paged_truth
    from retrieval import Index

    os.environ.setdefault("CODEVEIL_EMBEDDER", "hashing")
    sealed = args.mode == "sealed"
    base = isolate()
    server = Server(base / "server-data")
    cost: dict[str, object] = {}
    try:
        commit = None
        tree = args.tree
        if tree is None:
            tree = base / "public" / args.mirror.split("/")[-1]
            commit = unpack_mirror(args.mirror, tree)
        with Timer() as first:
            setup = build_repo(tree, base, server_search=not sealed, private_test=True,
                               server=(server.url, server.data_dir))
        shape = read_shape(setup.store_dir, sealed=sealed)
        private = {setup.private, setup.duplicate[1], setup.private_test}
        paged = sealed and is_paged(setup.store_dir)
        public = public_files(setup.repo, private, setup.dim, sealed=sealed, paged=paged)
        if paged:
            attack = attack_paged_structure(shape, public, paged_truth(setup, public))
        else:
            truth, row_truth = structure_truth(setup, public)
            attack = attack_structure(shape, public, truth, row_truth,
                                      None if sealed else lambda n: n)
        schemes = padding_schemes(public)
        edit = server_search_edit(tree, base / "edit")
        if sealed:
            cost = sync_cost(setup, Index, first.seconds, paged=paged)
        editable = sorted([p for p, f in public.items() if f.lengths] + sorted(private))
        cochange = attack_cochange(setup, editable, args.edits, args.seed, paged=paged)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)

    def pct(v: object) -> str:
        return f"{100 * float(v):.2f}%"  # type: ignore[arg-type]

    a = attack
    print(f"{a['stored_files']} stored files ({a['private_files']} private), "
          f"{a['public_chunks']} public chunks; tree depth {a['max_depth']}, "
          f"{a['root_children']} children of the root")
    if a.get("layout") == "pages":
        print(f"rows in pages: {a['pages']} pages of {a['rows_per_page']} rows, {a['rows']}"
              f" rows ({a['padding_rows']} padding); envelope lengths {a['row_lengths']}")
    print(table([f"structure attack ({args.mode}, no key, no vector)", "rate", "chance"], [
        ["public files labelled", pct(a["file_labelled"]), pct(a["file_chance"])],
        [f"  of them with more than one chunk ({a['files_multi']})",
         pct(a["file_labelled_multi"]), pct(a["file_chance_multi"])],
        [f"public chunks labelled (by {a['chunk_labelled_by']})", pct(a["chunk_labelled"]),
         pct(a["chunk_chance"])],
        ["  of files with more than one chunk", pct(a["chunk_labelled_multi"]),
         pct(a["chunk_chance_multi"])],
        ["private files flagged as not public",
         f"{a['private_flagged']} of {a['private_files']}",
         f"public files flagged: {a['public_flagged']} of {a['public_files']}"],
        ["private files not flagged: public candidates",
         ", ".join(f"{p.rsplit('/', 1)[-1][:24]}: {n}"
                   for p, n in a["private_copy_candidates"].items()) or "-", ""],
        *([["a file seen edited alone, by the pages its sync writes",
            pct(a["file_labelled_when_edited_alone"]), pct(a["file_chance"])],
           ["  of them with more than one chunk",
            pct(a["file_labelled_when_edited_alone_multi"]), pct(a["file_chance_multi"])]]
          if "file_labelled_when_edited_alone" in a else []),
        ["file category read from upload order", pct(a["category_from_order"]),
         pct(a["category_chance"])],
        *([["  the same cut, files in random orders: 5th-95th percentile",
            f"{pct(a['category_random_order']['p5'])}-"
            f"{pct(a['category_random_order']['p95'])}", ""]]
          if "category_random_order" in a else []),
    ]))
    if cost:
        print()
        print(table(["cost", "value"], [[k, v] for k, v in cost.items()]))
    c = cochange
    print(f"\nco-change: {c['edits']} syncs of one edited file each ({c['files_edited']}"
          f" files edited), {c['rows']} rows of {c['files_current']} files at the end"
          f" ({c['rows_scored']} of them rows of the {c['files_with_rows']} files with rows)")
    if "pages_written_per_sync" in c:
        w, d = c["pages_written_per_sync"], c["pages_deleted_per_sync"]
        print(f"pages per sync: written {w['mean']:.2f} (min {w['min']}, max {w['max']}),"
              f" deleted {d['mean']:.2f} (min {d['min']}, max {d['max']});"
              f" {c['pages_at_the_end']} pages at the end; rows {c['rows_at_the_end']}")
        print(f"rows in the pages the syncs wrote: {c['rows_in_new_pages']}")
    print(table(["rows grouped into files by", "files exact", "pair precision",
                 "pair recall", "pair chance"],
                [[name, pct(g["files_exact"]), pct(g["pair_precision"]),
                  pct(g["pair_recall"]), pct(g["pair_chance"])]
                 for name, g in (("the sync that added them", c["by_cochange"]),
                                 ("the columns a row carries", c["by_row_columns"]))]))
    print(f"\nserver-search, one line edited twice within a minute: "
          f"{edit['rows_keeping_their_vector']} of {edit['file_rows']} rows of the file keep"
          f" their encrypted vector; {edit['superseded_in_search_index_while_open']} of"
          f" {edit['superseded_rows']} superseded rows still in search.index while open")
    fn = edit["fresh_noise"]
    print(f"were the noise fresh on every send ({fn['model']}, beta {fn['beta']:g},"
          f" {fn['trials']} trials): the edited chunk named {pct(fn['edited_chunk_named'])}"
          f" of the time (chance {pct(fn['chance'])}); unchanged rows linked to their old"
          f" version {pct(fn['unchanged_rows_linked_to_their_version'])}; the beta faced"
          " after k linked versions: " + ", ".join(
              f"{k}: {v:.2f}" for k, v in fn["beta_faced_by_copies"].items()))
    print("\nRow buckets: rows stored per chunk, and files labelled from the row count alone")
    print(table(["scheme", "rows per chunk", "files labelled", "of >1 chunk"],
                [[s["scheme"], f"{s['rows_per_chunk']:.2f}", pct(s["file_labelled"]),
                  pct(s["file_labelled_multi"])] for s in schemes]))
    path = write_json(args.out, {"tree": str(args.tree or args.mirror), "mirror_commit": commit,
                                 "embedder": os.environ["CODEVEIL_EMBEDDER"],
                                 "mode": args.mode, "attack": attack, "cost": cost,
                                 "row_buckets": schemes, "server_search_edit": edit,
                                 "cochange": cochange})
    print(f"\nwrote {path}")
    return 0


def server_search_edit(tree: Path, work: Path) -> dict[str, object]:
    """Server-search: edit one line in the middle of a many-chunk file, then again within
    the minute. How many of the file's rows came back from the first edit with the very
    encrypted vector they had (the chunk an edit changed is the one whose vector moved),
    and how many of the rows the second edit superseded the search snapshot still holds,
    read while the store is open (the first edit's apply may write the snapshot; the
    second's is within the minute, when none is due)."""
    from retrieval import Index
    from sync.crypto.ciphers import node_key
    from sync.store import fid_of

    setup = build_repo(tree, work, server_search=True)
    fid = fid_of(node_key(setup.key, setup.duplicate[0]))
    path = setup.repo / setup.duplicate[0]
    lines = path.read_text().splitlines(keepends=True)
    middle = len(lines) // 2
    snapshot = next(p for p in setup.store_dir.rglob("search.index"))

    def rows() -> list[tuple[bytes, bytes]]:
        view = read_server(setup.store_dir)
        assert view.vectors is not None
        return [(view.vectors[i].tobytes(), view.metas[i]) for i, f in enumerate(view.fids)
                if f == fid]

    versions = [rows()]
    texts = [path.read_text()]
    with Index(setup.repo) as idx:
        for n in (1, 2):
            lines[middle] = lines[middle].rstrip("\n") + f"  # edited {n}\n"
            path.write_text("".join(lines))
            texts.append(path.read_text())
            idx.index(wait=True)
            versions.append(rows())
        held = snapshot.read_bytes() if snapshot.exists() else b""
    first, second = {v for v, _ in versions[1]}, {m for _, m in versions[2]}
    superseded = [m for _, m in versions[1] if m not in second]
    return {"file_rows": len(versions[0]),
            "rows_keeping_their_vector": sum(1 for v, _ in versions[0] if v in first),
            "superseded_rows": len(superseded),
            "superseded_in_search_index_while_open": sum(1 for m in superseded
                                                         if m[:48] in held),
            "fresh_noise": fresh_noise_edit(texts[0], texts[1], setup.duplicate[0],
                                            setup.key)}


FRESH_NOISE_TRIALS = 400
AVERAGED_COPIES = (1, 2, 4, 8, 16)


def fresh_noise_edit(before: str, after: str, path: str, key: object) -> dict[str, object]:
    """Server-search, were every send's noise fresh (it is a function of the chunk): the
    file's rows before and after a one-line edit, each version encrypted with new noise
    (the real model's vectors, the workspace's cipher at the default beta). The attacker
    pairs each new row with its nearest old one and takes the row farthest from its pair
    for the edited chunk: how often that names it (chance 1/n), and how often an
    unchanged row's nearest old row is its own version (what averaging needs: the
    versions of a chunk linked). Then the noise left in the mean of k linked versions of
    a chunk, against one version's: the beta the attacker faces after k syncs."""
    from indexer.definitions import chunk_and_define
    from indexer.embedder import SentenceTransformerEmbedder
    from sync.crypto.ciphers import DEFAULT_BETA, VectorCipher

    model = SentenceTransformerEmbedder()
    old_chunks, _ = chunk_and_define(path, before)
    new_chunks, _ = chunk_and_define(path, after)
    old = np.asarray(model.embed([c.embed_text for c in old_chunks]), np.float32)
    new = np.asarray(model.embed([c.embed_text for c in new_chunks]), np.float32)
    own = {c.embed_text: i for i, c in enumerate(old_chunks)}
    edited = {j for j, c in enumerate(new_chunks) if c.embed_text not in own}
    cipher = VectorCipher(key, old.shape[1], DEFAULT_BETA)  # type: ignore[arg-type]
    clean = VectorCipher(key, old.shape[1], 0.0)  # type: ignore[arg-type]

    def fresh(x: np.ndarray) -> np.ndarray:
        return cipher.encrypt(x, [os.urandom(16) for _ in range(len(x))])

    named = linked = unchanged = 0
    for _ in range(FRESH_NOISE_TRIALS):
        a, b = fresh(old), fresh(new)
        d = np.linalg.norm(b[:, None, :] - a[None, :, :], axis=2)
        named += int(np.argmax(d.min(axis=1))) in edited
        for j, c in enumerate(new_chunks):
            if j not in edited:
                unchanged += 1
                linked += int(np.argmin(d[j])) == own[c.embed_text]
    truth = clean.encrypt(old, [bytes(16)] * len(old))
    copies = np.stack([fresh(old) for _ in range(max(AVERAGED_COPIES))])
    one = float(np.mean(np.linalg.norm(copies[0] - truth, axis=1)))
    left = {k: float(np.mean(np.linalg.norm(copies[:k].mean(axis=0) - truth, axis=1))) / one
            for k in AVERAGED_COPIES}
    return {"model": model.model_id, "beta": DEFAULT_BETA, "trials": FRESH_NOISE_TRIALS,
            "file_chunks": len(new_chunks), "edited_chunks": len(edited),
            "edited_chunk_named": named / FRESH_NOISE_TRIALS,
            "chance": 1.0 / max(len(new_chunks), 1),
            "unchanged_rows_linked_to_their_version": linked / max(unchanged, 1),
            "noise_left_by_copies": left,
            "beta_faced_by_copies": {k: DEFAULT_BETA * v for k, v in left.items()}}


def sync_cost(setup: Setup, index_cls: type, first_seconds: float, *,
              paged: bool = False) -> dict[str, object]:
    """Bytes the store holds, and requests and bytes of a sync with nothing to do and of
    one after a one-line edit of one file (`paged`: also the pages stored, and those the
    edit wrote and deleted)."""
    from bench.privacy_pages import page_keys

    (ws_dir,) = [p for p in (setup.store_dir / "workspaces").iterdir() if p.is_dir()]
    with contextlib.closing(sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro",
                                            uri=True)) as conn:
        (n_rows, row_bytes), = conn.execute(
            "SELECT count(*), sum(length(meta)) + 16 * count(*) FROM rows").fetchall()
        (n_nodes,), = conn.execute("SELECT count(*) FROM nodes").fetchall()
    # The workspace's files as they are (the server holds its write-ahead log open).
    tree_bytes = sum(f.stat().st_size for f in ws_dir.iterdir() if f.is_file())
    pages = page_keys(setup.store_dir) if paged else set()
    with index_cls(setup.repo) as idx:
        same = idx.index(wait=True)
        path = setup.repo / setup.duplicate[0]
        path.write_text(path.read_text() + "\n# one more line\n")
        edit = idx.index(wait=True)
    after = page_keys(setup.store_dir) if paged else set()
    paging = {"pages stored": len(pages),
              "one-file sync: pages written": len(after - pages),
              "one-file sync: pages deleted": len(pages - after)} if paged else {}
    return {
        "first index, seconds (hashing embedder)": round(first_seconds, 2),
        "rows stored": n_rows, "row bytes stored (id + envelope)": int(row_bytes),
        "nodes stored": n_nodes,
        "workspace files bytes (tree.sqlite and its log)": tree_bytes,
        "no-change sync: requests": same.requests,
        "no-change sync: bytes sent + received": same.bytes_sent + same.bytes_received,
        "one-file sync: requests": edit.requests,
        "one-file sync: bytes sent + received": edit.bytes_sent + edit.bytes_received,
        "one-file sync: seconds": round(edit.seconds, 3),
        **paging,
    }


# -- the run ---------------------------------------------------------------------------


def run_mode(name: str, stored: np.ndarray | None, t: Truth, encrypt,
             queries: np.ndarray, seed: int) -> dict[str, object]:
    """Every vector attack on one mode's stored vectors (None: nothing comparable)."""
    m = len(t.known)
    row: dict[str, object] = {"mode": name, "chance": 1.0 / m}
    if stored is None:
        row.update({"nearest": 1.0 / m, "seedless": 1.0 / m, "seedless_cos": 0.0,
                    "link_distance": 1.0 / len(queries), "link_results": 1.0 / len(queries),
                    "query_text": 1.0 / len(queries), "recall": None})
        for k in KNOWN_PAIRS:
            row[f"procrustes@{k}"] = row[f"ridge@{k}"] = 1.0 / m
        return row
    rng = np.random.default_rng(seed)
    row["nearest"] = attack_nearest(stored, t)
    for k in KNOWN_PAIRS:
        row[f"procrustes@{k}"], row[f"procrustes@{k}_cos"] = attack_known_pairs(
            stored, t, k, "procrustes", rng)
        row[f"ridge@{k}"], row[f"ridge@{k}_cos"] = attack_known_pairs(
            stored, t, k, "ridge", rng)
    row["seedless"], row["seedless_cos"], _ = attack_seedless(stored, t)
    public = np.flatnonzero(t.labels >= 0)
    q, s = _procrustes(t.known[t.labels[public]], stored[public])
    row.update(attack_queries(stored, t, encrypt, queries, lambda x: x @ q.T / s))
    row["recall"] = client_recall(stored, t, encrypt, queries)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=None,
                        help="public source tree to index (default: the requests package)")
    parser.add_argument("--betas", default=",".join(str(b) for b in BETAS))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None,
                        help="result name under bench/results/ (default: privacy, or"
                        " privacy_structure with --structure)")
    parser.add_argument("--structure", action="store_true",
                        help="only the structure attack and the store's cost, on a sealed"
                        " store of --tree or --mirror (hashing embedder unless"
                        " CODEVEIL_EMBEDDER says otherwise)")
    parser.add_argument("--mirror", default="psf/requests",
                        help="git mirror (bench/_common.unpack_mirror) for --structure")
    parser.add_argument("--mode", choices=("sealed", "server-search"), default="sealed",
                        help="the workspace mode of the --structure store")
    parser.add_argument("--edits", type=int, default=50,
                        help="syncs of one edited file each the --structure co-change"
                        " observer watches")
    args = parser.parse_args(argv)
    if args.structure:
        args.out = args.out or ("privacy_structure" if args.mode == "sealed"
                                else "privacy_structure_server_search")
        return run_structure(args)
    args.out = args.out or "privacy"
    betas = [float(b) for b in args.betas.split(",") if b]

    from indexer.embedder_registry import default_embedder
    from sync.crypto.ciphers import DEFAULT_BETA, VectorCipher

    base = isolate()
    structural: dict[str, dict[str, object]] = {}
    try:
        with Timer() as build:
            stores = {name: build_repo(args.tree or default_tree(), base,
                                       server_search=name == "server-search")
                      for name in ("sealed", "server-search")}
        views = {name: read_server(setup.store_dir) for name, setup in stores.items()}
        setup, view = stores["server-search"], views["server-search"]
        t = ground_truth(setup, view)
        queries = default_embedder().embed(QUERIES).astype(np.float32)
        print(f"{len(view.rids)} rows ({int(np.sum(t.labels < 0))} private), "
              f"{len(t.known)} public chunks known to the server; both stores built in "
              f"{build.seconds:.1f} s\n")

        for name, st in stores.items():
            tv = ground_truth(st, views[name])
            order_chunk, order_file = attack_id_order(views[name], tv)
            dupes, linked, planted = attack_equal_leaves(st, views[name])
            structural[name] = {
                "canary_hits": scan_canaries(st.store_dir, st.canaries),
                "canaries_planted": len(st.canaries),
                "id_order_chunk": order_chunk, "id_order_file": order_file,
                "id_order_chance": 1.0 / len(tv.known),
                "id_order_file_chance": id_order_file_chance(tv), "identical_file_groups": dupes,
                "identical_groups_with_equal_leaves": linked, "planted_copy_named": planted,
                "rows_with_a_vector": views[name].vectors is not None,
                **edit_and_reindex(st, views[name]),
            }

        rows = [run_mode("plain vectors (control)", t.plain, t, lambda q: q, queries, args.seed)]
        dim = t.plain.shape[1]
        ids = view.chunk_ids
        for beta in betas:
            cipher = VectorCipher(setup.key, dim, beta)
            stored = (view.vectors if view.vectors is not None and beta == DEFAULT_BETA
                      else cipher.encrypt(t.plain, ids))
            rows.append(run_mode(f"server-search, DCPE beta {beta:g}", stored, t,
                                 cipher.encrypt_query, queries, args.seed))
        assert views["sealed"].vectors is None, "a sealed store holds a vector column"
        rows.append(run_mode("sealed (default)", None, t, None, queries, args.seed))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def pct_of(v: object) -> str:
        return f"{100 * float(v):.1f}%"  # type: ignore[arg-type]

    lines = [
        ("canary hits (every byte)", lambda d: f"{d['canary_hits']} of {d['canaries_planted']}"),
        ("rows labelled by id order: chunk", lambda d: pct_of(d["id_order_chunk"])),
        ("rows labelled by id order: file", lambda d: pct_of(d["id_order_file"])),
        ("  (the same, rows in random order)", lambda d: pct_of(d["id_order_file_chance"])),
        ("identical files with equal leaves",
         lambda d: f"{d['identical_groups_with_equal_leaves']} of {d['identical_file_groups']}"),
        ("planted private copy named", lambda d: str(d["planted_copy_named"])),
        ("edit: rows keeping their id",
         lambda d: f"{d['rows_keeping_their_id']} of {d['file_rows_before']}"),
        ("edit: rows keeping their bytes",
         lambda d: f"{d['rows_keeping_their_bytes']} of {d['file_rows_before']}"),
        ("edit: superseded rows on disk, store open",
         lambda d: f"{d['superseded_rows_on_disk_while_open']} of {d['superseded_rows']}"),
        ("edit: superseded rows still on disk",
         lambda d: f"{d['superseded_rows_still_on_disk']} of {d['superseded_rows']}"),
        ("edit: of them still rows (in kept pages)",
         lambda d: f"{d['superseded_rows_still_stored']} of {d['superseded_rows']}"
         if "superseded_rows_still_stored" in d else "-"),
        ("edit: pages written / deleted",
         lambda d: f"{d['pages_written']} / {d['pages_deleted']}" if "pages_written" in d
         else "-"),
        ("edit: their rows: the file's / others' / padding",
         lambda d: f"{d['of_them_the_files']} / {d['of_them_other_files']} /"
         f" {d['of_them_padding']}" if "rows_in_pages_written" in d else "-"),
    ]
    print(f"id-order chance: {pct_of(structural['sealed']['id_order_chance'])}")
    print(table(["attack (server's data dir only)", "sealed", "server-search"],
                [[label, f(structural["sealed"]), f(structural["server-search"])]
                 for label, f in lines]))
    print()
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    headers = ["mode", "NN", *[f"Proc@{k}" for k in KNOWN_PAIRS],
               *[f"ridge@{k}" for k in KNOWN_PAIRS], "seedless", "seedless cos"]
    print("Rows labelled (%), chance "
          f"{100 / len(t.known):.2f}%; 'cos': recovered private vectors vs truth")
    print(table(headers, [[r["mode"], pct(r["nearest"]),
                           *[pct(r[f"procrustes@{k}"]) for k in KNOWN_PAIRS],
                           *[pct(r[f"ridge@{k}"]) for k in KNOWN_PAIRS],
                           pct(r["seedless"]), f"{r['seedless_cos']:.3f}"] for r in rows]))
    print()
    print(f"Queries (%), {len(QUERIES)} queries, chance {100 / len(QUERIES):.1f}%; "
          "recall: client's top-10 after re-rank of the encrypted top-100")
    print(table(["mode", "linked by distance", "linked by results", "text from guess list",
                 "recall@10"],
                [[r["mode"], pct(r["link_distance"]), pct(r["link_results"]),
                  pct(r["query_text"]), pct(r["recall"])] for r in rows]))
    path = write_json(args.out, {"rows": len(view.rids), "public_chunks": len(t.known),
                                 "structural": structural, "modes": rows,
                                 "queries": len(QUERIES), "tree": str(args.tree or "requests")})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
