"""Keys and encryption, the client<->server protocol, one sync, the server, the store and
the daemon, a folder a job (docs/architecture.md, "Layout"): crypto/, checkout/,
transport/, syncer/, workspace/, server/, store/, daemon/, and the vocabulary both sides
speak at the top (records, wire, errors, client). The names below are imported on first
use (see indexer.lazy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from sync.client import StoreClient
    from sync.crypto.keys import WorkspaceKey, create_key, load_key
    from sync.errors import SyncError
    from sync.store.embedded.registry import Store
    from sync.store.local_client import LocalClient
    from sync.syncer.syncer import Syncer, SyncReport
    from sync.transport.http_client import HttpClient
    from sync.wire import StoreError

__all__ = [
    "HttpClient",
    "LocalClient",
    "Store",
    "StoreClient",
    "StoreError",
    "SyncError",
    "SyncReport",
    "Syncer",
    "WorkspaceKey",
    "create_key",
    "load_key",
]

_HOMES = {
    "HttpClient": "sync.transport.http_client",
    "LocalClient": "sync.store.local_client",
    "Store": "sync.store.embedded.registry",
    "StoreClient": "sync.client",
    "StoreError": "sync.wire",
    "SyncError": "sync.errors",
    "SyncReport": "sync.syncer.syncer",
    "Syncer": "sync.syncer.syncer",
    "WorkspaceKey": "sync.crypto.keys",
    "create_key": "sync.crypto.keys",
    "load_key": "sync.crypto.keys",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
