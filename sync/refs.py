"""Which ref (one tree of a sealed workspace, sync.store.embedded.pool) this checkout syncs: its
name, and the opaque id the store knows it by.

The name is `user@host:branch` for a git checkout (a linked worktree reads its own
HEAD), `user@host` for a folder that is not one, or `CODEVEIL_REF` when set (two
checkouts on one machine that want trees of their own, a bench simulating teammates).
The store sees only HMAC(k_ref, name)[:16]: never a user, host or branch name.
"""

from __future__ import annotations

import getpass
import hmac
import os
import socket
import subprocess
from pathlib import Path

from sync.keys import WorkspaceKey
from sync.records import KEY_BYTES

ENV_REF = "CODEVEIL_REF"
_MAX_HEAD = 4096


def ref_id(key: WorkspaceKey, name: str) -> bytes:
    """The store's id of the ref `name`."""
    return hmac.digest(key.ref_key, b"codeveil/v1 ref " + name.encode("utf-8",
                       "surrogateescape"), "sha256")[:KEY_BYTES]


def ref_name(root: Path) -> str:
    """The name of the ref a checkout at `root` syncs (the module docstring)."""
    chosen = os.environ.get(ENV_REF, "").strip()
    if chosen:
        return chosen
    branch = git_branch(root)
    return who() if branch is None else f"{who()}:{branch}"


def who() -> str:
    """`user@host`: the first part of this machine's ref names."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container): the uid stands in
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return f"{user}@{socket.gethostname() or 'localhost'}"


def local_ref_names(root: Path) -> list[str]:
    """The names this machine would give the refs of the checkout's local branches (so
    `codeveil refs` can name the store's ids it made). Asks git; [] outside git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "for-each-ref", "--format=%(refname:short)",
                              "refs/heads"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    mine = who()
    return [mine, f"{mine}:HEAD", *(f"{mine}:{b}" for b in out.split())]


def git_branch(root: Path) -> str | None:
    """The branch checked out at `root` (`HEAD` when detached), None if it is not a git
    checkout. Read from the files: no git process."""
    dot_git = root / ".git"
    try:
        if dot_git.is_file():  # a linked worktree or a submodule: "gitdir: <path>"
            text = dot_git.read_text("utf-8", "replace")[:_MAX_HEAD].strip()
            if not text.startswith("gitdir:"):
                return None
            git_dir = (root / text.removeprefix("gitdir:").strip()).resolve()
        elif dot_git.is_dir():
            git_dir = dot_git
        else:
            return None
        head = (git_dir / "HEAD").read_text("utf-8", "replace")[:_MAX_HEAD].strip()
    except OSError:
        return None
    if head.startswith("ref:"):
        return head.removeprefix("ref:").strip().removeprefix("refs/heads/")
    return "HEAD"
