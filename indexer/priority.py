"""The order a first index embeds files in: the most useful first.

While a first index runs, every chunk is searchable by name and words at once, and by
meaning once its vector is in: so the files a search most likely wants get their vectors
first. Source code before tests, tests before docs and config (a question about code is
answered by code); within each, files touched by recent commits first (they are the ones
being worked on); within those, in a random order: the order rows reach a server in (its
row numbers) must not follow the sorted paths, which a public tree listing would reveal.
"""

from __future__ import annotations

import logging
import random
import subprocess
from collections.abc import Iterable
from pathlib import Path

from indexer.kinds import FileKind, file_kind

log = logging.getLogger(__name__)

SOURCE, TESTS, OTHER = 0, 1, 2
#: Commits read for recency: enough to cover what is being worked on, and quick.
GIT_COMMITS = 1000
GIT_TIMEOUT_S = 3.0

_CATEGORIES = {FileKind.CODE: SOURCE, FileKind.TESTS: TESTS}


def category(path: str) -> int:
    """SOURCE, TESTS or OTHER (docs, examples, config) for a repo-relative path: its
    file kind (`indexer.kinds`), the one every hit carries."""
    return _CATEGORIES.get(file_kind(path), OTHER)


def git_recency(root: Path) -> dict[str, int]:
    """path -> the commit time of the last of the recent commits that touched it, for
    the files under `root` of the git repository around it; empty if there is none."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "log", f"-n{GIT_COMMITS}", "--relative", "--no-renames",
             "--name-only", "--format=%x00%ct"],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("no git recency for %s: %s", root, exc)
        return {}
    if proc.returncode != 0:
        return {}
    return parse_recency(proc.stdout)


def parse_recency(log_output: str) -> dict[str, int]:
    """path -> latest commit time, from `git log --name-only --format=%x00%ct`."""
    seen: dict[str, int] = {}
    when = 0
    for line in log_output.splitlines():
        if line.startswith("\0"):
            when = int(line[1:] or 0)
        elif line:
            seen.setdefault(line, when)  # newest first: the first time is the latest
    return seen


def embed_order(paths: Iterable[str], root: Path | None = None) -> list[str]:
    """`paths` in the order their vectors are most wanted (see the module docstring)."""
    paths = list(paths)
    if len(paths) < 2:  # nothing to order: no git process for a one-file update
        return paths
    recency = git_recency(root) if root is not None else {}
    random.SystemRandom().shuffle(paths)  # sorted() is stable: ties keep this order
    return sorted(paths, key=lambda p: (category(p), -recency.get(p, 0)))


__all__ = ["OTHER", "SOURCE", "TESTS", "category", "embed_order", "git_recency", "parse_recency"]
