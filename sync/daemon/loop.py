"""The daemon's loop: when to sync (start-up, debounced events, the periodic full
sync), retries with backoff, the status file and shutdown (see sync.daemon)."""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
import random
import select
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from indexer.errors import CodeveilError
from indexer.private_files import write_atomic
from sync.daemon.control import DaemonFiles, DaemonLock, read_pid
from sync.daemon.status import DaemonStatus
from sync.daemon.target import SyncTarget
from sync.daemon.watch import EventFilter, _Watch

log = logging.getLogger(__name__)

DEFAULT_FULL_INTERVAL = 300.0  # seconds between syncs when no event arrives
DEFAULT_DEBOUNCE = 0.5  # quiet time before a sync starts
DEFAULT_MAX_WAIT = 5.0  # longest delay of a sync while events keep coming
DEFAULT_BACKOFF_BASE = 1.0  # first retry after a failed sync
DEFAULT_BACKOFF_MAX = 60.0  # retries never wait longer than this
DEFAULT_STOP_GRACE = 10.0  # how long SIGTERM lets a sync in flight finish
WATCH_RETRY_SECONDS = 60.0  # re-arm a watcher that failed (e.g. out of inotify watches)
SKIPPED_IN_STATUS = 20  # a summary, not the full list of skipped files


class _Abandon(BaseException):
    """Raised in the main thread to abandon a sync in flight at shutdown.

    A BaseException, so that no `except Exception` in the sync swallows it.
    """



# -- the daemon -----------------------------------------------------------------------


def _backoff(failures: int, base: float, cap: float) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random.

    Jitter keeps many clients from retrying in lock-step when a shared server returns.
    """
    delay = min(cap, base * 2 ** max(0, failures - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def _summary(result: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(result)
    skipped = out.get("skipped")
    if isinstance(skipped, list) and len(skipped) > SKIPPED_IN_STATUS:
        out["skipped"] = skipped[:SKIPPED_IN_STATUS]
        out["skipped_truncated"] = True
    return out


def _caused_by(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kinds):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class Daemon:
    """Watches one repo and syncs `target` whenever its indexable files change.

    Each `target.sync()` is one whole sync; its report is stored in the status file as
    `last_result`, and any exception it raises counts as a failed sync and is retried
    with backoff. Exceptions of the target's `unreachable` kinds (anywhere in the cause
    chain) mean "the server could not be reached" and show as `server_reachable: false`
    in the status, beside the target's `server`. The caller closes the target.
    """

    def __init__(
        self,
        root: Path,
        target: SyncTarget,
        *,
        full_interval: float = DEFAULT_FULL_INTERVAL,
        debounce: float = DEFAULT_DEBOUNCE,
        max_wait: float = DEFAULT_MAX_WAIT,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        stop_grace: float = DEFAULT_STOP_GRACE,
        watch: bool = True,
    ) -> None:
        self.files = DaemonFiles.for_root(root)
        self.root = self.files.root
        self._target = target
        self.full_interval = full_interval
        self.debounce = debounce
        self.max_wait = max(max_wait, debounce)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.stop_grace = stop_grace
        self.unreachable = target.unreachable
        self._watch_enabled = watch
        self._filter = EventFilter(self.root)

        # Watcher threads hand raw batches over in `_raw`, and every hand-over, stop request
        # and signal writes a byte to a pipe the main loop sleeps on (the self-pipe trick):
        # a wake-up that comes before the loop starts waiting is never lost.
        self._lock = threading.Lock()  # guards _raw
        self._raw: list[tuple[float, set[tuple[int, str]] | BaseException]] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._syncing = False
        self._alarm_armed = False

        self._pending: set[str] = set()
        self._first_event = 0.0  # monotonic arrival of the oldest pending event
        self._last_event = 0.0
        self._next_full = 0.0  # start-up begins with a sync
        self._retry_at = 0.0
        self._failures = 0
        self._last_error_logged: str | None = None
        self._tree_watch: _Watch | None = None
        self._root_watch: _Watch | None = None
        self._tree_paths: list[str] = []
        self._watch_retry_at: float | None = None

        self._status = DaemonStatus(
            server=target.server, pid=os.getpid(), root=str(self.root), state="starting",
            full_interval=full_interval, debounce=debounce,
        )

    # -- control --------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the daemon to stop after the sync in flight (thread- and signal-safe)."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        if self._wake_w < 0:
            return  # run() has ended
        with contextlib.suppress(OSError):  # a full pipe wakes the loop anyway
            os.write(self._wake_w, b"\0")

    def _sleep(self, timeout: float | None) -> None:
        """Block until woken or `timeout` seconds pass, then empty the wake-up pipe."""
        select.select([self._wake_r], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self._stopping
        self.request_stop()
        if not self._syncing:
            return
        if first and self.stop_grace > 0:
            self._alarm_armed = True
            signal.setitimer(signal.ITIMER_REAL, self.stop_grace)
        else:
            raise _Abandon

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._syncing:
            raise _Abandon

    # -- main -----------------------------------------------------------------------

    def run(self, lock: DaemonLock | None = None) -> int:
        """Sync until stopped; returns the exit status (0 after a requested stop). Once.

        Takes the repo's lock unless given one (raises AlreadyRunningError). Signal
        handlers for SIGTERM and SIGINT are installed when run in the main thread.
        """
        own_lock = lock is None
        lock = lock or DaemonLock.acquire(self.files)
        handlers: dict[signal.Signals, Any] = {}
        old_wakeup_fd: int | None = None
        if threading.current_thread() is threading.main_thread():
            # The C-level handler writes to the pipe before the Python one runs, so a
            # signal arriving just before the loop blocks still wakes it.
            old_wakeup_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            # SIGHUP too: a foreground daemon whose terminal went away should stop
            # cleanly rather than die mid-write.
            for sig, handler in ((signal.SIGTERM, self._on_signal),
                                 (signal.SIGINT, self._on_signal),
                                 (signal.SIGHUP, self._on_signal),
                                 (signal.SIGALRM, self._on_alarm)):
                handlers[sig] = signal.signal(sig, handler)
        code = 0
        try:
            write_atomic(self.files.pid, f"{os.getpid()}\n", durable=False)
            self._status.started = time.time()
            self._write_status()
            log.info("daemon started for %s (pid %d): sync every %.0f s, debounce %.1f s",
                     self.root, os.getpid(), self.full_interval, self.debounce)
            try:
                self._arm_watch()
                self._loop()
            except _Abandon:
                log.warning("stopped mid-sync: the sync in flight was abandoned; the next"
                            " one resumes it")
            except Exception:
                log.exception("the daemon failed")
                code = 1
        finally:
            if handlers:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self._disarm_watch()
            for sig, old in handlers.items():
                signal.signal(sig, old)
            if old_wakeup_fd is not None:
                signal.set_wakeup_fd(old_wakeup_fd)
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            os.close(wake_r)
            os.close(wake_w)
            self._status.state = "stopped" if code == 0 else "failed"
            self._status.stopped = time.time()
            self._status.next_retry_at = None
            with contextlib.suppress(OSError):
                self._write_status()
            with contextlib.suppress(OSError):
                if read_pid(self.files.pid) == os.getpid():
                    self.files.pid.unlink()
            log.info("daemon stopped (pid %d)", os.getpid())
            if own_lock:
                lock.release()
        return code

    def _loop(self) -> None:
        while not self._stopping:
            with self._lock:
                raw, self._raw = self._raw, []
            self._absorb(raw)
            now = time.monotonic()
            due = self._next_due(now)
            if due <= now:
                self._sync()
                continue
            if self._watch_retry_at is not None and self._watch_retry_at <= now:
                self._arm_watch()
                continue
            wake = due if self._watch_retry_at is None else min(due, self._watch_retry_at)
            self._set_state()
            # A real blocking wait: nothing runs until an event, a timer or a signal.
            self._sleep(None if wake == float("inf") else wake - now)

    def _next_due(self, now: float) -> float:
        """When the next sync should start (monotonic time)."""
        if self._failures:
            return self._retry_at  # pending events wait for the backoff too
        if self._pending:
            return min(self._last_event + self.debounce, self._first_event + self.max_wait)
        if self.full_interval <= 0 and self._status.syncs:
            return float("inf")
        return self._next_full

    def _set_state(self, *, force: bool = False) -> None:
        if self._failures:
            state = "backoff"
        elif self._pending:
            state = "waiting"
        else:
            state = "idle"
        pending = len(self._pending)
        if force or state != self._status.state or pending != self._status.pending_changes:
            self._status.state, self._status.pending_changes = state, pending
            self._write_status()

    # -- events ---------------------------------------------------------------------

    def _sink(self, arrived: float, batch: set[tuple[int, str]] | BaseException) -> None:
        with self._lock:
            self._raw.append((arrived, batch))
        self._wake()

    def _absorb(self, raw: list[tuple[float, set[tuple[int, str]] | BaseException]]) -> None:
        """Filter raw watcher batches into pending paths; re-arm the watcher if needed."""
        top_level_changed = False
        for arrived, batch in raw:
            if isinstance(batch, BaseException):
                self._watch_failed(batch)
                continue
            relevant = 0
            for _change, path in batch:
                if os.path.dirname(path) == str(self.root):
                    top_level_changed = True
                if self._filter.relevant(path):
                    relevant += 1
                    if not self._pending:
                        self._first_event = arrived
                    self._pending.add(path)
            if relevant:
                self._last_event = max(self._last_event, arrived)
            log.debug("%d events, %d relevant", len(batch), relevant)
        if top_level_changed and self._root_watch is not None:
            wanted = self._watch_roots()
            if wanted != self._tree_paths:
                self._arm_watch(wanted)

    def _watch_roots(self) -> list[str]:
        """The top-level directories the walk enters (watched recursively)."""
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except OSError:
            return []
        return [e.path for e in entries
                if e.is_dir(follow_symlinks=False) and self._filter.watched_dir(e.name)]

    def _root_watch_paths(self) -> list[str]:
        """The folders watched without their subfolders: the root, and .git/ of a
        checkout (not a linked worktree's: its HEAD lives in the main checkout's .git),
        whose HEAD says which ref to sync."""
        git_dir = self.root / ".git"
        return [str(self.root)] + ([str(git_dir)] if git_dir.is_dir() else [])

    def _arm_watch(self, roots: list[str] | None = None) -> None:
        """(Re)start the watchers. A new tree watcher starts before the old one stops, so
        no event falls between them."""
        self._watch_retry_at = None
        if not self._watch_enabled:
            return
        old_tree = self._tree_watch
        try:
            if self._root_watch is None:
                self._root_watch = _Watch(self._root_watch_paths(), recursive=False,
                                          sink=self._sink)
            for attempt in range(3):
                paths = roots if roots is not None else self._watch_roots()
                try:
                    self._tree_watch = (
                        _Watch(paths, recursive=True, sink=self._sink) if paths else None
                    )
                    break
                except FileNotFoundError:  # a directory vanished while we listed them
                    roots = None
                    if attempt == 2:
                        raise
        except Exception as exc:
            self._watch_failed(exc)
            return
        if old_tree is not None:
            old_tree.close()
        self._tree_paths = paths
        self._status.watching, self._status.watch_error = True, None
        self._status.watched_dirs = len(paths)
        log.info("watching %s and %d top-level folders", self.root, len(paths))
        self._write_status()

    def _disarm_watch(self) -> None:
        for w in (self._tree_watch, self._root_watch):
            if w is not None:
                w.close()
        self._tree_watch = self._root_watch = None
        self._tree_paths = []

    def _watch_failed(self, exc: BaseException) -> None:
        log.error("file watching failed (%s); relying on the sync every %.0f s, retrying"
                  " the watcher in %.0f s", exc, self.full_interval, WATCH_RETRY_SECONDS)
        self._disarm_watch()
        self._watch_retry_at = time.monotonic() + WATCH_RETRY_SECONDS
        self._status.watching, self._status.watch_error = False, str(exc)
        self._write_status()

    # -- syncing --------------------------------------------------------------------

    def _sync(self) -> None:
        taken, self._pending = self._pending, set()
        started = time.time()
        if taken:
            reason = f"{len(taken)} changed paths"
        else:
            reason = "retry" if self._failures else "periodic check"
        # Marked as syncing before the last look at `_stopping`: a signal that comes
        # before this line is seen below, one that comes after it arms the grace timer.
        self._syncing = True
        try:
            if self._stopping:
                self._pending |= taken
                return
            self._status.state, self._status.last_sync_started = "syncing", started
            self._status.pending_changes = 0
            self._write_status()
            log.debug("sync started (%s)", reason)
            try:
                result = self._target.sync(changed=len(taken)).to_dict()
            except Exception as exc:
                self._syncing = False
                self._sync_failed(exc, taken)
            else:
                self._syncing = False
                self._sync_done(result, started, reason)
        finally:
            self._syncing = False
            if self._alarm_armed:  # SIGTERM came during the sync, which has now ended
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._alarm_armed = False
        self._next_full = time.monotonic() + self.full_interval
        self._status.syncs += 1
        self._status.last_sync_finished = time.time()
        # Wall time of the whole call, opening the store included (the report's
        # `seconds` covers the sync proper).
        self._status.last_sync_seconds = round(time.time() - started, 3)
        self._set_state(force=True)

    def _sync_done(self, result: Mapping[str, Any], started: float, reason: str) -> None:
        if self._failures:
            log.info("sync succeeded again after %d failed attempts", self._failures)
        self._failures = 0
        self._status = replace(
            self._status, last_sync_ok=True, last_success=time.time(),
            last_result=_summary(result), consecutive_errors=0, next_retry_at=None,
            server_reachable=True,
        )
        changed = int(result.get("files_changed", 0) or 0)
        deleted = int(result.get("files_deleted", 0) or 0)
        level = logging.INFO if changed or deleted else logging.DEBUG
        log.log(level, "synced (%s): %d files changed, %d deleted, %s chunks, %.2f s",
                reason, changed, deleted, result.get("chunks_total", "?"),
                time.time() - started)

    def _sync_failed(self, exc: Exception, taken: set[str]) -> None:
        self._pending |= taken  # not indexed yet: still pending
        if self._pending:
            self._first_event = self._last_event = time.monotonic()
        self._failures += 1
        delay = _backoff(self._failures, self.backoff_base, self.backoff_max)
        self._retry_at = time.monotonic() + delay
        unreachable = _caused_by(exc, self.unreachable)
        message = str(exc) or type(exc).__name__
        self._status = replace(
            self._status, last_sync_ok=False, consecutive_errors=self._failures,
            last_error=message, last_error_at=time.time(), next_retry_at=time.time() + delay,
        )
        if unreachable:
            self._status.server_reachable = False
        expected = isinstance(exc, CodeveilError | OSError)
        if expected or message == self._last_error_logged:
            log.warning("sync failed (attempt %d): %s; retrying in %.1f s",
                        self._failures, message, delay)
        else:  # not an error codeveil raises on purpose: a traceback for the bug report
            log.exception("sync failed (attempt %d); retrying in %.1f s", self._failures, delay)
        self._last_error_logged = message
        if not self.root.is_dir():
            log.error("%s is gone; stopping", self.root)
            self.request_stop()

    def _write_status(self) -> None:
        try:
            # Rewritten on every change: worth no fsync (a status lost to a power cut
            # is rewritten by the next start).
            text = json.dumps(self._status.to_dict(), indent=2, default=str) + "\n"
            write_atomic(self.files.status, text, durable=False)
        except OSError as exc:  # a full disk must not kill the daemon
            log.warning("cannot write %s: %s", self.files.status, exc)
