"""Which file events matter (the indexer's ignore rules, applied to event paths) and
the watcher thread that collects them (watchfiles)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from indexer.assets import flags_for, is_vendored_dir
from indexer.ignore import ALWAYS_SKIPPED, CODEVEILIGNORE, GITIGNORE, VENV_MARKER, IgnoreRules
from indexer.walk import default_skip_reason

log = logging.getLogger(__name__)

# watchfiles' Rust loop has no blocking wait: it sleeps one step at a time, then checks
# for a stop request and whether a burst of events has ended, and hands a batch over
# at least every two steps while events keep coming. The main loop waits for
# `debounce` seconds without a batch, so two steps must stay well below the debounce
# for a long burst not to look like a quiet tree. 100 ms keeps two idle watchers under
# 0.1% of a core.
WATCH_STEP_MS = 100
WATCH_MAX_BATCH_MS = WATCH_STEP_MS


# -- which events matter ----------------------------------------------------------------

# The one path under .git/ that matters: which branch is checked out names the ref a
# sync goes to (sync.checkout.refs), and `git checkout -b` changes it without changing a file.
GIT_HEAD = os.path.join(".git", "HEAD")

_MARKERS = (GITIGNORE, CODEVEILIGNORE, VENV_MARKER)
_MISSING = object()


class EventFilter:
    """Decides from a changed path alone whether it can matter to the index.

    The same rules as the walk (indexer.ignore): always-skipped folders, .gitignore and
    .codeveilignore at every level, default-ignored folders, virtualenvs, vendored
    folders, and the files the walk skips by name and place (lock files, binaries,
    assets), unless a .codeveilignore negation brings them back. A cheap pre-filter,
    not the truth: the sync re-walks with the full rules (sizes too), so a path wrongly
    let through costs one no-op sync. Rules are cached per directory and dropped when an
    ignore file changes.
    """

    MAX_CACHED_DIRS = 100_000

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._dirs: dict[str, Any] = {}  # "dir/" -> IgnoreRules, or None if not walked

    def relevant(self, path: str) -> bool:
        rel = os.path.relpath(path, self.root)
        if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
            return False
        if rel == GIT_HEAD:
            return True  # a checkout of another branch: its sync goes to that ref's tree
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
        file_kept = not rules.skips_file(rel_posix, name) and (
            default_skip_reason(rel_posix, name, flags_for(parts[:-1]), rules) is None)
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
    if skip or (is_vendored_dir(name) and not rules.keeps(rel_dir, is_dir=True)):
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

