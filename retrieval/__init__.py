"""Query -> ranked code. The public API of codeveil.

The names are imported on first use (PEP 562), so that importing the package, as the
`codeveil` command does to start, does not load the model and store stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.api import Index, ModelMismatchError, SearchError, WrongKeyError
    from retrieval.hits import Hit
    from sync.syncer import SyncReport

__all__ = ["Hit", "Index", "ModelMismatchError", "SearchError", "SyncReport", "WrongKeyError"]

_HOMES = {
    "Index": "retrieval.api",
    "ModelMismatchError": "retrieval.api",
    "SearchError": "retrieval.api",
    "WrongKeyError": "retrieval.api",
    "Hit": "retrieval.hits",
    "SyncReport": "sync.syncer",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
