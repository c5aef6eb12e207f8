"""What a workspace of a data dir holds, opened with its key: for checking that two
stores hold the same thing (convergence tests, the fault benchmark).

Row ids are random and fresh on every send, so two stores of one tree never share them;
a row is compared by what it holds instead: its file and, opened, the chunk it locates.
A sealed workspace's rows travel in pages (sync.crypto.pages) under random keys, so two stores
of one tree share neither pages nor directory values: its contents are the files' leaves
(under their buckets) and the live rows of each file (each chunk once, whichever page
holds it), and its root is a digest of those leaves.
Reads the store's files directly; run it with no writer active. `pg_workspace_contents` reads
a workspace of a PostgreSQL store the same way.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from sync.crypto.ciphers import node_key, open_meta, page_value
from sync.crypto.keys import WorkspaceKey
from sync.crypto.sealed_rows import RowSealer
from sync.records import KEY_BYTES, MODE_SEALED
from sync.store.core.rows import fid_of
from sync.store.embedded.lance_table import TABLE

#: (root value, sorted rows, sorted nodes); a row is (fid, path, start line, end line,
#: symbol, language, chunk hash), a node (key, parent, value, is_dir). A sealed
#: workspace's padding rows hold no chunk and are left out.
Contents = tuple[bytes | None, list[tuple], list[tuple]]


def workspace_contents(data_dir: Path, workspace_id: str, key: WorkspaceKey) -> Contents:
    ws = data_dir / "workspaces" / workspace_id
    with sqlite3.connect(data_dir / "registry.sqlite") as reg:
        dim, mode = reg.execute("SELECT dim, mode FROM workspaces WHERE id = ?",
                                (workspace_id,)).fetchone()
    with sqlite3.connect(ws / "tree.sqlite") as db:
        # Node keys as their ref's client sees them (stored as ref id || key since store
        # format 4, sync.store.embedded.pool); a data dir of one ref reads as before refs.
        nodes = sorted((_node_key(k), None if p is None else _node_key(p), v, d)
                       for k, p, v, d in db.execute(
                           "SELECT key, parent, value, is_dir FROM nodes"))
        root = db.execute("SELECT value FROM nodes WHERE parent IS NULL").fetchone()
        # A sealed workspace's rows are in its tree.sqlite (sync.store.core.rows).
        found = (db.execute("SELECT chunk_id, fid, meta FROM rows").fetchall()
                 if mode == MODE_SEALED else None)
    if found is None:
        import lancedb

        table = lancedb.connect(ws).open_table(TABLE).to_arrow()
        found = list(zip(table.column("chunk_id").to_pylist(), table.column("fid").to_pylist(),
                         table.column("meta").to_pylist(), strict=True))
    file_keys = {fid_of(k): k for k, _, _, is_dir in nodes if not is_dir}
    sealer = RowSealer(key, workspace_id, dim) if mode == MODE_SEALED else None
    return _contents(root[0] if root else None, found, nodes, file_keys, sealer, key,
                     workspace_id)


def _node_key(stored: bytes) -> bytes:
    return bytes(stored[KEY_BYTES:]) if len(stored) == 2 * KEY_BYTES else bytes(stored)


def pg_workspace_contents(url: str, workspace_id: str, key: WorkspaceKey) -> Contents:
    """`workspace_contents` of a workspace in a PostgreSQL store (sync.store.postgres): the
    same shape, so convergence is compared the same way on either backend. Reads in one
    REPEATABLE READ transaction, so it sees one committed state even with writers."""
    import psycopg

    from sync.store.postgres.schema import SCHEMA as S

    with psycopg.connect(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        record = conn.execute(f"SELECT dim, mode FROM {S}.workspaces WHERE id = %s",
                              (workspace_id,)).fetchone()
        if record is None:
            raise LookupError(f"no workspace {workspace_id!r} in the database")
        nodes = sorted((bytes(k), None if p is None else bytes(p),
                        None if v is None else bytes(v), int(d))
                       for k, p, v, d in conn.execute(
            f"SELECT key, parent, value, is_dir FROM {S}.nodes WHERE workspace = %s",
            (workspace_id,)))
        found = conn.execute(f"SELECT fid, chunk_id, meta FROM {S}.rows WHERE workspace = %s",
                             (workspace_id,)).fetchall()
    dim, mode = record
    root = [v for _, p, v, _ in nodes if p is None]
    file_keys = {fid_of(k): k for k, _, _, is_dir in nodes if not is_dir}
    sealer = RowSealer(key, workspace_id, dim) if mode == MODE_SEALED else None
    rows = [(bytes(cid), fid, bytes(blob)) for fid, cid, blob in found]
    return _contents(root[0] if root else None, rows, nodes, file_keys, sealer, key,
                     workspace_id)


def _contents(root: bytes | None, found: list, nodes: list[tuple],
              file_keys: dict[int, bytes], sealer: RowSealer | None, key: WorkspaceKey,
              workspace_id: str) -> Contents:
    """The contents of a store whose rows are under their files, or in pages."""
    pages = {k for k, _, v, is_dir in nodes
             if not is_dir and v is not None and v == page_value(key, k)}
    if sealer is None or not pages:
        return root, _opened(found, file_keys, sealer, key, workspace_id), nodes
    files = [n for n in nodes if not n[3] and n[0] not in pages]
    leaves = {k: v for k, _, v, _ in files}
    # The buckets above the files, without their values (which the pages enter).
    parent = {k: p for k, p, _, _ in nodes}
    above: set[bytes] = set()
    for _, up, _, _ in files:
        while up is not None and up not in above:
            above.add(up)
            up = parent.get(up)
    tree = sorted(files + [(k, parent.get(k), None, 1) for k in above])
    live: set[tuple] = set()
    for cid, fid, blob in found:
        opened = sealer.open(cid, file_keys[fid], blob)
        if opened is None:
            continue
        file_key = node_key(key, opened.meta.path)
        if opened.value is not None and leaves.get(file_key) != opened.value:
            continue  # a row of a version no leaf holds: dead, until its page goes
        meta = opened.meta
        live.add((fid_of(file_key), meta.path, meta.start_line, meta.end_line, meta.symbol,
                  meta.language, meta.chunk_hash))
    digest = hashlib.sha256()
    for k, v in sorted(leaves.items()):
        digest.update(k + (v or b""))
    return digest.digest()[:KEY_BYTES], sorted(live), tree


def _opened(found: list, file_keys: dict[int, bytes], sealer: RowSealer | None,
            key: WorkspaceKey, workspace_id: str) -> list[tuple]:
    """The sorted rows of `found` (chunk id, fid, blob), opened; padding rows left out."""
    rows = []
    for cid, fid, blob in found:
        if sealer is not None:
            opened = sealer.open(cid, file_keys[fid], blob)
            if opened is None:
                continue
            meta = opened.meta
        else:
            meta = open_meta(key, workspace_id, cid, blob)
        rows.append((fid, meta.path, meta.start_line, meta.end_line, meta.symbol,
                     meta.language, meta.chunk_hash))
    return sorted(rows)
