"""What a sealed workspace's server holds, read from its data dir and opened with the
workspace key: the test's view of rows that the server itself cannot open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sync.crypto.keys import load_key
from sync.crypto.sealed_rows import OpenRow, RowSealer
from sync.store.core.rows import fid_of
from sync.store.embedded.pool import unscoped


def opened_rows(data_dir: Path, workspace_id: str, dim: int
                ) -> list[tuple[int, bytes, OpenRow]]:
    """(row number, leaf key it is stored under, the row opened) of every chunk row the
    embedded store in `data_dir` holds, in the order the rows were stored (padding left
    out). A row of a page names its file (`meta.path`) and version (`value`) inside its
    envelope; the leaf key is the page's."""
    key = load_key(workspace_id)
    sealer = RowSealer(key, workspace_id, dim)
    (db_path,) = (data_dir / "workspaces").glob("*/tree.sqlite")
    out: list[tuple[int, bytes, OpenRow]] = []
    with sqlite3.connect(db_path) as db:
        leaf_of = {fid_of(unscoped(bytes(k))): unscoped(bytes(k)) for (k,) in db.execute(
            "SELECT key FROM nodes WHERE is_dir = 0")}
        for rid, fid, row_id, meta in db.execute(
                "SELECT rid, fid, chunk_id, meta FROM rows ORDER BY rid"):
            leaf = leaf_of[fid]
            opened = sealer.open(bytes(row_id), leaf, bytes(meta))
            if opened is not None:
                out.append((rid, leaf, opened))
    return out


def leaf_rows(data_dir: Path) -> dict[bytes, int]:
    """Every leaf of the store's trees -> how many rows (padding included) its blob
    holds: what the server sees of how rows group."""
    (db_path,) = (data_dir / "workspaces").glob("*/tree.sqlite")
    with sqlite3.connect(db_path) as db:
        return {unscoped(bytes(k)): db.execute(
                    "SELECT COUNT(*) FROM rows WHERE fid = ? AND value = ?",
                    (fid_of(unscoped(bytes(k))), v)).fetchone()[0]
                for k, v in db.execute(
                    "SELECT key, value FROM nodes WHERE is_dir = 0 AND value IS NOT NULL")}
