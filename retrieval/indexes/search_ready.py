"""The search side kept ready while a large index runs, so that nobody's first search
builds it.

A search reads two indexes built from the client's chunk table: the lexical one
(`.codeveil/lexical/`) and, in a sealed workspace, the vectors (`.codeveil/vectors/`);
grep reads a third, the trigrams (`.codeveil/trigrams/`), brought in step at the end.
Each is brought in step by whichever process searches next, and building it from
scratch takes seconds per ten thousand chunks (scikit-learn's 27,671: ~9.5 s of
counting terms on a busy machine). After a first index that cost fell on the first
search, the README's `codeveil index . && codeveil search ...` included.

So an index that sends many files (`FOLLOW_FILES` or more) starts a thread that
refreshes the lexical index from the chunk table every `interval` seconds while the
chunker fills it (a search from another process then only counts the chunks written
since), and once more with the vectors when the sync is done. A small re-index never
starts it: it would import the ranking stack into a call that should take under a
second, and the search after it has little to catch up.

A refresh that fails (a read-only folder, a full disk) is logged and left to the next
search, which would have built it anyway.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.local_chunks import open_state_db
from sync.checkout.config import RepoConfig, codeveil_dir, load_config, state_path
from sync.syncer.progress import Progress

if TYPE_CHECKING:
    from retrieval.indexes.lexical import LexicalStore
    from retrieval.indexes.local_vectors import LocalVectorStore
    from retrieval.indexes.static_vectors import StaticVectorStore
    from retrieval.indexes.trigram_index import TrigramStore
    from sync.workspace.workspace import Workspace

log = logging.getLogger(__name__)

#: Files sent by an index from which the search side is kept ready as it goes.
FOLLOW_FILES = 100
#: Seconds between the lexical refreshes during the index.
FOLLOW_INTERVAL_S = 2.0


class SearchReady:
    """Refreshes the lexical index while `workspace` syncs (`start`), and the lexical and
    vector indexes at its end (`finish`): a `sync.syncer.progress.SyncFollower`.

    `vectors(root, state db, config)` brings the vector index of a sealed workspace in
    step (a server-search one has none here); `Index.index` passes its own, so that its
    next search finds them in memory. Without one, a store of its own does it (the
    daemon's case: its searches run in other processes, which load them from disk)."""

    def __init__(self, workspace: Workspace,
                 vectors: Callable[[Path, sqlite3.Connection, RepoConfig], object] | None = None,
                 interval: float = FOLLOW_INTERVAL_S) -> None:
        self.workspace = workspace
        self.vectors = vectors or self._own_vectors
        self.interval = interval
        self.refreshes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lexical: LexicalStore | None = None  # used by one thread at a time
        self._vector_store: LocalVectorStore | None = None
        self._trigrams: TrigramStore | None = None
        self._static: StaticVectorStore | None = None

    def watch(self, progress: Progress | None) -> Progress:
        """`progress`, starting the refreshes once the sync plans `FOLLOW_FILES` files."""
        return StartsSearchReady(progress, self)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._follow, name="codeveil-search-ready",
                                            daemon=True)
            self._thread.start()

    def finish(self, *, completed: bool) -> float:
        """Stop following; when the index `completed`, refresh both indexes once more.
        Returns the seconds that last refresh took (0 when there was none)."""
        if self._thread is None:
            return 0.0
        self._stop.set()
        self._thread.join()
        if not completed:
            return 0.0
        started = time.perf_counter()
        self._refresh(with_vectors=True, static=True)
        return time.perf_counter() - started

    def words(self) -> None:
        """Bring the lexical, static vector and trigram indexes in step with the chunk
        table once: what `codeveil index` does before it returns, so that the first
        search by words and by the static tier's meaning, and grep, find them built."""
        self._refresh(with_vectors=False, trigrams=True, static=True)

    def _own_vectors(self, root: Path, db: sqlite3.Connection, config: RepoConfig) -> None:
        from retrieval.indexes.local_vectors import LocalVectorStore

        if self._vector_store is None:
            self._vector_store = LocalVectorStore(codeveil_dir(root) / "vectors")
        self._vector_store.current(db, self.workspace.embedder.cache, config.model_id,
                                   config.dim)

    def _grep_index(self, root: Path, db: sqlite3.Connection) -> None:
        from retrieval.indexes.trigram_index import TrigramStore

        if self._trigrams is None:
            self._trigrams = TrigramStore(codeveil_dir(root) / "trigrams")
        self._trigrams.current(db)

    def _follow(self) -> None:
        while not self._stop.wait(self.interval):
            self._refresh(with_vectors=False)

    def _static_index(self, root: Path, db: sqlite3.Connection) -> None:
        from retrieval.indexes.static_vectors import StaticVectorStore

        if self._static is None:
            self._static = StaticVectorStore(codeveil_dir(root) / "static")
        self._static.index_or_none(db)

    def _static_beside(self, root: Path) -> None:
        try:
            db = open_state_db(state_path(root))  # a connection of this thread's own
            try:
                self._static_index(root, db)
            finally:
                db.close()
        except Exception:  # as below: the next search builds it
            log.warning("could not bring the static vectors in step in %s", root,
                        exc_info=True)

    def _refresh(self, *, with_vectors: bool, trigrams: bool = False,
                 static: bool = False) -> None:
        from retrieval.indexes.lexical import LexicalStore

        root = self.workspace.root  # the sync created the workspace before it planned
        try:
            if self._lexical is None:
                # One store for every refresh: it keeps the index it built in memory and
                # only counts the chunks written since, rather than reloading it each time.
                self._lexical = LexicalStore(codeveil_dir(root) / "lexical")
            # The static vectors in a thread of their own, beside the others: most of
            # their time is the tokenizer's and numpy's, which leave the GIL, so on two
            # cores `codeveil index` returns about a second sooner on 8k chunks.
            side = threading.Thread(target=self._static_beside, args=(root,),
                                    name="codeveil-static") if static else None
            if side is not None:
                side.start()
            db = open_state_db(state_path(root))
            try:
                self._lexical.current(db)
                config = load_config(root)
                if with_vectors and config.sealed:
                    self.vectors(root, db, config)
                if with_vectors or trigrams:
                    self._grep_index(root, db)
            finally:
                db.close()
                if side is not None:
                    side.join()
            self.refreshes += 1
        except Exception:  # the next search builds what is missing, as it always could
            log.warning("could not bring the search side in step in %s", root,
                        exc_info=True)


class StartsSearchReady(Progress):
    """`progress` as given, starting `ready` once the sync plans `FOLLOW_FILES` files."""

    def __init__(self, progress: Progress | None, ready: SearchReady) -> None:
        self.inner = progress or Progress()
        self.ready = ready

    def scanned(self, files: int) -> None:
        self.inner.scanned(files)

    def planned(self, files: int, chunks_hint: int) -> None:
        if files >= FOLLOW_FILES:
            self.ready.start()
        self.inner.planned(files, chunks_hint)

    def files_done(self, n: int) -> None:
        self.inner.files_done(n)

    def chunks_done(self, embedded: int, cached: int) -> None:
        self.inner.chunks_done(embedded, cached)

    def stages(self, seconds: dict[str, float], embed_chunks_per_s: float) -> None:
        self.inner.stages(seconds, embed_chunks_per_s)
