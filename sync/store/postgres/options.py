"""How the PostgreSQL store is tuned: one `PgOptions`, given to `PgStore` and handed as it
is to each `PgWorkspace` it opens. (The embedded store has its own,
sync.store.embedded.options.StoreOptions.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sync.store.core.blobs import DEFAULT_BLOB_GRACE, DEFAULT_REF_MAX_AGE_DAYS
from sync.store.postgres.conn import DEFAULT_POOL_SIZE
from sync.wire import LIMITS, Limits

__all__ = ["HNSW_THRESHOLD", "PgOptions"]

# Rows from which a workspace gets its HNSW index: the embedded store's exact/IVF crossover.
HNSW_THRESHOLD = 30_000


@dataclass(frozen=True, slots=True)
class PgOptions:
    """The tuning of a PostgreSQL store and of every workspace in it."""

    #: The bounds every request to the store's workspaces is held to (sync.wire.Limits).
    limits: Limits = LIMITS
    #: Connections kept idle per process (sync.store.postgres.conn.Pool); more may be open.
    pool_size: int = DEFAULT_POOL_SIZE
    #: Rows from which a workspace gets its HNSW index (sync.store.postgres.workspace).
    hnsw_threshold: int = HNSW_THRESHOLD
    #: As `StoreOptions.blob_grace_s`: seconds a sealed blob no ref names is kept in a
    #: workspace of several refs (sync.store.postgres.pool).
    blob_grace_s: float = DEFAULT_BLOB_GRACE
    #: As `StoreOptions.ref_max_age_days`: days after which `collect_garbage` drops a
    #: ref that has not synced (None: never).
    ref_max_age_days: float | None = DEFAULT_REF_MAX_AGE_DAYS
    #: As `StoreOptions.crash_hook`: called with each of WRITE_POINTS as an apply passes
    #: it; "pending" and "rows" inside the apply's one transaction (an exception there
    #: rolls all of it back, as a replica killed there would), "committed" after its
    #: commit. None in service.
    crash_hook: Callable[[str], None] | None = None
