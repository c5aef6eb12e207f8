"""Which backend a store spec names, and opening it: a PostgreSQL URL (postgresql://...)
opens `PgStore` (sync.store.postgres), anything else is a data dir of the embedded
store (sync.store.embedded). The one place that knows both backends: the server and
the CLI open a store through `open_store`, and mypy holds each backend to the
interface (sync.store.core.backend) at the end of this module."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sync.store.core.backend import StoreBackend
from sync.store.db_url import is_database_url, mask_url
from sync.store.embedded.registry import Store
from sync.wire import StoreError

__all__ = ["describe_store", "open_store"]


def describe_store(spec: str | os.PathLike[str]) -> str:
    """The store spec as it may be logged: a database URL without its password."""
    return mask_url(str(spec)) if is_database_url(spec) else str(Path(spec))


def open_store(spec: str | os.PathLike[str]) -> StoreBackend:
    """The store named by `spec`: a PostgreSQL URL (postgresql://...) or a data dir."""
    if not is_database_url(spec):
        return Store(spec)
    try:
        from sync.store.postgres.registry import PgStore
    except ImportError as exc:
        raise StoreError(
            f"serving {describe_store(spec)} needs psycopg ({exc}); install it with"
            " `pip install 'codeveil[postgres]'`"
        ) from None
    return PgStore(str(spec))


if TYPE_CHECKING:  # mypy checks that both backends keep the interface; nothing runs here
    from sync.store.core.backend import WorkspaceBackend
    from sync.store.embedded.workspace import WorkspaceStore
    from sync.store.postgres.registry import PgStore
    from sync.store.postgres.workspace import PgWorkspace

    _embedded: type[StoreBackend] = Store
    _embedded_workspace: type[WorkspaceBackend] = WorkspaceStore
    _postgres: type[StoreBackend] = PgStore
    _postgres_workspace: type[WorkspaceBackend] = PgWorkspace
