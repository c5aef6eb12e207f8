"""A daemon's status (sync.daemon.control.probe) as lines for people, for `codeveil
daemon status`."""

from __future__ import annotations

import time
from pathlib import Path

from sync.daemon.control import DaemonState


def status_lines(state: DaemonState, log_path: Path) -> list[str]:
    """What `codeveil daemon status` prints: a headline, then one `name: value` line
    per fact of the last status the daemon wrote (if it ever wrote one)."""
    s = state.status or {}
    lines: list[str] = []
    if state.running:
        lines.append(f"codeveil daemon: running (pid {state.pid or '?'}) for {state.root}")
    else:
        lines.append(f"codeveil daemon: not running for {state.root}")
        if state.stale_pid:
            lines.append(f"  pid {state.stale_pid} died without stopping cleanly;"
                         " its pid file was cleared")
        if not s:
            return lines
    rows: list[tuple[str, str]] = [
        ("state" if state.running else "last state", str(s.get("state"))),
        ("started", when(s.get("started"))),
    ]
    if s.get("last_sync_finished"):
        result = s.get("last_result") or {}
        if s.get("last_sync_ok"):
            outcome = (f"ok: {result.get('files_changed', 0)} changed,"
                       f" {result.get('files_deleted', 0)} deleted,"
                       f" {result.get('chunks_total', '?')} chunks in the index,"
                       f" {result.get('seconds', 0):.1f} s")
        else:
            outcome = "failed"
        rows.append(("last sync", f"{when(s.get('last_sync_finished'))}, {outcome}"))
    elif s.get("last_sync_started"):
        rows.append(("last sync", f"first sync running since {when(s['last_sync_started'])}"))
    rows.append(("pending", f"{s.get('pending_changes', 0)} changed paths"))
    server = s.get("server", "embedded")
    if server != "embedded":
        reach = {True: "reachable", False: "UNREACHABLE", None: "not contacted yet"}
        rows.append(("server", f"{server} ({reach.get(s.get('server_reachable'), '?')})"))
    if s.get("consecutive_errors"):
        retry = s.get("next_retry_at")
        wait = (f"; next retry in {max(0.0, retry - time.time()):.0f} s"
                if retry and state.running else "")
        rows.append(("errors", f"{s['consecutive_errors']} failed syncs in a row{wait}"))
        rows.append(("last error", str(s.get("last_error"))))
    if s.get("watching"):
        rows.append(("watching", f"yes ({s.get('watched_dirs', 0)} top-level folders)"))
    else:
        rows.append(("watching", f"no{': ' + s['watch_error'] if s.get('watch_error') else ''}"))
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
