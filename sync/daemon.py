"""The index daemon: keeps one repo's index in step with its working tree within seconds.

    lock = DaemonLock.acquire(DaemonFiles.for_root(root))
    Daemon(root, sync_once).run(lock)        # until SIGTERM / SIGINT / request_stop()

The sync itself is injected (`sync_once() -> report dict`): this module sits in the sync
layer and must not import retrieval. Every sync re-walks the whole tree by stat (cheap:
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
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import json
import logging
import logging.handlers
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from indexer.errors import CodeveilError
from indexer.ignore import ALWAYS_SKIPPED, CODEVEILIGNORE, GITIGNORE, VENV_MARKER, IgnoreRules
from indexer.private_files import write_atomic
from indexer.walk import name_skip_reason
from sync.errors import SyncError
from sync.workspace import codeveil_dir

log = logging.getLogger(__name__)

SyncOnce = Callable[[], Mapping[str, Any]]

DEFAULT_FULL_INTERVAL = 300.0  # seconds between syncs when no event arrives
DEFAULT_DEBOUNCE = 0.5  # quiet time before a sync starts
DEFAULT_MAX_WAIT = 5.0  # longest delay of a sync while events keep coming
DEFAULT_BACKOFF_BASE = 1.0  # first retry after a failed sync
DEFAULT_BACKOFF_MAX = 60.0  # retries never wait longer than this
DEFAULT_STOP_GRACE = 10.0  # how long SIGTERM lets a sync in flight finish
LOG_MAX_BYTES = 1_000_000
LOG_BACKUPS = 3

# watchfiles' Rust loop has no blocking wait: it sleeps one step at a time, then checks
# for a stop request and whether a burst of events has ended, and hands a batch over
# at least every two steps while events keep coming. The main loop waits for
# `debounce` seconds without a batch, so two steps must stay well below the debounce
# for a long burst not to look like a quiet tree. 100 ms keeps two idle watchers under
# 0.1% of a core.
WATCH_STEP_MS = 100
WATCH_MAX_BATCH_MS = WATCH_STEP_MS
WATCH_RETRY_SECONDS = 60.0  # re-arm a watcher that failed (e.g. out of inotify watches)
LOCK_WAIT_SECONDS = 2.0  # `status` probes hold the lock for microseconds; ride them out
SKIPPED_IN_STATUS = 20  # a summary, not the full list of skipped files

EXIT_NOT_RUNNING = 3  # LSB: "program is not running"


class DaemonError(SyncError):
    """The daemon could not be started, stopped or reached."""


class AlreadyRunningError(DaemonError):
    """Another daemon holds this repo's lock."""

    def __init__(self, root: Path, pid: int | None) -> None:
        self.root = root
        self.pid = pid
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"a codeveil daemon is already running for {root} ({who})")


class _Abandon(BaseException):
    """Raised in the main thread to abandon a sync in flight at shutdown.

    A BaseException, so that no `except Exception` in the sync swallows it.
    """


# -- files ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonFiles:
    """Where one repo's daemon keeps its lock, pid, status and log."""

    root: Path

    @classmethod
    def for_root(cls, root: Path) -> DaemonFiles:
        return cls(Path(root).resolve())

    @property
    def dir(self) -> Path:
        return codeveil_dir(self.root)

    @property
    def lock(self) -> Path:
        return self.dir / "daemon.lock"

    @property
    def pid(self) -> Path:
        return self.dir / "daemon.pid"

    @property
    def status(self) -> Path:
        return self.dir / "daemon.json"

    @property
    def log(self) -> Path:
        return self.dir / "daemon.log"


def read_status(files: DaemonFiles) -> dict[str, Any] | None:
    """The last status the daemon wrote, or None if there is none (or it is unreadable)."""
    try:
        data = json.loads(files.status.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _lock_holder(path: Path) -> int | None:
    """The pid holding a flock on `path`, from /proc/locks (Linux), or None if unknown."""
    try:
        st = path.stat()
        with open("/proc/locks") as f:
            lines = f.readlines()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 00:2e:1311 0 EOF"; waiters have "->" in field 2.
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == inode:
            with contextlib.suppress(ValueError):
                pid = int(parts[4])
                return pid if pid > 0 else None
    return None


class DaemonLock:
    """`.codeveil/daemon.lock`, held with an exclusive flock for the daemon's lifetime.

    The lock, not the pid file, says whether a daemon runs: the kernel releases it when
    the process dies however it dies, so a kill -9 never leaves a repo locked. The file
    itself is never deleted (deleting a lock file lets two processes lock two inodes).
    """

    def __init__(self, fd: int, files: DaemonFiles) -> None:
        self._fd = fd
        self.files = files

    @classmethod
    def acquire(cls, files: DaemonFiles, *, wait: float = LOCK_WAIT_SECONDS) -> DaemonLock:
        """Take the lock, or raise AlreadyRunningError naming the daemon that holds it."""
        files.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return cls(fd, files)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise AlreadyRunningError(files.root, _holder_pid(files)) from None
                time.sleep(0.05)
            except BaseException:
                os.close(fd)
                raise

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


def _holder_pid(files: DaemonFiles) -> int | None:
    """Who holds the lock: /proc/locks if it knows, else the pid file if that pid lives."""
    holder = _lock_holder(files.lock)
    if holder is not None:
        return holder
    pid = _read_pid(files.pid)
    return pid if pid is not None and _pid_alive(pid) else None


@dataclass
class DaemonState:
    """What `probe` found: is a daemon running for the repo, and its last status."""

    root: Path
    running: bool
    pid: int | None
    status: dict[str, Any] | None
    # The pid of a daemon that died without cleaning up (kill -9, power loss); its
    # pid file has just been cleared.
    stale_pid: int | None = None


def probe(root: Path) -> DaemonState:
    """Whether a daemon runs for `root`: it does iff someone holds the lock.

    Taking the lock for a moment is the test. If we get it, no daemon runs, and while we
    hold it no daemon can start, so a pid file left behind by a dead one is removed here
    without racing a daemon that is starting.
    """
    files = DaemonFiles.for_root(root)
    status = read_status(files)
    try:
        fd = os.open(files.lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return DaemonState(files.root, False, None, status)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return DaemonState(files.root, True, _holder_pid(files), status)
        try:
            stale = _read_pid(files.pid)
            if stale is not None:
                files.pid.unlink(missing_ok=True)
                if status is not None and status.get("state") not in ("stopped", "died"):
                    status = {**status, "state": "died"}
                    with contextlib.suppress(OSError):
                        write_atomic(files.status, json.dumps(status, indent=2) + "\n",
                                     durable=False)
            return DaemonState(files.root, False, None, status, stale_pid=stale)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# -- starting and stopping from another process -----------------------------------------


def spawn(root: Path, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          timeout: float = 30.0) -> int:
    """Run `argv` (a command that runs the daemon for `root` in the foreground) detached.

    The child gets its own session (no controlling terminal, no SIGHUP when the shell
    exits), stdin from /dev/null and stdout/stderr appended to the daemon log, and runs
    in `/` so that it pins no directory. Returns the daemon's pid once it holds the lock
    and has written its status; raises AlreadyRunningError or DaemonError otherwise.
    """
    files = DaemonFiles.for_root(root)
    state = probe(files.root)
    if state.running:
        raise AlreadyRunningError(files.root, state.pid)
    files.dir.mkdir(parents=True, exist_ok=True)
    with open(files.log, "ab") as out:
        child = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/",
            env=dict(env) if env is not None else None, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            state = probe(files.root)
            if state.running:  # lost a race with another start
                raise AlreadyRunningError(files.root, state.pid)
            raise DaemonError(
                f"the daemon exited at start-up with status {code}; the end of"
                f" {files.log}:\n{_tail(files.log)}"
            )
        status = read_status(files)
        if status and status.get("pid") == child.pid and probe(files.root).running:
            return child.pid
        time.sleep(0.05)
    raise DaemonError(
        f"the daemon (pid {child.pid}) did not report within {timeout:.0f} s; see {files.log}"
    )


def _tail(path: Path, lines: int = 10) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def stop(root: Path, *, timeout: float = 30.0) -> int | None:
    """SIGTERM the daemon of `root` and wait until it exits.

    Returns its pid, or None if none was running. Raises DaemonError if it is still
    running after `timeout` seconds (a sync that cannot be interrupted, e.g. inside the
    model); kill -9 is then safe, the next sync resumes where it stopped.
    """
    state = probe(root)
    if not state.running:
        return None
    pid = state.pid
    if pid is None:
        raise DaemonError(
            f"a daemon holds {DaemonFiles.for_root(root).lock} but its pid is unknown"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid  # it exited between the probe and the signal
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not probe(root).running:
            return pid
        time.sleep(0.05)
    raise DaemonError(
        f"the daemon (pid {pid}) is still running {timeout:.0f} s after SIGTERM;"
        f" `kill -9 {pid}` is safe: the next sync resumes the one in flight"
    )


# -- logging --------------------------------------------------------------------------


class _LogHandler(logging.handlers.RotatingFileHandler):
    """A rotating log that, when detached, also receives the process's stdout/stderr.

    Output written straight to file descriptors 1 and 2 (a native library's warning, a
    traceback of a crash) would otherwise keep going to the rotated-away file.
    """

    def __init__(self, path: Path, *, capture_std: bool) -> None:
        super().__init__(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS,
                         encoding="utf-8")
        self.capture_std = capture_std
        self._redirect()

    def doRollover(self) -> None:
        super().doRollover()
        self._redirect()

    def _redirect(self) -> None:
        if self.capture_std and self.stream is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self.stream.fileno(), 1)
            os.dup2(self.stream.fileno(), 2)


def setup_logging(files: DaemonFiles, *, to_stderr: bool, capture_std: bool,
                  level: int = logging.INFO) -> None:
    """Send the process's logs to `.codeveil/daemon.log` (and stderr when in the foreground).

    `capture_std` points file descriptors 1 and 2 at the log too (for a detached daemon).
    """
    files.dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [_LogHandler(files.log, capture_std=capture_std)]
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    root_logger = logging.getLogger()
    for handler in handlers:
        handler.setFormatter(fmt)
        root_logger.addHandler(handler)
    root_logger.setLevel(level)
    # One line per HTTP request would bury the daemon's own story (a periodic sync is
    # three requests); failures still surface as the sync's error.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)
    if capture_std:
        # A crash in native code (faiss, LanceDB, the model) then leaves its Python
        # traceback in the log instead of nothing.
        faulthandler.enable()


# -- which events matter ----------------------------------------------------------------

_MARKERS = (GITIGNORE, CODEVEILIGNORE, VENV_MARKER)
_MISSING = object()


class EventFilter:
    """Decides from a changed path alone whether it can matter to the index.

    The same rules as the walk (indexer.ignore): always-skipped folders, .gitignore and
    .codeveilignore at every level, default-ignored folders, virtualenvs, and file names
    the walk skips (lock files, binaries). A cheap pre-filter, not the truth: the sync
    re-walks with the full rules, so a path wrongly let through costs one no-op sync.
    Rules are cached per directory and dropped when an ignore file changes.
    """

    MAX_CACHED_DIRS = 100_000

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._dirs: dict[str, Any] = {}  # "dir/" -> IgnoreRules, or None if not walked

    def relevant(self, path: str) -> bool:
        rel = os.path.relpath(path, self.root)
        if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
            return False
        parts = rel.split(os.sep)
        if any(p in ALWAYS_SKIPPED for p in parts):
            return False
        name = parts[-1]
        if name in _MARKERS:
            self._dirs.clear()  # the rules themselves changed
            return True
        rules = self.rules_for(parts[:-1])
        if rules is None:
            return False
        rel_posix = "/".join(parts)
        try:
            st_is_dir = os.path.isdir(path) and not os.path.islink(path)
            exists = st_is_dir or os.path.lexists(path)
        except OSError:
            return True
        if st_is_dir:
            return self.rules_for(parts) is not None
        file_kept = not rules.skips_file(rel_posix, name) and name_skip_reason(name) is None
        if exists:
            return file_kept
        # Gone: it may have been a file or a folder; either kind not ignored matters.
        return file_kept or not rules.skips_dir(rel_posix, name)[0]

    def watched_dir(self, name: str) -> bool:
        """Whether the walk enters the top-level directory `name`."""
        return name not in ALWAYS_SKIPPED and self.rules_for([name]) is not None

    def rules_for(self, dir_parts: Sequence[str]) -> IgnoreRules | None:
        """The rules in force inside a directory, or None if the walk never enters it."""
        if len(self._dirs) > self.MAX_CACHED_DIRS:
            self._dirs.clear()
        rules = self._dirs.get("")
        if rules is None:
            rules = IgnoreRules.for_root(self.root).enter(
                self.root, "", _marker_names(self.root)
            )
            self._dirs[""] = rules
        prefix = ""
        for name in dir_parts:
            key = f"{prefix}{name}/"
            found = self._dirs.get(key, _MISSING)
            if found is _MISSING:
                found = _enter(self.root, rules, prefix, name)
                self._dirs[key] = found
            if found is None:
                return None
            rules, prefix = found, key
        return rules


def _marker_names(abs_dir: str) -> set[str]:
    return {n for n in _MARKERS if os.path.lexists(os.path.join(abs_dir, n))}


def _enter(root: str, rules: IgnoreRules, prefix: str, name: str) -> IgnoreRules | None:
    """The walk's decision for one directory: its rules, or None if it is skipped."""
    rel_dir = prefix + name
    skip, kept = rules.skips_dir(rel_dir, name)
    if skip:
        return None
    abs_dir = os.path.join(root, rel_dir)
    names = _marker_names(abs_dir)
    if VENV_MARKER in names and not kept:
        return None
    return rules.enter(abs_dir, rel_dir + "/", names)


# -- the watcher ----------------------------------------------------------------------

Sink = Callable[[float, "set[tuple[int, str]] | BaseException"], None]


class _Watch:
    """One watchfiles `RustNotify` and the thread that waits on it.

    The thread hands every batch of raw changes (or the error that stopped it) to `sink`
    with its arrival time; all decisions are taken in the daemon's main thread.
    """

    def __init__(self, paths: list[str], *, recursive: bool, sink: Sink) -> None:
        from watchfiles._rust_notify import RustNotify

        self.paths = paths
        self._sink = sink
        self._stop = threading.Event()
        # (paths, debug, force_polling, poll_delay_ms, recursive, ignore_permission_denied)
        self._notify = RustNotify(paths, False, False, 300, recursive, True)
        self._thread = threading.Thread(
            target=self._loop, name=f"watch-{'tree' if recursive else 'root'}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                result = self._notify.watch(WATCH_MAX_BATCH_MS, WATCH_STEP_MS, 0, self._stop)
                if isinstance(result, set):
                    self._sink(time.monotonic(), result)
                elif result == "stop":
                    return
        except Exception as exc:  # the Rust side failed: report it, the daemon re-arms
            self._sink(time.monotonic(), exc)
        finally:
            self._notify.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * WATCH_STEP_MS / 1000 + 1)


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
    """Watches one repo and runs `sync_once` whenever its indexable files change.

    `sync_once` does one whole sync and returns its report as a dict (it is stored in
    the status file as `last_result`); any exception it raises counts as a failed sync
    and is retried with backoff. Exceptions of the `unreachable` kinds (anywhere in the
    cause chain) mean "the server could not be reached" and show as
    `server_reachable: false` in the status.
    """

    def __init__(
        self,
        root: Path,
        sync_once: SyncOnce,
        *,
        full_interval: float = DEFAULT_FULL_INTERVAL,
        debounce: float = DEFAULT_DEBOUNCE,
        max_wait: float = DEFAULT_MAX_WAIT,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        stop_grace: float = DEFAULT_STOP_GRACE,
        unreachable: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError),
        status_extra: Mapping[str, Any] | None = None,
        watch: bool = True,
    ) -> None:
        self.files = DaemonFiles.for_root(root)
        self.root = self.files.root
        self._sync_once = sync_once
        self.full_interval = full_interval
        self.debounce = debounce
        self.max_wait = max(max_wait, debounce)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.stop_grace = stop_grace
        self.unreachable = unreachable
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

        self._status: dict[str, Any] = {
            **(status_extra or {}),
            "pid": os.getpid(),
            "root": str(self.root),
            "started": None,
            "state": "starting",
            "full_interval": full_interval,
            "debounce": debounce,
            "syncs": 0,
            "last_sync_started": None,
            "last_sync_finished": None,
            "last_sync_seconds": None,
            "last_sync_ok": None,
            "last_success": None,
            "last_result": None,
            "pending_changes": 0,
            "consecutive_errors": 0,
            "last_error": None,
            "last_error_at": None,
            "next_retry_at": None,
            "server_reachable": None,
            "watching": False,
            "watched_dirs": 0,
            "watch_error": None,
        }

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
            self._status["started"] = time.time()
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
            self._status.update(state="stopped" if code == 0 else "failed",
                                stopped=time.time(), next_retry_at=None)
            with contextlib.suppress(OSError):
                self._write_status()
            with contextlib.suppress(OSError):
                if _read_pid(self.files.pid) == os.getpid():
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
        if self.full_interval <= 0 and self._status["syncs"]:
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
        if force or state != self._status["state"] or pending != self._status["pending_changes"]:
            self._status.update(state=state, pending_changes=pending)
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

    def _arm_watch(self, roots: list[str] | None = None) -> None:
        """(Re)start the watchers. A new tree watcher starts before the old one stops, so
        no event falls between them."""
        self._watch_retry_at = None
        if not self._watch_enabled:
            return
        old_tree = self._tree_watch
        try:
            if self._root_watch is None:
                self._root_watch = _Watch([str(self.root)], recursive=False, sink=self._sink)
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
        self._status.update(watching=True, watch_error=None, watched_dirs=len(paths))
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
        self._status.update(watching=False, watch_error=str(exc))
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
            self._status.update(state="syncing", last_sync_started=started, pending_changes=0)
            self._write_status()
            log.debug("sync started (%s)", reason)
            try:
                result = self._sync_once()
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
        self._status["syncs"] += 1
        self._status["last_sync_finished"] = time.time()
        # Wall time of the whole call, opening the store included (the report's
        # `seconds` covers the sync proper).
        self._status["last_sync_seconds"] = round(time.time() - started, 3)
        self._set_state(force=True)

    def _sync_done(self, result: Mapping[str, Any], started: float, reason: str) -> None:
        if self._failures:
            log.info("sync succeeded again after %d failed attempts", self._failures)
        self._failures = 0
        self._status.update(
            last_sync_ok=True, last_success=time.time(), last_result=_summary(result),
            consecutive_errors=0, next_retry_at=None, server_reachable=True,
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
        self._status.update(
            last_sync_ok=False, consecutive_errors=self._failures,
            last_error=message, last_error_at=time.time(),
            next_retry_at=time.time() + delay,
        )
        if unreachable:
            self._status["server_reachable"] = False
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
            write_atomic(self.files.status,
                         json.dumps(self._status, indent=2, default=str) + "\n", durable=False)
        except OSError as exc:  # a full disk must not kill the daemon
            log.warning("cannot write %s: %s", self.files.status, exc)
