"""The vector builder of one index, seen from outside it: its files, its lock, whether it
runs, starting it, stopping it, and its progress.

`codeveil index` returns once the words, names and structure are indexed (a local pass
of the sync, seconds); the model's work (embedding, and sending the sealed rows to the
store as batches complete) runs in a detached, low-priority process that outlives the
command: `python -m retrieval.indexes.vector_builder ROOT`, which runs the one sync there is
(`sync.workspace.workspace.Workspace.sync`). The CLI, the MCP server and the daemon start it. It
copies the pattern of the approximate index's builder (`retrieval.indexes.local_vectors.
approx_build`): a claim, nice, a marker of repeated failure, a note in `doctor`.

Files in `.codeveil/`:

    builder.lock    flock'ed by the running builder for its whole life: one per index;
                    the kernel lets go when it dies, kill -9 included
    builder.start   flock'ed while a process decides whether to start a builder, and
                    by the builder while it decides to exit, so that a request for
                    another pass is never lost between the two
    builder.again   another pass is wanted: an `index` ran while the builder did
    builder.json    its state and progress (`BuilderState`), written atomically
    builder.failed  why it was given up: it died MAX_ATTEMPTS times in a row; no builder
                    starts until a foreground `codeveil index --wait` succeeds
    builder.log     its log (builder.log.1 the one before, past 1 MiB)

A second `index` while a builder runs leaves it running and asks it for another pass
(`builder.again`): the sync it runs resumes from the store's tree, so stopping it would
only throw work away. A builder killed mid-way leaves its state "running" with its lock
free; the next start resumes where the cache and the store stop (the sync's own
invariant) and counts the attempt.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Final

from indexer.private_files import write_atomic
from sync.checkout.config import codeveil_dir
from sync.syncer.progress import Progress

log = logging.getLogger(__name__)

#: Runs in a row that may end without finishing before the builder is given up.
MAX_ATTEMPTS: Final = 3
#: The process that builds (the retrieval layer's: it also keeps the search side built).
BUILDER_MODULE: Final = "retrieval.indexes.vector_builder"
#: Seconds between two writes of the progress file.
PROGRESS_EVERY_S: Final = 1.0
#: A log past this size is moved aside (to builder.log.1) when the next builder starts.
LOG_BYTES: Final = 1 << 20
#: States after which a start is not a retry.
CLEAN_STATES: Final = frozenset({"done", "stopped", "offline"})
#: The model's threads in the builder (CODEVEIL_EMBED_THREADS, unless the user set it).
#: It works in the background, so its peak memory and CPU matter more than its wall
#: time: on one thread instead of two, django's package peaked at 480 MB against 667 in
#: 7% less CPU (docs/architecture.md, Embed). A foreground `index --wait` keeps a
#: thread per core.
EMBED_THREADS: Final = 1


def chunks_waiting(root: Path) -> int:
    """Chunks of the index at `root` that have no vectors on this machine yet (or are not
    stored): what a builder has to do."""
    # Imported here: `status` and `doctor` read this module without touching the chunks.
    from indexer.local_chunks import LocalChunks, open_state_db
    from sync.checkout.config import state_path

    db = open_state_db(state_path(root))
    try:
        total, ready = LocalChunks(db).coverage()
    finally:
        db.close()
    return total - ready


@dataclass
class BuilderState:
    """What `builder.json` holds: the builder's state and progress."""

    state: str = "starting"  # starting, running, done, offline, stopped, failed
    pid: int = 0
    attempts: int = 0  # runs in a row that did not finish, this one included
    started: float = 0.0  # unix time
    updated: float = 0.0
    files_total: int = 0
    files_done: int = 0
    chunks_todo: int = 0  # chunks waiting for vectors when the run started
    chunks_done: int = 0  # chunks given vectors since (embedded, cached or pulled)
    chunks_per_s: float = 0.0
    error: str = ""
    offline: str = ""  # why the store was not reached, when it was not

    @property
    def seconds_left(self) -> float | None:
        if self.state != "running" or self.chunks_per_s <= 0:
            return None
        return max(self.chunks_todo - self.chunks_done, 0) / self.chunks_per_s

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        left = self.seconds_left
        out["seconds_left"] = None if left is None else round(left, 1)
        out["chunks_per_s"] = round(self.chunks_per_s, 2)
        return out


@dataclass(frozen=True)
class BuilderFiles:
    """Where one index's builder keeps its files."""

    root: Path

    @property
    def dir(self) -> Path:
        return codeveil_dir(self.root)

    @property
    def lock(self) -> Path:
        return self.dir / "builder.lock"

    @property
    def start_lock(self) -> Path:
        return self.dir / "builder.start"

    @property
    def again(self) -> Path:
        return self.dir / "builder.again"

    @property
    def state(self) -> Path:
        return self.dir / "builder.json"

    @property
    def failed(self) -> Path:
        return self.dir / "builder.failed"

    @property
    def log(self) -> Path:
        return self.dir / "builder.log"


@dataclass
class Builder:
    """The builder of the index at `root`."""

    root: Path
    files: BuilderFiles = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.files = BuilderFiles(self.root)

    # -- reading --------------------------------------------------------------------

    def state(self) -> BuilderState | None:
        """Its last state; None when no builder ever ran here (or the file is garbled)."""
        try:
            raw = json.loads(self.files.state.read_text())
        except (OSError, ValueError):
            return None
        names = {f.name for f in fields(BuilderState)}
        try:
            return BuilderState(**{k: v for k, v in raw.items() if k in names})
        except TypeError:
            return None

    def running(self) -> bool:
        """Whether a builder holds this index now (or is being started)."""
        if _locked(self.files.lock):
            return True
        st = self.state()
        # Started, but not yet holding the lock: its pid says whether it still may.
        return (st is not None and st.state == "starting" and st.pid > 0
                and _alive(st.pid) and time.time() - st.updated < 30)

    def given_up(self) -> str | None:
        """Why the builder was given up, or None."""
        try:
            return self.files.failed.read_text().strip() or "it failed"
        except OSError:
            return None

    # -- starting and stopping ------------------------------------------------------

    def start(self) -> int | None:
        """Start the builder unless one runs (then it is asked for another pass) or it
        was given up. Returns the pid of the builder that runs now, or None."""
        with _flocked(self.files.start_lock):
            if self.running():
                self.files.again.touch()
                st = self.state()
                return st.pid if st is not None and st.pid else None
            if self.given_up() is not None:
                return None
            prev = self.state()
            attempts = 1
            if prev is not None and prev.state not in CLEAN_STATES:
                attempts = prev.attempts + 1  # the last run died or failed
            if attempts > MAX_ATTEMPTS:
                why = (f"the vector builder stopped before finishing {prev.attempts if prev else 0}"
                       f" times in a row (last: {prev.error if prev and prev.error else 'killed'})")
                write_atomic(self.files.failed, why + "\n", durable=False)
                if prev is not None:  # cleared by a repair, the marker gives 3 more tries
                    prev.state, prev.attempts, prev.error = "failed", 0, why
                    self.write(prev)
                log.warning("%s; see %s", why, self.files.log)
                return None
            self.files.again.unlink(missing_ok=True)
            return self._spawn(attempts)

    def _spawn(self, attempts: int) -> int | None:
        package_root = str(Path(__file__).resolve().parents[1])  # for -m, as installed
        env = _builder_env(os.environ, package_root)
        with contextlib.suppress(OSError):  # one older log kept, so it never grows unbounded
            if self.files.log.stat().st_size > LOG_BYTES:
                self.files.log.replace(self.files.log.with_name("builder.log.1"))
        try:
            with open(self.files.log, "ab") as logf:
                # Its own session: a Ctrl-C or the exit of whoever started it does not
                # stop it.
                proc = subprocess.Popen(
                    [sys.executable, "-m", BUILDER_MODULE, str(self.root)],
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, env=env,
                    start_new_session=True, close_fds=True)
        except OSError as exc:
            log.warning("could not start the vector builder for %s: %s", self.root, exc)
            return None
        now = time.time()
        self.write(BuilderState(state="starting", pid=proc.pid, attempts=attempts,
                                started=now, updated=now))
        log.info("building the vectors of %s in process %d", self.root, proc.pid)
        return proc.pid

    def stop(self, timeout: float = 15.0) -> bool:
        """Ask a running builder to stop (SIGTERM) and wait for it to let go of the
        index; whether none runs afterwards. The write order makes a stop at any
        point safe, and the next run resumes from there."""
        st = self.state()
        if not self.running():
            return True
        if st is not None and st.pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(st.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                return True
            time.sleep(0.1)
        return False

    def clear_failure(self) -> None:
        """A foreground index finished: a builder may start again."""
        self.files.failed.unlink(missing_ok=True)
        st = self.state()
        if st is not None and st.state not in CLEAN_STATES and not self.running():
            st.state, st.attempts = "done", 0
            self.write(st)

    # -- held by the one that builds ------------------------------------------------

    def begin(self, pid: int) -> BuilderState:
        """The builder's first state, "running", written under the start lock: the
        process that started it has written its own ("starting", with the attempt
        count) by then, so the count is never lost to a race between the two."""
        with _flocked(self.files.start_lock):
            prev = self.state()
            st = BuilderState(state="running", pid=pid,
                              attempts=prev.attempts if prev is not None else 1,
                              started=time.time())
            self.write(st)
            return st

    @contextlib.contextmanager
    def hold(self, *, wait: float = 0.0) -> Iterator[bool]:
        """The index's builder lock, for the process that syncs it (the builder, or a
        foreground `index --wait`): yields whether it was got within `wait` seconds."""
        self.files.dir.mkdir(parents=True, exist_ok=True)
        with open(self.files.lock, "a+b") as f:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.1)
            yield True  # closing the file lets go, also when the process dies

    def finish_or_again(self, st: BuilderState) -> bool:
        """At the end of a pass: True if another was asked for (the request is taken),
        else the final state is written, under the start lock so that no request
        slips in between."""
        with _flocked(self.files.start_lock):
            if self.files.again.exists():
                self.files.again.unlink(missing_ok=True)
                return True
            st.updated = time.time()
            self.write(st)
            return False

    def write(self, st: BuilderState) -> None:
        write_atomic(self.files.state, json.dumps(st.to_dict(), indent=1) + "\n",
                     durable=False)


class ProgressFile(Progress):
    """A sync's progress, written to `builder.json` at most every PROGRESS_EVERY_S."""

    def __init__(self, builder: Builder, st: BuilderState) -> None:
        self.builder = builder
        self.st = st
        self._last = 0.0

    def planned(self, files: int, chunks_hint: int) -> None:
        self.st.files_total = files
        self._write(force=True)

    def files_done(self, n: int) -> None:
        self.st.files_done += n
        self._write()

    def chunks_done(self, embedded: int, cached: int) -> None:
        self.st.chunks_done += embedded + cached
        self._write()

    def stages(self, seconds: dict[str, float], embed_chunks_per_s: float) -> None:
        self.st.chunks_per_s = embed_chunks_per_s
        self._write()

    def _write(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self.st.updated = time.time()
            with contextlib.suppress(OSError):  # progress is a courtesy; never fail a sync
                self.builder.write(self.st)


def _builder_env(base: Mapping[str, str], package_root: str) -> dict[str, str]:
    """The environment a builder runs in: `base` with this package first on its path and
    the model on EMBED_THREADS threads unless `base` says how many."""
    env = {**base, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, base.get("PYTHONPATH", "")) if p)}
    env.setdefault("CODEVEIL_EMBED_THREADS", str(EMBED_THREADS))
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked(path: Path) -> bool:
    """Whether another process holds an flock on `path`."""
    try:
        f: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


__all__ = ["BUILDER_MODULE", "EMBED_THREADS", "MAX_ATTEMPTS", "Builder", "BuilderState",
           "ProgressFile"]
