"""Query -> ranked code. The public API of codeveil.

The names are imported on first use (PEP 562, see indexer.lazy), so that importing the
package, as the `codeveil` command does to start, does not load the model and store stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from indexer.errors import CodeveilError
    from indexer.sqlite_files import CorruptFileError
    from retrieval.faces.api import Index, SearchError, WrongKeyError
    from retrieval.faces.multi import MultiIndex
    from retrieval.search.coverage import Coverage
    from retrieval.search.hits import Hit
    from sync.checkout.config import NoIndexError
    from sync.errors import KeyMissingError
    from sync.syncer.syncer import SyncReport
    from sync.transport.http_client import ServerUnavailable
    from sync.workspace.status import WorkspaceStatus
    from sync.workspace.workspace import ModelMismatchError

# CodeveilError is the base of every error codeveil raises on purpose (indexer.errors
# draws the tree): one `except` catches them all. The others here are the ones worth
# telling apart: no index, no key, a wrong key, another model, a damaged file, a server
# that does not answer, bad search options.
__all__ = ["CodeveilError", "CorruptFileError", "Coverage", "Hit", "Index", "KeyMissingError",
           "ModelMismatchError", "MultiIndex", "NoIndexError", "SearchError",
           "ServerUnavailable", "SyncReport", "WorkspaceStatus", "WrongKeyError"]

_HOMES = {
    "CodeveilError": "indexer.errors",
    "CorruptFileError": "indexer.sqlite_files",
    "KeyMissingError": "sync.errors",
    "NoIndexError": "sync.checkout.config",
    "ServerUnavailable": "sync.transport.http_client",
    "WorkspaceStatus": "sync.workspace.status",
    "Coverage": "retrieval.search.coverage",
    "Index": "retrieval.faces.api",
    "ModelMismatchError": "sync.workspace.workspace",
    "SearchError": "retrieval.faces.api",
    "WrongKeyError": "retrieval.faces.api",
    "Hit": "retrieval.search.hits",
    "MultiIndex": "retrieval.faces.multi",
    "SyncReport": "sync.syncer.syncer",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
