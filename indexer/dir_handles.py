"""Open directories of a repository, so that a scan opens each file relative to its
directory's descriptor instead of resolving its path again after the read.

A file read by path could lie outside the repo if a directory on its way was swapped
for a symlink between the walk and the read, so `indexer.walk.read_source` resolves the
path again after reading (`realpath` of its directory, an `lstat` per component) and
compares inodes: two thirds of the cost of reading a small file, 15 of a 169k-file
repo's 19 seconds of scanning. A file opened with `O_NOFOLLOW` from a directory that
was itself opened component by component with `O_NOFOLLOW` from the repo's root needs
no such check: a descriptor names the directory it was opened on, whatever its path
names afterwards, and nothing on the way can be a symlink. Where a component or the
file is a symlink (an inside link the walk allowed), `open_beneath` says so and the
caller takes the path, and its check, as before.

One `DirHandles` per reading thread: it keeps the `limit` directories used last open
(a scan reads in path order, the chunker in any order) and closes them on `close()`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import OrderedDict
from typing import Final

#: Whether this platform opens files relative to a directory descriptor without following
#: links (POSIX); elsewhere `handles_for` gives none and files are read by path.
SUPPORTED: Final = (hasattr(os, "O_DIRECTORY") and hasattr(os, "O_NOFOLLOW")
                    and os.open in os.supports_dir_fd)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS: Final = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0))
# Errors that mean "a symlink (or not a directory) here": the path-based read decides.
_LINKED: Final = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})


class DirHandles:
    """Descriptors of the repository `root`'s directories, opened beneath it."""

    def __init__(self, root: str | os.PathLike[str], limit: int = 256) -> None:
        self.limit = limit
        self._root = os.open(os.path.realpath(root), _DIR_FLAGS)
        self._dirs: OrderedDict[str, int] = OrderedDict()

    def open_beneath(self, path: str, flags: int) -> int | None:
        """A descriptor of the repo-relative file `path` opened with `flags` plus
        `O_NOFOLLOW`, through no symlink; None if a symlink is on the way (or is the
        file). Raises OSError as `os.open` does for anything else."""
        head, _, name = path.rpartition("/")
        parent = self._dir(head)
        return None if parent is None else _open_at(parent, name, flags | _NOFOLLOW)

    def _dir(self, rel: str) -> int | None:
        if not rel:
            return self._root
        fd = self._dirs.get(rel)
        if fd is not None:
            self._dirs.move_to_end(rel)
            return fd
        if len(self._dirs) >= self.limit:
            # The least recently used, closed before this one's chain is opened: a
            # descriptor is only needed while its children are being opened.
            os.close(self._dirs.popitem(last=False)[1])
        head, _, name = rel.rpartition("/")
        parent = self._dir(head)
        fd = None if parent is None else _open_at(parent, name, _DIR_FLAGS)
        if fd is not None:
            self._dirs[rel] = fd
        return fd

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    def __enter__(self) -> DirHandles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_at(parent: int, name: str, flags: int) -> int | None:
    """`os.open(name, flags, dir_fd=parent)`, or None where a symlink (or a file that is
    not a directory) stands in the way; any other OSError is raised."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _LINKED:
            return None
        raise


def handles_for(root: str | os.PathLike[str],
                ) -> contextlib.AbstractContextManager[DirHandles | None]:
    """`DirHandles(root)` where the platform supports them, else a context of None."""
    return DirHandles(root) if SUPPORTED else contextlib.nullcontext()
