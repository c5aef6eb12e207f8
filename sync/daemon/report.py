"""A daemon's status (sync.daemon.control.probe) as lines for people, for `codeveil
daemon status`."""

from __future__ import annotations

import time
from pathlib import Path

from sync.daemon.control import DaemonState
from sync.daemon.status import DaemonStatus


def status_lines(state: DaemonState, log_path: Path) -> list[str]:
    """What `codeveil daemon status` prints: a headline, then one `name: value` line
    per fact of the last status the daemon wrote (if it ever wrote one)."""
    s = state.status
    lines: list[str] = []
    if state.running:
        lines.append(f"codeveil daemon: running (pid {state.pid or '?'}) for {state.root}")
    else:
        lines.append(f"codeveil daemon: not running for {state.root}")
        if state.stale_pid:
            lines.append(f"  pid {state.stale_pid} died without stopping cleanly;"
                         " its pid file was cleared")
        if s is None:
            return lines
    if s is None:  # running, and has not written a status yet
        s = DaemonStatus()
    rows: list[tuple[str, str]] = [
        ("state" if state.running else "last state", str(s.state)),
        ("started", when(s.started)),
    ]
    if s.last_sync_finished:
        result = s.last_result or {}
        if s.last_sync_ok:
            outcome = (f"ok: {result.get('files_changed', 0)} changed,"
                       f" {result.get('files_deleted', 0)} deleted,"
                       f" {result.get('chunks_total', '?')} chunks in the index,"
                       f" {result.get('seconds', 0):.1f} s")
        else:
            outcome = "failed"
        rows.append(("last sync", f"{when(s.last_sync_finished)}, {outcome}"))
    elif s.last_sync_started:
        rows.append(("last sync", f"first sync running since {when(s.last_sync_started)}"))
    rows.append(("pending", f"{s.pending_changes} changed paths"))
    if s.server != "embedded":
        reach = {True: "reachable", False: "UNREACHABLE", None: "not contacted yet"}
        rows.append(("server", f"{s.server} ({reach.get(s.server_reachable, '?')})"))
    if s.consecutive_errors:
        retry = s.next_retry_at
        wait = (f"; next retry in {max(0.0, retry - time.time()):.0f} s"
                if retry and state.running else "")
        rows.append(("errors", f"{s.consecutive_errors} failed syncs in a row{wait}"))
        rows.append(("last error", str(s.last_error)))
    if s.watching:
        rows.append(("watching", f"yes ({s.watched_dirs} top-level folders)"))
    else:
        rows.append(("watching", f"no{': ' + s.watch_error if s.watch_error else ''}"))
    rows.append(("log", str(log_path)))
    lines.extend(f"  {name:>10}: {value}" for name, value in rows)
    return lines


def when(ts: object) -> str:
    """A timestamp as local time and how long ago it was."""
    if not isinstance(ts, int | float):
        return "never"
    ago = max(0.0, time.time() - ts)
    if ago < 120:
        rel = f"{ago:.0f} s ago"
    elif ago < 7200:
        rel = f"{ago / 60:.0f} min ago"
    else:
        rel = f"{ago / 3600:.1f} h ago"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({rel})"
