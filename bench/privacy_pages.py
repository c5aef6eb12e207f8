"""The structure attack of bench/privacy.py on a sealed store whose rows are in pages.

In pages (sync.crypto.pages) a file's leaf holds no row; rows travel in leaves of their own,
PAGE_ROWS each, under random keys, and name their file only inside the envelope. The
server tells a page from a file by its rows (a page holds PAGE_ROWS, a file none) and a
page row by its envelope's version byte. An attacker who knows this and the public code:

    files           a file leaf's candidates are the public files at its depth, under
                    buckets of the same shape where any are (the bucket a leaf hangs
                    under is picked by its key, so this is the rule of the per-file
                    layout, kept to show it reads nothing); none left: not public
    chunks          a page row's file is unknown, so it is labelled among every public
                    chunk of its envelope length
    category        rows in rid order (the order pages arrived in), cut where the
                    public chunk counts of source, tests and other fall

The truth (with the key) opens every page row: its file (`meta.path`) and version
(`OpenRow.value`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bench.privacy_shapes import PublicFile, Setup, StoredShape
    from sync.crypto.sealed_rows import OpenRow

#: A file version as the truth names it: (fid of the file's key, its leaf value).
Version = tuple[int, bytes]


@contextlib.contextmanager
def _tree_db(store_dir: Path) -> Iterator[sqlite3.Connection]:
    (ws_dir,) = [p for p in (store_dir / "workspaces").iterdir() if p.is_dir()]
    with contextlib.closing(sqlite3.connect(f"file:{ws_dir / 'tree.sqlite'}?mode=ro",
                                            uri=True)) as conn:
        yield conn


def is_paged(store_dir: Path) -> bool:
    """Whether the store's rows are page rows: read off the version byte in front of
    every envelope, as the server sees it."""
    from sync.crypto.sealed_rows import PAGE_ROW_VERSION

    with _tree_db(store_dir) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                        " AND name = 'rows'").fetchone() is None:
            return False
        first = conn.execute("SELECT substr(meta, 1, 1) FROM rows LIMIT 1").fetchone()
    return first is not None and bytes(first[0]) == bytes([PAGE_ROW_VERSION])


def page_keys(store_dir: Path) -> set[bytes]:
    """The leaves that hold rows (the pages, as the server tells them)."""
    from bench.privacy_shapes import stored_node
    from sync.store import fid_of

    with _tree_db(store_dir) as conn:
        fids = {int(f) for (f,) in conn.execute("SELECT DISTINCT fid FROM rows")}
        return {stored_node(k) for (k,) in conn.execute("SELECT key FROM nodes WHERE is_dir = 0")
                if fid_of(stored_node(k)) in fids}


def _opened(setup: Setup) -> Iterator[tuple[int, bytes, bytes, OpenRow | None]]:
    """(rid, page key, page value, the row opened or None for padding) of every row the
    store holds, in rid order."""
    from bench.privacy_shapes import stored_node
    from sync.crypto.sealed_rows import RowSealer
    from sync.store import fid_of

    sealer = RowSealer(setup.key, setup.workspace_id, setup.dim)  # type: ignore[arg-type]
    with _tree_db(setup.store_dir) as conn:
        leaf_of = {fid_of(stored_node(k)): stored_node(k) for (k,) in conn.execute(
            "SELECT key FROM nodes WHERE is_dir = 0")}
        stored = conn.execute("SELECT rid, fid, chunk_id, meta, value FROM rows"
                              " ORDER BY rid").fetchall()
    for rid, fid, cid, blob, value in stored:
        page = leaf_of[fid]
        yield int(rid), page, bytes(value or b""), sealer.open(bytes(cid), page, bytes(blob))


@dataclass
class PagedTruth:
    """With the key: each file leaf's path, and each page's rows in rid order as (path,
    public chunk index or -1 for a private chunk), None for a padding row."""

    paths: dict[bytes, str]
    pages: dict[bytes, list[tuple[str, int] | None]]


def paged_truth(setup: Setup, public: dict[str, PublicFile]) -> PagedTruth:
    from indexer.walk import walk_repo
    from sync.crypto.ciphers import node_key

    paths = {node_key(setup.key, e.path): e.path  # type: ignore[arg-type]
             for e in walk_repo(setup.repo).files}
    index = {p: {c: i for i, c in enumerate(f.chunks)} for p, f in public.items()}
    pages: dict[bytes, list[tuple[str, int] | None]] = {}
    for _, page, _, row in _opened(setup):
        pages.setdefault(page, []).append(None if row is None else (
            row.meta.path,
            index.get(row.meta.path, {}).get((row.meta.chunk_hash, row.meta.start_line), -1)))
    return PagedTruth(paths, pages)


def row_versions(setup: Setup) -> dict[int, Version | None]:
    """rid -> the file version the row holds a chunk of, opened with the key (the truth
    the co-change attack is scored against); None for a padding row and for a row of a
    version no leaf names any more (a page is kept while any of its rows is live)."""
    from sync.crypto.ciphers import node_key
    from sync.store import fid_of

    current = current_file_versions(setup)
    out: dict[int, Version | None] = {}
    for rid, _, _, row in _opened(setup):
        if row is None:
            out[rid] = None
            continue
        version = (fid_of(node_key(setup.key, row.meta.path)),  # type: ignore[arg-type]
                   bytes(row.value or b""))
        out[rid] = version if version in current else None
    return out


def row_kinds(setup: Setup) -> dict[str, int]:
    """How many of the rows the store holds are padding, a current file version's, or a
    superseded version's that a kept page still holds (opened with the key)."""
    versions = row_versions(setup)
    padding = sum(1 for _, _, _, row in _opened(setup) if row is None)
    live = sum(1 for v in versions.values() if v is not None)
    return {"padding": padding, "current": live, "superseded": len(versions) - live - padding}


def paths_in(setup: Setup, pages: set[bytes]) -> list[str | None]:
    """The file of each row the `pages` hold (None: padding), opened with the key."""
    return [row.meta.path if row is not None else None
            for _, page, _, row in _opened(setup) if page in pages]


def row_columns(store_dir: Path) -> dict[int, Version]:
    """rid -> the (fid, value) columns the row is stored with: its page's."""
    with _tree_db(store_dir) as conn:
        return {int(rid): (int(fid), bytes(value or b"")) for rid, fid, value in
                conn.execute("SELECT rid, fid, value FROM rows")}


def current_file_versions(setup: Setup) -> set[Version]:
    """The file versions the leaves name now (leaves holding no row: files)."""
    from bench.privacy_shapes import stored_node
    from sync.store import fid_of

    pages = page_keys(setup.store_dir)
    with _tree_db(setup.store_dir) as conn:
        return {(fid_of(stored_node(k)), bytes(v)) for k, v in conn.execute(
                    "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")
                if stored_node(k) not in pages}


def _category_spread(public: dict[str, PublicFile], guess: list[int], n_rows: int,
                     trials: int = 1000, seed: int = 0) -> dict[str, float]:
    """The category rate of the same cut where the files arrive in a random order, each
    file's rows together (what one run's rate moves by: a few large files weigh much),
    over `trials` orders: mean and the 5th and 95th percentiles."""
    from indexer.priority import category

    rng = np.random.default_rng(seed)
    files = [(category(p), len(f.lengths)) for p, f in public.items() if f.lengths]
    spare = n_rows - sum(n for _, n in files)  # padding and private rows, spread evenly
    rates = []
    for _ in range(trials):
        order = rng.permutation(len(files))
        cats = np.concatenate([np.full(files[i][1], files[i][0]) for i in order])
        at = np.sort(rng.choice(n_rows, size=len(cats), replace=False)) if spare > 0 \
            else np.arange(len(cats))
        rates.append(float(np.mean(np.asarray(guess)[at] == cats)))
    return {"mean": float(np.mean(rates)), "p5": float(np.percentile(rates, 5)),
            "p95": float(np.percentile(rates, 95))}


def attack_paged_structure(shape: StoredShape, public: dict[str, PublicFile],
                           truth: PagedTruth) -> dict[str, object]:
    """Label the stored files and page rows with public ones from structure alone (the
    module docstring); rates are expected values, a guess among k counting 1/k."""
    from bench.privacy_shapes import ancestor_shapes, depths, narrow_one_to_one, public_shape
    from indexer.priority import category

    leaves = [k for k, d in shape.is_dir.items() if not d]
    pages = [k for k in leaves if shape.rows[k]]
    files = [k for k in leaves if not shape.rows[k]]
    # The tree the attacker matches is the files' alone: it tells pages apart.
    paged = set(pages)
    s_parent = {k: p for k, p in shape.parent.items() if k not in paged}
    s_dir = {k: shape.is_dir[k] for k in s_parent}
    p_parent, p_dir = public_shape(sorted(public))
    s_depth, p_depth = depths(s_parent), depths(p_parent)
    s_anc, p_anc = ancestor_shapes(s_parent, s_dir), ancestor_shapes(p_parent, p_dir)
    by_depth = len({s_depth[s] for s in files}) > 1
    cands: dict[bytes, set[str]] = {}
    for s in files:
        fit = {p for p in public if p_depth[p] == s_depth[s] or not by_depth}
        exact = {p for p in fit if p_anc[p] == s_anc[s]}
        cands[s] = exact or fit
    shape_matched = sum(1 for s in files if cands[s] and all(
        p_anc[p] == s_anc[s] for p in cands[s]))
    unfit = {s for s, c in cands.items() if not c}
    narrow_one_to_one(cands)

    public_keys = [s for s in files if truth.paths.get(s) in public]
    private_keys = [s for s in files if s in truth.paths and truth.paths[s] not in public]

    def file_score(s: bytes) -> float:
        return 1.0 / len(cands[s]) if truth.paths[s] in cands[s] else 0.0

    files_multi = [s for s in public_keys if len(public[truth.paths[s]].lengths) > 1]
    n_chunks = sum(len(public[truth.paths[s]].lengths) for s in public_keys)
    n_multi = sum(len(public[truth.paths[s]].lengths) for s in files_multi)

    # Chunks: a row is one of the public chunks of its envelope length, any file's.
    per_length = Counter(n for f in public.values() for n in f.lengths)
    hits = hits_multi = 0.0
    rows = [(rid, length, held) for page in pages
            for (rid, length), held in zip(shape.rows[page], truth.pages[page], strict=True)]
    rows.sort()
    for _, length, held in rows:
        if held is None or held[1] < 0:
            continue
        path, i = held
        p = 1.0 / per_length[length] if public[path].lengths[i] == length else 0.0
        hits += p
        hits_multi += p if len(public[path].lengths) > 1 else 0.0

    # Category from the order rows arrived in: the row sequence cut at the public
    # chunk counts of each category, scored on the rows that hold a public chunk.
    chunk_cats = Counter(category(p) for p, f in public.items() for _ in f.lengths)
    total = sum(chunk_cats.values())
    guess: list[int] = []
    for c in sorted(chunk_cats):
        guess += [c] * round(chunk_cats[c] * len(rows) / max(total, 1))
    guess += [max(chunk_cats)] * (len(rows) - len(guess))
    scored = [(g, category(held[0])) for g, (_, _, held) in zip(guess, rows, strict=False)
              if held is not None and held[1] >= 0]
    cat_right = float(np.mean([g == c for g, c in scored])) if scored else 0.0
    shares = np.array([n / max(total, 1) for n in chunk_cats.values()])
    spread = _category_spread(public, guess, len(rows))
    # A sync that changes one file writes ceil(rows / PAGE_ROWS) pages (the rows it
    # moves only fill its last page's free slots): a file seen edited alone is one of
    # the public files of its page count.
    from sync.crypto.pages import PAGE_ROWS

    def pages_of(f: PublicFile) -> int:
        return -(-len(f.lengths) // PAGE_ROWS)

    same_pages = Counter(pages_of(f) for f in public.values())
    edit_rates = {p: 1.0 / same_pages[pages_of(f)] for p, f in public.items()}
    lengths_seen = Counter(length for _, length, _ in rows)
    return {
        "layout": "pages", "stored_leaves": len(leaves), "stored_files": len(files),
        "pages": len(pages), "rows_per_page": sorted({len(shape.rows[p]) for p in pages}),
        "rows": len(rows), "padding_rows": sum(1 for *_, h in rows if h is None),
        "row_lengths": {str(k): v for k, v in sorted(lengths_seen.items())},
        "public_files": len(public_keys), "private_files": len(private_keys),
        "public_chunks": n_chunks,
        "file_labelled": float(np.mean([file_score(s) for s in public_keys])),
        "file_labelled_multi": float(np.mean([file_score(s) for s in files_multi]))
        if files_multi else 0.0,
        "files_multi": len(files_multi),
        "files_matched_by_bucket_shape": shape_matched,
        "file_chance": 1.0 / len(public), "file_chance_multi": 1.0 / max(len(files_multi), 1),
        "chunk_labelled": hits / max(n_chunks, 1), "chunk_labelled_by": "length",
        "chunk_labelled_multi": hits_multi / max(n_multi, 1),
        "chunk_chance": 1.0 / max(n_chunks, 1), "chunk_chance_multi": 1.0 / max(n_multi, 1),
        "private_flagged": sum(1 for s in private_keys if s in unfit),
        "public_flagged": sum(1 for s in public_keys if s in unfit),
        "private_flag_rate": sum(1 for s in private_keys if s in unfit)
        / max(len(private_keys), 1),
        "public_flag_rate": sum(1 for s in public_keys if s in unfit) / max(len(public_keys), 1),
        "private_copy_candidates": {truth.paths[s]: len(cands[s]) for s in private_keys
                                    if cands[s]},
        "category_from_order": cat_right, "category_chance": float(np.sum(shares**2)),
        "file_labelled_when_edited_alone": float(np.mean(list(edit_rates.values()))),
        "file_labelled_when_edited_alone_multi": float(np.mean(
            [r for p, r in edit_rates.items() if len(public[p].lengths) > 1])),
        "public_files_by_pages_an_edit_writes": {str(k): v for k, v in
                                                 sorted(same_pages.items())},
        "category_scored_rows": len(scored), "category_random_order": spread,
        "max_depth": max(s_depth.values()),
        "root_children": sum(1 for p in s_parent.values() if p is not None
                             and s_parent[p] is None),
    }
