"""`codeveil doctor`'s look at one embedded workspace: every problem its files hold, and
its rows read in full. Functions of the workspace's files (sync.store.embedded.workspace_files)
and, in a server-search workspace, its LanceDB table, which `WorkspaceStore.check` and
`rows_by_file` call."""

from __future__ import annotations

import numpy as np

from indexer import sqlite_files
from sync.store.core.checks import pool_problems
from sync.store.core.rows import fid_of, sealed_rows_scan
from sync.store.embedded.lance_rows import LanceRows
from sync.store.embedded.lance_table import LANCE_ADVICE, lance_reads
from sync.store.embedded.pool import unscoped
from sync.store.embedded.search_index import SNAPSHOT
from sync.store.embedded.sqlite_tree import TREE_ADVICE, sealed_reads
from sync.store.embedded.vector_index import SnapshotError, read_snapshot, read_snapshot_info
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import StoreCorrupt


def workspace_problems(files: WorkspaceFiles, lance: LanceRows | None) -> list[str]:
    """Every problem found in a workspace's files (`lance`: its table, server-search),
    one line each (empty: none).

    tree.sqlite's integrity; the chunk rows read in full (every row's rid, file and
    chunk id); rids unique; every row belonging to a file of the tree; the search
    snapshot, when of the current generation, holding exactly the table's rows (a
    sealed workspace, whose rows are in tree.sqlite, has none)."""
    files.check_open()
    problems: list[str] = []
    tree = files.path / "tree.sqlite"
    bad = sqlite_files.integrity_problem(tree)
    if bad is not None:
        return [f"{tree} is corrupt ({bad}); {TREE_ADVICE}"]
    with files.rlock:
        leaves = {fid_of(unscoped(bytes(k))) for (k,) in files.rconn.execute(
            "SELECT key FROM nodes WHERE is_dir = 0")}
        if files.sealed:  # a blob no ref names yet waits for the GC: not damage
            leaves |= {f for (f,) in files.rconn.execute("SELECT fid FROM blobs")}
    try:
        by_file = rows_by_file(files, lance)
    except StoreCorrupt as exc:
        return [str(exc)]
    rids = np.concatenate([r for r, _ in by_file.values()] or [np.empty(0, np.int64)])
    if lance is None:
        table, advice = f"the chunk table of {tree}", TREE_ADVICE
    else:
        table, advice = f"the chunk table {lance.dir}", LANCE_ADVICE
    if len(np.unique(rids)) != len(rids):
        problems.append(f"{table} holds a row twice; {advice}")
    orphans = sum(len(r) for fid, (r, _) in by_file.items() if fid not in leaves)
    if orphans:
        problems.append(f"{table} holds {orphans} rows of files the tree does not have;"
                        f" {advice}")
    if lance is None:
        return problems + _pool_problems(files, table, advice)
    snapshot = files.path / SNAPSHOT
    try:
        info = read_snapshot_info(snapshot)
    except FileNotFoundError:
        info = None
    except (SnapshotError, OSError) as exc:
        problems.append(f"the search snapshot {snapshot} is unreadable ({exc}); it is"
                        " rebuilt from the chunk table (delete it to stop this message)")
        info = None
    if info is not None and info.get("generation") == files.generation():
        try:
            _index, rows, _ = read_snapshot(snapshot, files.options.index_policy)
            same = np.array_equal(np.sort(rows.rids()), np.sort(rids))
        except (SnapshotError, OSError, ValueError) as exc:
            same, rows = False, None
            problems.append(f"the search snapshot {snapshot} is unreadable ({exc})")
        if rows is not None and not same:
            problems.append(f"the search snapshot {snapshot} does not hold the chunk"
                            " table's rows; delete it (it is rebuilt from the table)")
    return problems


def rows_by_file(files: WorkspaceFiles, lance: LanceRows | None
                 ) -> dict[int, tuple[np.ndarray, list[bytes]]]:
    """fid -> (rids, chunk ids) of every chunk row, read in full: in tree.sqlite, or in
    `lance` (server-search)."""
    out: dict[int, tuple[list[int], list[bytes]]] = {}
    if lance is None:
        with files.rlock, sealed_reads(files.tree_path):
            for rid, fid, cid in sealed_rows_scan(files.rconn):
                entry = out.setdefault(fid, ([], []))
                entry[0].append(rid)
                entry[1].append(cid)
        return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}
    with files.write_lock, lance_reads(lance.dir):
        lance.handle.checkout_latest()
        for b in lance.scan(["rid", "fid", "chunk_id"]):
            for rid, fid, cid in zip(b.column("rid").to_pylist(), b.column("fid").to_pylist(),
                                     b.column("chunk_id").to_pylist(), strict=True):
                entry = out.setdefault(fid, ([], []))
                entry[0].append(rid)
                entry[1].append(cid)
    return {f: (np.array(r, np.int64), c) for f, (r, c) in out.items()}


def _pool_problems(files: WorkspaceFiles, table: str, advice: str) -> list[str]:
    """The pool's invariants (sync.store.embedded.pool): every row of a listed blob, every
    committed leaf naming a blob the pool holds."""
    with files.rlock, sealed_reads(files.tree_path):
        (loose,) = files.rconn.execute(
            "SELECT COUNT(*) FROM rows r WHERE NOT EXISTS (SELECT 1 FROM blobs b"
            " WHERE b.fid = r.fid AND b.value = r.value)").fetchone()
        lacking = sum(1 for k, v in files.rconn.execute(
            "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")
            if files.rconn.execute("SELECT 1 FROM blobs WHERE fid = ? AND value = ?",
                                   (fid_of(unscoped(bytes(k))), v)).fetchone() is None)
    return pool_problems(table, loose, lacking, advice)
