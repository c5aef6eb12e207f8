"""How the embedded store is tuned: one `StoreOptions`, given to `Store` and handed as it
is to each `WorkspaceStore` it opens. (The PostgreSQL store has its own,
sync.store.postgres.options.PgOptions.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sync.store.core.blobs import DEFAULT_BLOB_GRACE, DEFAULT_REF_MAX_AGE_DAYS
from sync.store.embedded.vector_index import IndexPolicy
from sync.wire import LIMITS, Limits

# Seconds between index snapshots while applies keep coming (`index_save_interval`).
DEFAULT_SAVE_INTERVAL = 60.0

#: The named points of an apply's write order (`WorkspaceStore.apply`) at which
#: `StoreOptions.crash_hook` is called: the paths marked pending (step 1), the rows
#: replaced (step 2), the values committed (step 3).
WRITE_POINTS = ("pending", "rows", "committed")


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """The tuning of a data dir's store and of every workspace in it; the defaults are
    what `codeveil serve` and the embedded store run with."""

    #: The bounds every request to the store's workspaces is held to (sync.wire.Limits).
    limits: Limits = LIMITS
    #: Applies between compactions of a server-search workspace's LanceDB table. Each
    #: apply adds a fragment and a version; merging them now and then keeps reads (index
    #: builds) fast and the folder small. An apply that deletes rows compacts at once
    #: (sync.store.core.rows), and the count starts again.
    compact_every: int = 32
    #: The OpenMP thread count faiss uses in the store's calls (None leaves faiss's
    #: default): a single exact query gets slower, not faster, with more threads on a
    #: small machine (measured 34 ms with 2 threads vs 15 ms with 1 at 100k x 384 on 2
    #: cores, far worse when the cores are busy), and the server runs concurrent searches
    #: on threads of its own anyway.
    faiss_threads: int | None = 1
    #: Picks and tunes the search index (sync.store.embedded.vector_index.IndexPolicy).
    index_policy: IndexPolicy = field(default_factory=IndexPolicy)
    #: Bounds how often applies snapshot the search index, in seconds; a snapshot never
    #: takes more than a tenth of the time either, however large the index
    #: (sync.store.embedded.search_index).
    index_save_interval: float = DEFAULT_SAVE_INTERVAL
    #: The OpenMP thread count of index builds (None: all cores), which unlike a single
    #: search do gain from threads.
    build_threads: int | None = None
    #: Called with each of WRITE_POINTS as an apply passes it, under the write lock; an
    #: exception it raises stops the apply there, as a process killed at that point
    #: would (what the crash tests do). None in service.
    crash_hook: Callable[[str], None] | None = None
    #: Seconds a sealed blob no ref names is kept in a workspace of several refs, so
    #: that a sync which found it in the pool a moment ago can still link to it (in a
    #: workspace of one ref such a blob goes at once, as before refs).
    blob_grace_s: float = DEFAULT_BLOB_GRACE
    #: Days after which `collect_garbage` drops a ref that has not synced (None: never).
    ref_max_age_days: float | None = DEFAULT_REF_MAX_AGE_DAYS
