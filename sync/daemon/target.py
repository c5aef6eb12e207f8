"""What the daemon keeps in step: a `SyncTarget`, and the one it runs in production, a
repo's `Workspace` synced over and over (`WorkspaceSync`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from indexer.errors import CodeveilError

if TYPE_CHECKING:  # `daemon status` and `stop` import this package: keep it light
    from sync.progress import SyncFollower
    from sync.syncer import SyncReport
    from sync.workspace import Workspace

#: Errors meaning "the server could not be reached" when found in a failed sync's cause
#: chain (the HTTP client's own is added when a target has a server).
NETWORK_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


class SyncTarget(Protocol):
    """One whole sync per `sync()` call. A failed call raises; the daemon retries it.

    `server` names where the index lives ("embedded", or the server's URL) for the
    status file; `unreachable` are the error kinds that mean the server could not be
    reached."""

    @property
    def server(self) -> str: ...

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]: ...

    def sync(self) -> SyncReport: ...

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
        from sync.config import load_config

        try:
            return load_config(self.workspace.root).server or "embedded"
        except CodeveilError:
            return "embedded"  # not indexed yet: the first sync creates an embedded index

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]:
        from sync.http_client import ServerUnavailable

        return (ServerUnavailable, *NETWORK_ERRORS)

    def sync(self) -> SyncReport:
        if not self._warm:
            # Load the model with the start-up sync, which usually has nothing to embed,
            # rather than with the first edit, which would then wait for it.
            self.workspace.embedder.embedder.embed(["warm up"])
            self._warm = True
        from sync.builder import Builder

        builder = Builder(self.workspace.root)
        try:
            with builder.hold(wait=0.5) as held:  # rides out a `status` probe of the lock
                if not held:
                    # A vector builder syncs this index now: it is asked for one more
                    # pass rather than racing it with a second sync.
                    builder.start()
                    from sync.sync_report import SyncReport

                    return SyncReport()
                report = self.workspace.sync(
                    follower=self.follower() if self.follower is not None else None)
            if report.offline:
                # This machine's index is up to date; the store is not: failed, so that
                # the daemon retries with backoff until the server answers.
                from sync.http_client import ServerUnavailable

                raise ServerUnavailable(report.offline)
            return report
        except BaseException:
            # Never reuse a client after a failure (a restarted server has dropped its
            # connections; an abandoned sync may have left it mid-request).
            self.workspace.close()
            raise

    def close(self) -> None:
        self.workspace.close()
