"""One daemon per repo, seen from outside it: its files, its lock, whether it runs,
starting it in the background and stopping it (sync.daemon has the whole picture)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from indexer.private_files import write_atomic
from sync.checkout.config import codeveil_dir
from sync.daemon.status import DaemonStatus
from sync.errors import SyncError

log = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = 2.0  # `status` probes hold the lock for microseconds; ride them out

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


def read_status(files: DaemonFiles) -> DaemonStatus | None:
    """The last status the daemon wrote, or None if there is none (or it is unreadable)."""
    try:
        data = json.loads(files.status.read_text())
    except (OSError, ValueError):
        return None
    try:
        return DaemonStatus.from_dict(data) if isinstance(data, dict) and data else None
    except TypeError:  # not a status a daemon wrote
        return None


def read_pid(path: Path) -> int | None:
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
    pid = read_pid(files.pid)
    return pid if pid is not None and _pid_alive(pid) else None


@dataclass
class DaemonState:
    """What `probe` found: is a daemon running for the repo, and its last status."""

    root: Path
    running: bool
    pid: int | None
    status: DaemonStatus | None
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
            stale = read_pid(files.pid)
            if stale is not None:
                files.pid.unlink(missing_ok=True)
                if status is not None and status.state not in ("stopped", "died"):
                    status = replace(status, state="died")
                    with contextlib.suppress(OSError):
                        write_atomic(files.status, json.dumps(status.to_dict(), indent=2) + "\n",
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
    in `/` so that it pins no directory. Its environment is `env`, by default ours as
    `child_env` extends it. Returns the daemon's pid once it holds the lock and has
    written its status; raises AlreadyRunningError or DaemonError otherwise.
    """
    files = DaemonFiles.for_root(root)
    state = probe(files.root)
    if state.running:
        raise AlreadyRunningError(files.root, state.pid)
    files.dir.mkdir(parents=True, exist_ok=True)
    with open(files.log, "ab") as out:
        child = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/",
            env=dict(env) if env is not None else child_env(), start_new_session=True,
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
        if status and status.pid == child.pid and probe(files.root).running:
            return child.pid
        time.sleep(0.05)
    raise DaemonError(
        f"the daemon (pid {child.pid}) did not report within {timeout:.0f} s; see {files.log}"
    )


def child_env() -> dict[str, str]:
    """Our environment, plus the folder this codeveil was imported from when it is not an
    installed package: the detached daemon runs from `/`, and must run this same code."""
    import sysconfig

    env = dict(os.environ)
    source = str(Path(__file__).resolve().parents[2])
    installed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    if source not in installed:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    return env


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

