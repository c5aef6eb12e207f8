"""The store: what a server keeps, and what the embedded default keeps under a repo's
`.codeveil/store/`. The embedded store (below) keeps one data dir holding many
workspaces; the PostgreSQL store (sync.store.postgres) keeps them in a database; both
keep the interface of sync.store.core.backend.

Everything stored is a keyed hash or ciphertext (the client never sends anything else);
the only cleartext is each workspace's dim, model id and creation time.

Layout::

    DATA/registry.sqlite                     workspaces: id, sha256(token), dim, model id,
                                             key check, created_at, mode
    DATA/workspaces/<id>/tree.sqlite         the Merkle tree: nodes(key, parent, value,
                                             is_dir), and counters (generation, next_rid);
                                             a sealed workspace's chunk rows too:
                                             rows(rid, fid, chunk_id, meta)
    DATA/workspaces/<id>/chunks.lance/       server-search only: LanceDB table of chunk
                                             rows: rid, chunk_id, fid, vector, meta
    DATA/workspaces/<id>/writer.lock         empty; flock'ed by the writing process
    DATA/workspaces/<id>/search.index        server-search only: snapshot of the search
                                             index and its rows (sync.store.embedded.vector_index),
                                             and its generation

Crash safety. `apply` writes in three steps (see `WorkspaceStore.apply`) so that a node's
value is only ever set after the chunks it stands for are stored, and every node above
a change is pending (value NULL) before any chunk row moves. NULL never equals a client's
value, so whatever point a writer dies at, the next diff descends into what it touched.
In a sealed workspace each step is a transaction of tree.sqlite; in a server-search one
step 2 writes LanceDB.

SQLite runs in WAL mode with synchronous=FULL: each commit is fsynced before the next
step starts. With NORMAL a power cut could lose the step-1 commit (the pending marks)
while step 2's rows were kept, and an old leaf value would then claim content the store
no longer has. FULL costs one fsync per step, i.e. three per apply batch. (LanceDB's own
durability on power loss is LanceDB's; a process crash is covered fully.)

A workspace is of one of two modes (sync.records.MODES). A sealed workspace's rows hold
no vector and it has no search index: its rows are only stored and read back
(`file_rows`), and the client searches; they live in tree.sqlite, and LanceDB, pyarrow
and faiss are never imported for it. A server-search workspace ranks vectors here.
Row layout, reading rows back and removing superseded rows' bytes: sync.store.core.rows.
A sealed workspace written by store format 2 or before keeps its rows in LanceDB; its
first open copies them into tree.sqlite in one transaction and then removes the table
(`WorkspaceFiles.move_sealed_rows`; a crash before the commit leaves the table as it
was, and the next open starts again; after it, the next open only removes the table).

A server-search workspace's search index, its snapshot and how it is kept in step with
LanceDB, also across processes: sync.store.embedded.search_index.

A workspace (`WorkspaceStore`) is composed of members, not base classes: its files
(`WorkspaceFiles`: tree.sqlite, locks, the log's cut), in a server-search workspace its
search index (`SearchIndex`, holding its `LanceRows`), and its pool requests
(`PoolOps`); the checks and the SQL are functions. Members are built on the files and
never on the workspace or on each other's internals.

Folders and modules, one job each. `core/` is what both backends share; `embedded/` and
`postgres/` each import `core/` and never each other; `open.py` alone knows both::

    open.py             open_store: a PostgreSQL URL or a data dir, opened as its backend
    core/
      backend.py        the interface both backends keep (Protocols), WorkspaceRecord
      registry.py       Registry: create, authenticate, invitee tokens, caches, close,
                        written once over each backend's RegistryTable (its SQL)
      checks.py         request validation (validate_apply, its `Update`s) and the
                        directory-value compare-and-set
      tree_plan.py      step 1 of an apply, decided once for both backends (pure)
      mode_rows.py      ModeRows: a workspace's mode as one member chosen when it opens,
                        the hooks its operations call where the modes differ
      workspace_head.py WorkspaceHead: record, limits, crash hook; info and root answers
      rows.py           each mode's row layout, reading rows back, purging superseded rows
      blobs.py          a pull by blob checked and answered; the GC's defaults
      invitees.py       invitee tokens: the record, their checks and expiry
    embedded/           the store in a data dir (SQLite + LanceDB)
      options.py        StoreOptions: the tuning of a store and its workspaces
      registry.py       Store: the Registry over registry.sqlite and the workspaces' folders
      workspace.py      WorkspaceStore: its members; tree reads, apply's write order top
                        to bottom, set_dir_values, verify/check, close
      mode_rows.py      EmbeddedRows: the hooks of the embedded write order, per mode
      sealed_rows.py    SealedRows: a sealed workspace's rows, a pool in tree.sqlite
      search_rows.py    SearchRows: a server-search workspace's rows, in LanceDB under
                        its SearchIndex
      workspace_files.py  WorkspaceFiles: tree.sqlite's connections, locks, writer.lock,
                        the write-ahead log's cut, the format-2 sealed rows' move
      search_index.py   SearchIndex: refresh, load, catch up, build, save; its part of
                        an apply (prepare, replace rows, follow, after)
      vector_index.py   the faiss index, its rows and its snapshot file
      sqlite_tree.py    SQLite connections, formats and migrations; the tree's SQL
      lance_table.py    the LanceDB table: lazy import, read errors, scans, new rows
      lance_rows.py     LanceRows: one workspace's table, written, compacted, counted
      pool.py           refs and the blob pool's SQL
      pool_ops.py       PoolOps: refs listed and dropped, GC
      workspace_checks.py  `codeveil doctor`'s look at one workspace (a function)
    postgres/           the store in PostgreSQL (+ pgvector)
      options.py        PgOptions: the tuning of a store and its workspaces
      registry.py       PgStore: the Registry over the workspaces and invitees tables
      workspace.py      PgWorkspace: one workspace's tree, apply and checks
      mode_rows.py      PgRows: the hooks of the PostgreSQL write order, per mode
      sealed_rows.py    PgSealedRows: a sealed workspace's rows, blobs of the pool
      search_rows.py    PgSearchRows: rows with vectors, exact or HNSW search
      schema.py         the tables, their version and migrations
      conn.py           connections (Pool), each mode's COPY, vectors as text
      tree.py           the tree's SQL per ref, a committed leaf's rows
      pool.py           refs and the blob pool

The names below are imported on first use (indexer.lazy): importing the package loads
neither the store's modules nor LanceDB, pyarrow, faiss or psycopg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from sync.store.core.rows import fid_of
    from sync.store.embedded.options import StoreOptions
    from sync.store.embedded.registry import Store
    from sync.store.embedded.search_index import SNAPSHOT
    from sync.store.embedded.sqlite_tree import STORE_FORMAT
    from sync.store.embedded.vector_index import IndexPolicy
    from sync.store.embedded.workspace import WorkspaceStore
    from sync.wire import (
        AuthError,
        BadRequest,
        PermissionDenied,
        StoreCorrupt,
        StoreError,
        WorkspaceExists,
        WorkspaceNotFound,
    )

__all__ = [
    "SNAPSHOT",
    "STORE_FORMAT",
    "AuthError",
    "BadRequest",
    "IndexPolicy",
    "PermissionDenied",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreOptions",
    "WorkspaceExists",
    "WorkspaceNotFound",
    "WorkspaceStore",
    "fid_of",
]

_HOMES = {
    "SNAPSHOT": "sync.store.embedded.search_index",
    "STORE_FORMAT": "sync.store.embedded.sqlite_tree",
    "AuthError": "sync.wire",
    "BadRequest": "sync.wire",
    "IndexPolicy": "sync.store.embedded.vector_index",
    "PermissionDenied": "sync.wire",
    "Store": "sync.store.embedded.registry",
    "StoreCorrupt": "sync.wire",
    "StoreError": "sync.wire",
    "StoreOptions": "sync.store.embedded.options",
    "WorkspaceExists": "sync.wire",
    "WorkspaceNotFound": "sync.wire",
    "WorkspaceStore": "sync.store.embedded.workspace",
    "fid_of": "sync.store.core.rows",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
