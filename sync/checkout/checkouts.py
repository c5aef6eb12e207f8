"""Which workspace each checkout on this machine belongs to, kept in the user config dir
beside the keys and tokens: `checkouts/<digest of the root's path>.json`.

`.codeveil/config.json` is the one place a checkout names its server and workspace; the
key and the token live elsewhere (the user config dir). If that file is deleted, the
embedded store can rebuild it (`sync.workspace.config_recovery`), but a workspace on a server could
not: its URL and id were only there, and the advice every command gave (`codeveil index`)
silently made a new embedded workspace, detached from the team's server, under a new
key. So every config naming a server is also recorded here (and the record dropped when
the checkout is pointed at an embedded store): `codeveil doctor --repair` rebuilds the
config from it, and an index refuses to start a new workspace over it.

A record holds no secret: root, workspace id, server URL, model, dim, mode.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from indexer.paths import config_dir

log = logging.getLogger(__name__)

__all__ = ["CheckoutRecord", "find_recorded", "forget_checkout", "load_checkout",
           "record_checkout", "record_path"]

RECORD_VERSION = 1


@dataclass(frozen=True)
class CheckoutRecord:
    """A checkout's workspace on a server, as its config.json last named it."""

    root: str
    workspace_id: str
    server: str
    model_id: str
    dim: int
    mode: str
    version: int = RECORD_VERSION


def record_path(root: Path) -> Path:
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
    return config_dir() / "checkouts" / f"{digest}.json"


def record_checkout(record: CheckoutRecord) -> None:
    """Keep (or update) the record of `record.root`; never fails a command."""
    from indexer.private_files import private_dir, write_atomic

    path = record_path(Path(record.root))
    if load_checkout(Path(record.root)) == record:
        return
    try:
        private_dir(path.parent)
        write_atomic(path, json.dumps(asdict(record), indent=2) + "\n")
    except OSError as exc:
        log.warning("cannot record the checkout %s in %s: %s", record.root, path, exc)


def forget_checkout(root: Path) -> None:
    """Drop the record of `root` (now pointed at an embedded store)."""
    try:
        record_path(root).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s: %s", record_path(root), exc)


def load_checkout(root: Path) -> CheckoutRecord | None:
    """The record of the checkout at `root`, None if there is none (or it is unreadable,
    or of another folder whose path hashed alike)."""
    path = record_path(root)
    try:
        record = CheckoutRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    if record.version != RECORD_VERSION or record.root != str(root.resolve()):
        return None
    return record


def find_recorded(start: Path) -> CheckoutRecord | None:
    """The record of `start` or the nearest folder above it that has one."""
    start = start.resolve()
    for folder in (start, *start.parents):
        record = load_checkout(folder)
        if record is not None:
            return record
    return None
