"""`codeveil daemon start|stop|status|run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from indexer.errors import CodeveilError
from retrieval.faces.cli_base import LibraryDefault, folder_params, json_option

# -- daemon -------------------------------------------------------------------------
# `codeveil daemon start|stop|status|run`. The machinery lives in sync.daemon (what it
# syncs: sync.daemon.target); this section checks the folder, calls it and reports.
# See docs/daemon.md.

if TYPE_CHECKING:
    from collections.abc import Callable


def _daemon_options(func: Callable[..., None]) -> Callable[..., None]:
    """The tuning options shared by `daemon start` and `daemon run`; their defaults are
    the daemon's own (sync.daemon.loop)."""
    func = click.option(
        "--max-backoff", "max_backoff", metavar="SECONDS", cls=LibraryDefault,
        default_from="sync.daemon.loop:DEFAULT_BACKOFF_MAX",
        type=click.FloatRange(min=0.1), help="Longest wait between retries of a failed sync.",
    )(func)
    func = click.option(
        "--debounce", metavar="SECONDS", cls=LibraryDefault,
        default_from="sync.daemon.loop:DEFAULT_DEBOUNCE", type=click.FloatRange(min=0.0),
        help="Sync once the tree has been quiet this long after a change.",
    )(func)
    func = click.option(
        "--interval", metavar="SECONDS", cls=LibraryDefault,
        default_from="sync.daemon.loop:DEFAULT_FULL_INTERVAL", type=click.FloatRange(min=0.0),
        help="Also sync this often without any event (0: only on events).",
    )(func)
    return func


def _daemon_root(path: Path) -> Path:
    """The folder a daemon serves: the indexed folder around PATH, else PATH itself."""
    if not path.is_dir():
        raise CodeveilError(f"no such folder: {path}")
    from sync.workspace.workspace import Workspace

    return Workspace(path).root


@click.group()
def daemon() -> None:
    """Keep the index in step with the working tree, within seconds.

    The daemon watches the folder, syncs a moment after files change (a branch switch is
    one sync), re-checks everything every --interval seconds, and retries with backoff
    while the server is down. One daemon per folder; state and log in .codeveil/.
    """


@daemon.command("start")
@folder_params("The folder whose daemon this is (default: the one around here).")
@_daemon_options
@click.option("--timeout", default=30.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=1.0), help="How long to wait for it to come up.")
def daemon_start(repo: Path, interval: float, debounce: float, max_backoff: float,
                 timeout: float) -> None:
    """Start the daemon for the folder (-C, or PATH; default: here) in the background.

    Does nothing but say so if a daemon already runs for it.
    """
    from sync.daemon import AlreadyRunningError, DaemonFiles, spawn

    root = _daemon_root(repo)
    argv = [sys.executable, "-P", "-m", "retrieval", "daemon", "run", "-C", str(root),
            "--interval", repr(interval), "--debounce", repr(debounce),
            "--max-backoff", repr(max_backoff), "--detached"]
    try:
        pid = spawn(root, argv, timeout=timeout)
    except AlreadyRunningError as exc:
        click.echo(f"codeveil daemon: already running (pid {exc.pid or '?'}) for {root}")
        return
    click.echo(f"codeveil daemon: started (pid {pid}) for {root}")
    click.echo(f"log: {DaemonFiles.for_root(root).log}")


@daemon.command("run")
@folder_params("The folder whose daemon this is (default: the one around here).")
@_daemon_options
@click.option("--detached", is_flag=True, hidden=True,
              help="Set by `daemon start`: log to the file only, and capture stdout/stderr.")
def daemon_run(repo: Path, interval: float, debounce: float, max_backoff: float,
               detached: bool) -> None:
    """Run the daemon for the folder in the foreground (for systemd, launchd or a terminal).

    Logs to stderr and .codeveil/daemon.log; SIGTERM or Ctrl-C stop it cleanly.
    """
    from retrieval.indexes.search_ready import SearchReady
    from sync.daemon import Daemon, DaemonFiles, DaemonLock, WorkspaceSync, setup_logging
    from sync.workspace.workspace import Workspace

    root = _daemon_root(repo)
    files = DaemonFiles.for_root(root)
    lock = DaemonLock.acquire(files)
    try:
        setup_logging(files, to_stderr=not detached, capture_std=detached)
        workspace = Workspace(root)
        # A large sync (a branch switch) also leaves the search side built.
        target = WorkspaceSync(workspace, follower=lambda: SearchReady(workspace))
        runner = Daemon(root, target, full_interval=interval, debounce=debounce,
                        backoff_max=max_backoff)
        try:
            code = runner.run(lock)
        finally:
            target.close()
    finally:
        lock.release()
    if code:
        sys.exit(code)


@daemon.command("stop")
@folder_params("The folder whose daemon this is (default: the one around here).")
@click.option("--timeout", default=30.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=0.1), help="How long to wait for it to exit.")
def daemon_stop(repo: Path, timeout: float) -> None:
    """Stop the daemon for the folder (SIGTERM, then wait for it to exit)."""
    from sync.daemon import DaemonFiles, read_status
    from sync.daemon import stop as stop_daemon
    from sync.daemon.builder import Builder

    root = _daemon_root(repo)
    pid = stop_daemon(root, timeout=timeout)
    builder = Builder(root)
    if builder.running():
        if builder.stop(timeout=timeout):
            click.echo("codeveil: vector builder stopped (the next `codeveil index` resumes it)")
        else:
            click.echo(f"codeveil: the vector builder is still running; see {builder.files.log}",
                       err=True)
    if pid is None:
        click.echo(f"codeveil daemon: not running for {root}")
        return
    final = read_status(DaemonFiles.for_root(root))
    final_state = final.state if final is not None else None
    how = "" if final_state == "stopped" else f" (final state: {final_state})"
    click.echo(f"codeveil daemon: stopped (pid {pid}){how}")


@daemon.command("status")
@folder_params("The folder whose daemon this is (default: the one around here).")
@json_option()
def daemon_status(repo: Path, as_json: bool) -> None:
    """Show whether the daemon for the folder runs, its last sync, pending changes and errors.

    Exit status: 0 if it runs, 3 if not.
    """
    from sync.daemon import EXIT_NOT_RUNNING, DaemonFiles, probe
    from sync.daemon.report import status_lines

    root = _daemon_root(repo)
    state = probe(root)
    if as_json:
        click.echo(json.dumps({
            "root": str(state.root), "running": state.running, "pid": state.pid,
            "stale_pid_cleared": state.stale_pid,
            "status": state.status.to_dict() if state.status is not None else None,
        }, indent=2))
    else:
        for line in status_lines(state, DaemonFiles.for_root(root).log):
            click.echo(line)
    if not state.running:
        sys.exit(EXIT_NOT_RUNNING)


# -- end of daemon ------------------------------------------------------------------
