"""Which files of a tree were touched since the last look, from Linux inotify.

grep stays exact between syncs by comparing every indexed file's stat with the stat
cache's; on a large tree those stats are most of a selective grep's time. A process that
greps more than once (the MCP server, the Python API) can instead watch the directories
that hold the indexed files: the kernel queues an event for a change before the call that
made it returns, so draining the queue at the start of a grep names every file changed
since the previous drain, and only those need a stat again.

What the events cannot vouch for is left to a stat: a watch that could not be added, a
queue that overflowed, and any change to a directory itself (created, removed, renamed,
replaced), after which the caller forgets what it knew and stats everything (`drain`
answers None). Files the caller knows are symlinks or have other hard links are stat'ed
on every call (their content can change through a path no watch sees).

Only on Linux (`available()`); elsewhere callers stat every file, as without a watch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys
from typing import Final

__all__ = ["TreeWatch", "available"]

_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
_IN_MODIFY: Final = 0x2
_IN_ATTRIB: Final = 0x4
_IN_CLOSE_WRITE: Final = 0x8
_IN_MOVED_FROM: Final = 0x40
_IN_MOVED_TO: Final = 0x80
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_UNMOUNT: Final = 0x2000
_IN_Q_OVERFLOW: Final = 0x4000
_IN_IGNORED: Final = 0x8000
_IN_ONLYDIR: Final = 0x01000000
_IN_ISDIR: Final = 0x40000000

_MASK: Final = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
                | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR)
# Events after which the paths the watches stand for may no longer be the directories
# they were added on: the caller starts again from a full stat.
_STRUCTURAL: Final = (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_Q_OVERFLOW
                      | _IN_IGNORED | _IN_ISDIR)
_HEADER: Final = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)

_libc: ctypes.CDLL | None = None


def available() -> bool:
    """Whether this system has inotify (Linux with a C library ctypes can load)."""
    return _load() is not None


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            _libc = libc
        except (OSError, AttributeError):
            return None
    return _libc


class TreeWatch:
    """inotify watches on directories of the tree at `root` (repo-relative, "/"-joined;
    "" is the root itself), and the file paths touched since the last `drain`."""

    def __init__(self, root: str) -> None:
        libc = _load()
        if libc is None:
            raise OSError("inotify is not available on this system")
        self._libc = libc
        self._root = os.fsencode(root)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._fd: int | None = fd
        self._dirs: dict[int, str] = {}  # watch descriptor -> repo-relative directory
        self._watched: set[str] = set()
        self._broken = False

    def watch(self, rel_dir: str) -> bool:
        """Watch `rel_dir` and every directory above it (a rename of any of them shows in
        its parent's watch); False if a watch could not be added."""
        if rel_dir in self._watched:
            return True
        parts = rel_dir.split("/") if rel_dir else []
        for depth in range(len(parts) + 1):
            here = "/".join(parts[:depth])
            if here in self._watched:
                continue
            full = os.path.join(self._root, os.fsencode(here)) if here else self._root
            wd = self._libc.inotify_add_watch(self._fd, full, _MASK)
            if wd < 0:
                return False
            self._dirs[wd] = here
            self._watched.add(here)
        return True

    def drain(self) -> set[str] | None:
        """The paths (repo-relative) of the entries of watched directories that events
        named since the last drain; None if that cannot be trusted (the queue overflowed,
        or a directory was created, removed or renamed), and from then on."""
        if self._broken or self._fd is None:
            return None
        touched: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return touched
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset:offset + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                offset += size
                if mask & _STRUCTURAL:
                    self._broken = True
                    return None
                folder = self._dirs.get(wd)
                if folder is None or not name:
                    continue
                rel = f"{folder}/{name}" if folder else name
                if rel in self._watched:  # a symlink standing for a watched directory
                    self._broken = True
                    return None
                touched.add(rel)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
