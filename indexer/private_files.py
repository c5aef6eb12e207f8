"""Files only their owner may read: the client's state holds code, and its embedding
cache holds vectors from which code can be approximated, so neither is left to the umask.

A folder is made (or tightened to) 0700 and a database file created 0600 before SQLite
opens it (`indexer.sqlite_files.connect(..., private=True)`); SQLite gives its -wal and
-shm files the database file's permissions. Other files are replaced whole by
`write_atomic`, whose temp file is 0600 from the start.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["fsync_dir", "private_dir", "private_file", "write_atomic"]


def private_dir(folder: Path) -> None:
    """Create `folder` (and its parents) if needed and make it 0700."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.name == "posix" and stat.S_IMODE(folder.stat().st_mode) & 0o077:
        folder.chmod(0o700)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new name in `folder` durable."""
    if os.name != "posix":
        return  # Windows cannot open a directory to fsync it; its rename is durable enough.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_file(path: Path) -> None:
    """Create `path` empty if it is absent, and make it 0600 (and its folder 0700).

    An existing file is never opened here: closing any descriptor of a SQLite database
    drops every POSIX lock this process holds on it, including those of its open
    connections, which then write unguarded and corrupt the file. So the file is created
    with O_EXCL (it cannot have been open yet) and an existing one is tightened by name.
    """
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o600)
    except FileExistsError:
        if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(0o600)  # made by an older version under a looser umask
        return
    os.close(fd)


def write_atomic(path: Path, content: bytes | str | Callable[[IO[bytes]], None], *,
                 durable: bool = True) -> None:
    """Replace `path` in one step: a reader sees the old file or the new one, never half.

    `content` is the bytes, the text (UTF-8) or a function that writes to the open file.
    The temp file has a name of its own in the same folder (two writers at once never
    rename each other's) and is 0600 (mkstemp). `durable`: also after a power cut; the
    data is fsynced before the rename and the folder after it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            with contextlib.suppress(OSError):  # not every file system can fsync a folder
                fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
