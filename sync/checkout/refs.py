"""Which ref (one tree of a sealed workspace, sync.store.embedded.pool) this checkout syncs: its
name, and the opaque id the store knows it by.

A ref names one checkout: `user@host/ID:branch` for a git checkout (a linked worktree
reads its own HEAD), `user@host/ID` for a folder that is not one, where ID is the
checkout's own random id (sync.checkout.checkout_id), so two clones, worktrees or containers of
one user and host never share a ref; user, host and branch are there to be read in
`codeveil refs`. `CODEVEIL_REF`, when set, is the name (checkouts that mean to share a
tree, a bench simulating teammates). Before checkout ids a ref was `user@host[:branch]`
(`legacy_ref_name`): a checkout that synced one syncs its own from then on; the first
such sync links the pages it knows rather than sending their rows again, and the old
ref, which another clone may still sync, is left to the store's GC of unused refs.
The store sees only HMAC(k_ref, name)[:16]: never a user, host, id or branch name.
"""

from __future__ import annotations

import getpass
import hmac
import os
import socket
import subprocess
from pathlib import Path

from sync.checkout.checkout_id import checkout_id
from sync.crypto.keys import WorkspaceKey
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
    return _on_branch(f"{who()}/{checkout_id(root)}", git_branch(root))


def legacy_ref_name(root: Path) -> str:
    """The name this checkout's ref had before checkout ids: `user@host[:branch]`."""
    return _on_branch(who(), git_branch(root))


def _on_branch(name: str, branch: str | None) -> str:
    return name if branch is None else f"{name}:{branch}"


def who() -> str:
    """`user@host`: the first part of this machine's ref names."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container): the uid stands in
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return f"{user}@{socket.gethostname() or 'localhost'}"


def local_ref_names(root: Path, *, legacy: bool = False) -> list[str]:
    """The names this checkout would give the refs of its local branches (so `codeveil
    refs` can name the store's ids it made); with `legacy`, the names it gave them
    before checkout ids. Asks git; [] outside git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "for-each-ref", "--format=%(refname:short)",
                              "refs/heads"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    mine = who() if legacy else f"{who()}/{checkout_id(root)}"
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
