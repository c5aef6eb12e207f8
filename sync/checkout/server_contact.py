"""What this checkout last learned from its server, and what a command that asked it says
when it cannot be reached now.

The client's copy (chunk table, words, vectors, grep index) is authoritative for reads:
a sealed workspace searches it here, and no read asks its server (sync.workspace.workspace,
`open_for_read`). A command that does ask (`status --server`, a server-search
workspace's search, an index) and gets no answer says so: `Unreachable` is that
statement (one line for stderr, a dict for JSON and MCP).

`.codeveil/server.json` keeps, for a workspace on a server:

- what the last successful check against the server confirmed (the workspace's key
  check, model, dim, mode and whether it keeps a blob pool), so that a read opens the
  workspace without asking, and still refuses a key or model that differs from what
  the server last confirmed;
- when this copy last completed a sync with the server (`last_sync`, UTC ISO 8601).

It holds nothing secret (the key check is what the server itself holds) and is
rewritten whole (`write_atomic`); a missing or unreadable file only means "not known".
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sync.checkout.config import codeveil_dir

log = logging.getLogger(__name__)

__all__ = ["ServerRecord", "Unreachable", "load_record", "record_check", "record_sync",
           "utc_now"]

RECORD_VERSION = 1


@dataclass(frozen=True)
class ServerRecord:
    """What `.codeveil/server.json` holds (see the module's doc)."""

    workspace_id: str
    server: str
    key_check: str  # hex
    model_id: str
    dim: int
    mode: str
    pool: bool
    checked_at: str
    last_sync: str | None = None
    version: int = RECORD_VERSION


@dataclass(frozen=True)
class Unreachable:
    """A read answered from this machine's copy because the server did not answer."""

    server: str
    error: str
    last_sync: str | None  # when this copy last completed a sync; None: never recorded
    status: int | None = None  # what it answered (502/503/504); None: nothing answered

    def note(self) -> str:
        """The one line a command prints on stderr."""
        synced = (f"this copy last synced {_readable(self.last_sync)}" if self.last_sync
                  else "no completed sync of this copy is recorded")
        return f"codeveil: {self.summary()}; answered from this machine's copy ({synced})"

    def summary(self) -> str:
        """`server at URL unreachable` (nothing answered) or `... unavailable (HTTP N)`."""
        state = "unreachable" if self.status is None else f"unavailable (HTTP {self.status})"
        return f"server at {self.server} {state}"

    def to_dict(self) -> dict[str, Any]:
        """The `offline` field of `--json` and MCP results."""
        return {"server": self.server, "reachable": False, "status": self.status,
                "last_sync": self.last_sync, "error": self.error}


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _readable(stamp: str) -> str:
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _path(root: Path) -> Path:
    return codeveil_dir(root) / "server.json"


def load_record(root: Path, workspace_id: str, server: str) -> ServerRecord | None:
    """The record of `workspace_id` on `server`, or None if there is none (or it is of
    another workspace or server: a folder re-pointed since)."""
    try:
        raw = json.loads(_path(root).read_text())
        record = ServerRecord(**raw)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring %s: %s", _path(root), exc)
        return None
    if (record.version != RECORD_VERSION or record.workspace_id != workspace_id
            or record.server != server):
        return None
    return record


def _save(root: Path, record: ServerRecord) -> None:
    from indexer.private_files import write_atomic

    try:
        write_atomic(_path(root), json.dumps(asdict(record), indent=2) + "\n",
                     durable=False)
    except OSError as exc:  # a read-only checkout still searches
        log.warning("cannot write %s: %s", _path(root), exc)


def record_check(root: Path, record: ServerRecord) -> None:
    """Keep what a check against the server just confirmed (and the last sync known)."""
    old = load_record(root, record.workspace_id, record.server)
    last = old.last_sync if old is not None else None
    if old is not None and replace(old, checked_at=record.checked_at) == replace(
            record, last_sync=last):
        return  # nothing new: a search does not rewrite the file each time
    _save(root, replace(record, last_sync=last))


def record_sync(root: Path, workspace_id: str, server: str) -> None:
    """Note that this copy just completed a sync with `server`."""
    old = load_record(root, workspace_id, server)
    if old is not None:
        _save(root, replace(old, last_sync=utc_now()))


def unreachable(root: Path, workspace_id: str, server: str, error: Exception | str, *,
                status: int | None = None) -> Unreachable:
    """What a read answered without `server` says; `status` (else the error's own) is
    what it answered, None when nothing did."""
    record = load_record(root, workspace_id, server)
    if status is None:
        status = getattr(error, "status", None)
    return Unreachable(server=server, error=str(error),
                       last_sync=record.last_sync if record is not None else None,
                       status=status)
