"""The index daemon: keeps one repo's index in step with its working tree within seconds.

    lock = DaemonLock.acquire(DaemonFiles.for_root(root))
    target = WorkspaceSync(Workspace(root))
    Daemon(root, target).run(lock)           # until SIGTERM / SIGINT / request_stop()

The daemon runs a `SyncTarget` (`target.sync() -> SyncReport`); in production a
`WorkspaceSync`, the repo's typed `Workspace.sync()`. This package sits in the sync layer
and must not import retrieval: what retrieval adds to a sync (the search side kept built)
comes in as the workspace sync's `follower`. Every sync re-walks the whole tree by stat (cheap:
only stat-changed files are read), so the watcher only has to say *when* to sync, never
*what*: a missed, merged or reordered event costs at most a delay, never a wrong index.

How it decides when to sync:

- Start-up begins with a sync; after that one runs at least every `full_interval`
  seconds to catch anything the watcher missed (network filesystems, a dropped event).
- File events (watchfiles, i.e. inotify / FSEvents / ReadDirectoryChangesW through the
  Rust `notify` crate) are pre-filtered with the indexer's ignore rules, then debounced:
  a sync starts once the tree has been quiet for `debounce` seconds, or `max_wait`
  seconds after the first pending event, so a branch switch becomes one sync.
- A failed sync (server down, disk full, ...) is retried with exponential backoff and
  jitter; events meanwhile stay pending. Syncs are idempotent, so nothing is lost or
  sent twice.

What it watches: the root non-recursively, plus each top-level directory the walk would
enter, recursively. `.git/`, `.codeveil/` (where the daemon itself writes), top-level
`node_modules/`, virtualenvs and other ignored trees are never watched, which keeps
idle wake-ups and kernel watches low; a new top-level directory re-arms the watcher.

Files, all under `.codeveil/`:

    daemon.lock   flock'ed for the daemon's lifetime: one daemon per repo. The kernel
                  drops the lock when the process dies, even on kill -9.
    daemon.pid    the daemon's pid (a convenience; the lock is the truth)
    daemon.json   status, replaced atomically (see `Daemon._status`)
    daemon.log    the log, rotated at 1 MB, 3 old files kept

Shutdown: SIGTERM (and SIGINT) stop the daemon. A sync in flight gets `stop_grace`
seconds to finish; after that, or on a second signal, it is abandoned, which is safe
because a sync killed at any point is resumed by the next (docs/architecture.md,
"Write order").

Modules, one job each: `control` (the files, the lock, probing, starting and stopping
from another process), `logs` (the rotating log), `watch` (which events matter, and the
watcher thread), `loop` (the `Daemon` itself: when to sync, retries, status, shutdown),
`target` (what it syncs), `report` (the status as lines for people).
"""

from __future__ import annotations

from sync.daemon.control import (
    EXIT_NOT_RUNNING,
    AlreadyRunningError,
    DaemonError,
    DaemonFiles,
    DaemonLock,
    DaemonState,
    probe,
    read_status,
    spawn,
    stop,
)
from sync.daemon.logs import setup_logging
from sync.daemon.loop import Daemon
from sync.daemon.status import DaemonStatus
from sync.daemon.target import NETWORK_ERRORS, SyncTarget, WorkspaceSync
from sync.daemon.watch import EventFilter

__all__ = [
    "EXIT_NOT_RUNNING",
    "NETWORK_ERRORS",
    "AlreadyRunningError",
    "Daemon",
    "DaemonError",
    "DaemonFiles",
    "DaemonLock",
    "DaemonState",
    "DaemonStatus",
    "EventFilter",
    "SyncTarget",
    "WorkspaceSync",
    "probe",
    "read_status",
    "setup_logging",
    "spawn",
    "stop",
]
