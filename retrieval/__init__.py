"""Query -> ranked code. The public API of codeveil."""

from retrieval.api import Index, ModelMismatchError, SearchError, WrongKeyError
from retrieval.hits import Hit
from sync.syncer import SyncReport

__all__ = ["Hit", "Index", "ModelMismatchError", "SearchError", "SyncReport", "WrongKeyError"]
