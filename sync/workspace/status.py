"""What `codeveil status` shows: where a workspace is, what it holds here and in its
store, and where that store is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from indexer.record_view import FieldsMapping


@dataclass(frozen=True, eq=False)
class WorkspaceStatus(FieldsMapping):
    """One workspace's status (`Workspace.status`, `Index.status`).

    Read as attributes; also as the dict it used to be (`status["files"]`, `.items()`),
    and `to_dict()` is its JSON, keys in this order.
    """

    root: str
    workspace_id: str
    server: str  # its URL, or "embedded"
    mode: str
    model_id: str
    files: int  # files and chunks indexed on this machine
    chunks: int
    # A sealed store's rows include the padding rows of each file (sync.crypto.sealed_rows):
    # its chunks are its rows less the padding this machine's files account for.
    # None when the server could not be reached (then `offline` says so). The rows and
    # nodes are asked of a server only on demand (`status --server`).
    server_chunks: int | None
    server_rows: int | None
    server_nodes: int | None
    # The ref (branch tree, sync.checkout.refs) this checkout syncs; None where the store keeps
    # one tree (server-search, or a store without a blob pool).
    ref: str | None = None
    # When this copy last completed a sync with its server (UTC ISO 8601); None in an
    # embedded workspace, or before the first sync recorded it.
    last_sync: str | None = None
    # Set when the server could not be reached: `sync.checkout.server_contact.Unreachable`'s dict.
    offline: dict[str, Any] | None = None
    # Asked for (`status --server`): whether the store's tree of this checkout's ref is
    # the one it synced (`sync.syncer.tree_check.TreeCheck`'s dict); None when not asked.
    server_tree: dict[str, Any] | None = None
