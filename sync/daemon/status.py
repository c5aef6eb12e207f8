"""The status a daemon writes to `.codeveil/daemon.json` after every change, and reads
back for `codeveil daemon status`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from indexer.record_view import FieldsMapping


@dataclass(eq=False)
class DaemonStatus(FieldsMapping):
    """One daemon's state, its last sync and its errors; times are Unix seconds.

    The daemon updates it in place and writes `to_dict()` as JSON (keys in this order).
    Read as attributes; also as the dict it used to be (`status["state"]`, `.get`).
    """

    server: str = "embedded"
    pid: int | None = None
    root: str | None = None
    started: float | None = None
    # starting, idle, waiting (changes pending), backoff (after a failed sync),
    # syncing, then stopped or failed; `died` once a probe finds it gone without stopping.
    state: str | None = None
    full_interval: float | None = None
    debounce: float | None = None
    syncs: int = 0
    last_sync_started: float | None = None
    last_sync_finished: float | None = None
    last_sync_seconds: float | None = None
    last_sync_ok: bool | None = None
    last_success: float | None = None
    # The last sync's report, summed up (sync.daemon.loop._summary).
    last_result: dict[str, Any] | None = None
    pending_changes: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    next_retry_at: float | None = None
    # None until the daemon has contacted the server.
    server_reachable: bool | None = None
    watching: bool = False
    watched_dirs: int = 0
    watch_error: str | None = None
    # Set when the daemon stops; the JSON has the key only from then on.
    stopped: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        if data["stopped"] is None:
            del data["stopped"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DaemonStatus:
        """A status read from its JSON; keys it does not know are left out, missing ones
        take their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
