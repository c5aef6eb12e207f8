"""`codeveil doctor`'s look at one embedded workspace: every problem its files hold.
A function of the workspace's files (sync.store.embedded.workspace_files) and its mode's
rows (sync.store.embedded.mode_rows), which `WorkspaceStore.check` calls."""

from __future__ import annotations

import sqlite3

import numpy as np

from indexer import sqlite_files
from sync.store.core.rows import fid_of
from sync.store.embedded.mode_rows import EmbeddedRows
from sync.store.embedded.pool import unscoped
from sync.store.embedded.sqlite_tree import TREE_ADVICE
from sync.store.embedded.workspace_files import WorkspaceFiles
from sync.wire import StoreCorrupt


def workspace_problems(files: WorkspaceFiles, rows: EmbeddedRows) -> list[str]:
    """Every problem found in a workspace's files, one line each (empty: none).

    tree.sqlite's integrity; the chunk rows read in full (every row's rid, file and
    chunk id); rids unique; every row belonging to a file of the tree; then what the
    mode checks of its own (`rows.problems`: a sealed workspace's pool, a server-search
    workspace's search snapshot)."""
    files.check_open()
    problems: list[str] = []
    tree = files.path / "tree.sqlite"
    bad = sqlite_files.integrity_problem(tree)
    if bad is not None:
        return [f"{tree} is corrupt ({bad}); {TREE_ADVICE}"]
    try:
        with files.rlock:
            leaves = {fid_of(unscoped(bytes(k))) for (k,) in files.rconn.execute(
                "SELECT key FROM nodes WHERE is_dir = 0")}
        leaves |= rows.pooled_fids()  # a blob no ref names yet waits for the GC: not damage
    except sqlite3.OperationalError as exc:  # a tree.sqlite made anew: the old one is lost
        return [f"{tree} lacks its tables ({exc}); {TREE_ADVICE}"]
    try:
        by_file = rows.rows_by_file()
    except StoreCorrupt as exc:
        return [str(exc)]
    rids = np.concatenate([r for r, _ in by_file.values()] or [np.empty(0, np.int64)])
    table, advice = rows.table()
    if len(np.unique(rids)) != len(rids):
        problems.append(f"{table} holds a row twice; {advice}")
    orphans = sum(len(r) for fid, (r, _) in by_file.items() if fid not in leaves)
    if orphans:
        problems.append(f"{table} holds {orphans} rows of files the tree does not have;"
                        f" {advice}")
    return problems + rows.problems(rids)
