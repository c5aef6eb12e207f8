"""This checkout's id: what tells it from every other checkout of the same workspace, so
that its ref (sync.checkout.refs) is its own.

A user and host name do not: two clones by one user on one machine, or CI containers
that share a user and host name, would sync one ref and overwrite each other's files.
So the id is random (48 bits), made on the first sync and kept in
`.codeveil/checkout.json` with the folder it was made for: the folder's resolved path,
and its device and inode. A `.codeveil/` that names neither this path nor this folder
was copied from another checkout (`cp -r`, a copied worktree, an image) and gets an id
of its own; a folder that was moved keeps its inode, and so its id. A second worktree
has a `.codeveil/` of its own from its first index.

The file holds nothing secret; the store never sees the id (only HMAC(k_ref, name)).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

from indexer.private_files import write_atomic
from sync.checkout.config import codeveil_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

__all__ = ["checkout_id", "kept_id_problem"]

FILE = "checkout.json"
ID_BYTES = 6


def checkout_id(root: Path) -> str:
    """The id of the checkout at `root` (12 hex digits), made and kept on first use, or
    made again where the kept one belongs to another folder (the module's doc)."""
    here = _identity(root)
    found = _read(root)
    if found is not None and _same_checkout(found, here):
        return str(found["id"])
    folder = codeveil_dir(root)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(folder):
            # Read again under the lock: a daemon and an index starting together make
            # one id, never two refs.
            found = _read(root)
            if found is not None and _same_checkout(found, here):
                return str(found["id"])
            new = secrets.token_hex(ID_BYTES)
            if found is not None:
                log.info("%s names checkout %s of %s: this folder gets an id of its own",
                         folder / FILE, found.get("id"), found.get("root"))
            write_atomic(folder / FILE, json.dumps({"id": new, **here}, indent=2) + "\n")
            return new
    except OSError as exc:
        # A checkout that cannot keep its id (read-only) cannot sync either; a read that
        # names its ref gets an id of this process alone.
        log.warning("cannot keep this checkout's id in %s: %s", folder / FILE, exc)
        return secrets.token_hex(ID_BYTES)


def kept_id_problem(root: Path) -> str | None:
    """What is wrong with the id kept for the checkout at `root`, or None: unreadable,
    not an id, or naming another folder (the next sync makes a new id, and this
    checkout's tree moves to the ref it names). Reads only; `checkout_id` repairs."""
    path = codeveil_dir(root) / FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        # The lock is left by the id's making: without it no id was ever made here (a
        # store without refs, or a checkout not synced since ids came), nothing lost.
        if (codeveil_dir(root) / "checkout.lock").exists():
            return "missing: this checkout's id is lost, its tree on no ref of its own"
        return None
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    if not (isinstance(raw, dict) and isinstance(raw.get("id"), str)
            and len(raw["id"]) == 2 * ID_BYTES
            and all(c in "0123456789abcdef" for c in raw["id"])):
        return "not a checkout id"
    if not _same_checkout(raw, _identity(root)):
        return f"names another checkout's folder ({raw.get('root')})"
    return None


def _identity(root: Path) -> dict[str, object]:
    resolved = root.resolve()
    st = resolved.stat()
    return {"root": str(resolved), "dev": st.st_dev, "ino": st.st_ino}


def _same_checkout(found: dict[str, object], here: dict[str, object]) -> bool:
    """The same path, or the same folder moved (its device and inode)."""
    return found.get("root") == here["root"] or (
        found.get("dev") == here["dev"] and found.get("ino") == here["ino"])


def _read(root: Path) -> dict[str, object] | None:
    path = codeveil_dir(root) / FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    ok = (isinstance(raw, dict) and isinstance(raw.get("id"), str)
          and len(raw["id"]) == 2 * ID_BYTES and all(c in "0123456789abcdef" for c in raw["id"]))
    if not ok:
        log.warning("ignoring %s: not a checkout id", path)
        return None
    return raw


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with open(folder / "checkout.lock", "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield
