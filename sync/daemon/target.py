"""What the daemon keeps in step: a `SyncTarget`, and the one it runs in production, a
repo's `Workspace` synced over and over (`WorkspaceSync`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from indexer.errors import CodeveilError

if TYPE_CHECKING:  # `daemon status` and `stop` import this package: keep it light
    from sync.syncer.progress import SyncFollower
    from sync.syncer.syncer import SyncReport
    from sync.workspace.workspace import Workspace

#: Errors meaning "the server could not be reached" when found in a failed sync's cause
#: chain (the HTTP client's own is added when a target has a server).
NETWORK_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


#: Changed paths (a branch switch, a pull) from which a daemon sync indexes the words
#: and leaves the embedding to the index's vector builder; fewer are embedded in the sync.
BACKGROUND_FROM_PATHS = 64
#: Chunks waiting for vectors from which the embedding goes to the builder: about the
#: model's work of a few seconds on a laptop's CPU.
BACKGROUND_FROM_CHUNKS = 256


class SyncTarget(Protocol):
    """One whole sync per `sync()` call. A failed call raises; the daemon retries it.
    `changed` is how many paths the watcher saw change since the last call (0 for a
    periodic check or a retry).

    `server` names where the index lives ("embedded", or the server's URL) for the
    status file; `unreachable` are the error kinds that mean the server could not be
    reached."""

    @property
    def server(self) -> str: ...

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]: ...

    def sync(self, changed: int = 0) -> SyncReport: ...

    def close(self) -> None: ...


class WorkspaceSync:
    """`workspace` synced by the daemon for its lifetime: one Workspace, so the model is
    loaded once and the store stays open between syncs (reopening it would rebuild its
    search index from disk before every write). `follower()` makes what runs beside each
    sync (the CLI passes retrieval's search-side refresh; this layer cannot import it)."""

    def __init__(self, workspace: Workspace,
                 follower: Callable[[], SyncFollower] | None = None) -> None:
        self.workspace = workspace
        self.follower = follower
        self._warm = False

    @property
    def server(self) -> str:
        from sync.checkout.config import load_config

        try:
            return load_config(self.workspace.root).server or "embedded"
        except CodeveilError:
            return "embedded"  # not indexed yet: the first sync creates an embedded index

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]:
        from sync.transport.http_client import ServerUnavailable

        return (ServerUnavailable, *NETWORK_ERRORS)

    def sync(self, changed: int = 0) -> SyncReport:
        """One sync. An edit's few chunks are embedded here, with the model this process
        keeps loaded; the start-up sync and a change of many paths first index the words
        (`Workspace.index_words`, seconds) and, when many chunks wait for vectors, leave
        them to the index's vector builder, so that the words are searchable at once and
        a branch switch does not hold the daemon for minutes."""
        from sync.daemon.builder import Builder, chunks_waiting
        from sync.syncer.sync_report import SyncReport

        builder = Builder(self.workspace.root)
        try:
            with builder.hold(wait=0.5) as held:  # rides out a `status` probe of the lock
                if not held:
                    # A vector builder syncs this index now: it is asked for one more
                    # pass rather than racing it with a second sync.
                    builder.start()
                    return SyncReport()
                handed: SyncReport | None = None  # the words' report, when handed over
                if not self._warm or changed >= BACKGROUND_FROM_PATHS:
                    words = self.workspace.index_words()
                    # Few waiting: embedded in the sync below (it reads those files again).
                    if chunks_waiting(self.workspace.root) >= BACKGROUND_FROM_CHUNKS:
                        handed = words
                if handed is None:
                    if not self._warm:
                        # Load the model with the start-up sync, which usually has little
                        # to embed, rather than with the first edit, which would wait.
                        self.workspace.embedder.embedder.embed(["warm up"])
                        self._warm = True
                    report = self.workspace.sync(
                        follower=self.follower() if self.follower is not None else None)
            if handed is not None:
                # The builder takes the lock this sync has let go of (started inside the
                # hold, it would take this process for a running builder).
                builder.start()
                if self.follower is not None:
                    self.follower().words()
                return handed
            if report.offline:
                # This machine's index is up to date; the store is not: failed, so that
                # the daemon retries with backoff until the server answers.
                from sync.transport.http_client import ServerUnavailable

                raise ServerUnavailable(report.offline)
            return report
        except BaseException:
            # Never reuse a client after a failure (a restarted server has dropped its
            # connections; an abandoned sync may have left it mid-request).
            self.workspace.close()
            raise

    def close(self) -> None:
        self.workspace.close()
