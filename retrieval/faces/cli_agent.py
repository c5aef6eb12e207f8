"""`codeveil agent install | uninstall`: codeveil's MCP server in coding agents' own config
files (retrieval.faces.agent_setup does the edits; this module parses and prints)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from retrieval.faces.agent_setup.clients import CLIENTS, Client, client_named
from retrieval.faces.agent_setup.install import Change
from retrieval.faces.cli_base import _fail, repo_option

F = TypeVar("F", bound=Callable[..., Any])
_NAMES = [c.name for c in CLIENTS]
def _client_option(default: str) -> Callable[[F], F]:
    return click.option(
        "--client", "names", multiple=True, type=click.Choice(_NAMES), metavar="NAME",
        help="Only this client (repeat for several): " + ", ".join(_NAMES)
             + f". Default: {default}.")
_SCOPE_OPTION = click.option(
    "--scope", type=click.Choice(["project", "user"]), default="project", show_default=True,
    help="The repo's own file (.mcp.json, .cursor/mcp.json...) or your user config."
         " Clients without project files (Claude Desktop, Windsurf) always use the user's.")
_PRINT_OPTION = click.option("--print", "dry_run", is_flag=True,
                             help="Show what would be written; change nothing.")
_REPO_OPTION = repo_option("The repository the agent searches (default: here).")


def _repo_root(repo: Path) -> Path:
    from indexer.errors import CodeveilError
    from sync.checkout.config import find_root

    try:
        return find_root(repo)
    except CodeveilError:  # not indexed yet: the agent's `sync_index` creates the index
        return repo.resolve()


def _chosen(names: tuple[str, ...], root: Path, home: Path) -> list[Client]:
    from retrieval.faces.agent_setup.install import detect_clients

    if names:
        return [client_named(n) for n in dict.fromkeys(names)]
    found = detect_clients(root, home)
    if not found:
        _fail("no agent client found on this machine or in the repo; name one with"
              f" --client ({', '.join(_NAMES)})")
    click.echo("clients found: " + ", ".join(c.title for c in found)
               + " (--client NAME to choose)", err=True)
    return found


def _report(changes: list[Change], dry_run: bool) -> None:
    for change in changes:
        verb = {"added": "add to", "updated": "update in", "removed": "remove from",
                "unchanged": "leave", "absent": "find nothing in"}[change.action]
        if dry_run:
            click.echo(f"{change.client}: would {verb} {change.path}")
            if change.snippet and change.action in ("added", "updated"):
                click.echo(change.snippet.rstrip("\n"))
            continue
        done = {"added": "added to", "updated": "updated in", "removed": "removed from",
                "unchanged": "already in", "absent": "not in"}[change.action]
        backup = f" (backup: {change.backup})" if change.backup and change.action in (
            "added", "updated", "removed") else ""
        click.echo(f"{change.client}: codeveil {done} {change.path}{backup}")


@click.group()
def agent() -> None:
    """Set up coding agents (Claude Code, Cursor, VS Code, Codex...) to use codeveil.

    \b
      codeveil agent install                    every client found, this repo
      codeveil agent install --client cursor --scope user
      codeveil agent install --with-instructions  also tell the agent when to use it
      codeveil agent uninstall                  remove exactly what install added
    """


@agent.command("install")
@_client_option("every client found on this machine or in the repo")
@_SCOPE_OPTION
@_PRINT_OPTION
@click.option("--with-instructions", "instructions", is_flag=True,
              help="Also add a short section to AGENTS.md (and CLAUDE.md / GEMINI.md for"
                   " those agents) saying when to call search, definition, outline,"
                   " references and grep. Running it again replaces the section.")
@click.option("--absolute", is_flag=True,
              help="In a project file too, write this machine's form: this installation's"
                   " codeveil by its absolute path, -C with the repo's absolute path, and"
                   " CODEVEIL_CONFIG_DIR / CODEVEIL_CACHE_DIR when set. Default there: the"
                   " portable form (`codeveil` from PATH, the folder the client has"
                   " open), which a committed file needs. A user's file always gets the"
                   " absolute form.")
@_REPO_OPTION
def install(names: tuple[str, ...], scope: str, dry_run: bool, instructions: bool,
            absolute: bool, repo: Path) -> None:
    """Write codeveil's MCP server entry into each agent client's config file.

    In the repo's own files (--scope project) the entry is portable: `codeveil mcp`
    from PATH, on the folder the client has open, so the file can be committed. In your
    user config (--scope user, and the clients that have no project file) it runs this
    installation's `codeveil mcp -C REPO` by its absolute path. Other entries of the
    file are kept, comments included (JSON with comments is edited as text); the file
    is copied to FILE.bak before its first change; installing again leaves one entry.
    Every file is checked before any is changed.
    """
    from retrieval.faces.agent_setup.clients import mcp_command, mcp_env
    from retrieval.faces.agent_setup.install import install as run_install
    from retrieval.faces.agent_setup.install import (
        install_instructions,
        instruction_files,
        writes_portable,
    )

    root, home = _repo_root(repo), Path.home()
    clients = _chosen(names, root, home)

    def run(write: bool) -> list[Change]:
        changes = run_install(clients, mcp_command(root), scope=scope, repo=root,
                              home=home, env=mcp_env(), portable=not absolute, write=write)
        if instructions:
            changes += install_instructions(instruction_files(root, clients), write=write)
        return changes

    changes = run(False)  # every file read and its edit made first: a refusal changes none
    if not dry_run:
        changes = run(True)
    _report(changes, dry_run)
    if not absolute and writes_portable(clients, scope):
        _portable_notes()


def _portable_notes() -> None:
    """What the portable form leaves to each machine, said when this one differs."""
    import os
    import shutil

    if shutil.which("codeveil") is None:
        click.echo("note: `codeveil` is not on this shell's PATH; the project file runs it"
                   " from the client's PATH (--absolute writes this installation's path)",
                   err=True)
    moved = [n for n in ("CODEVEIL_CONFIG_DIR", "CODEVEIL_CACHE_DIR") if os.environ.get(n)]
    if moved:
        click.echo(f"note: {' and '.join(moved)} are not written to the project file (they"
                   " are this machine's); the client must have them in its environment, or"
                   " use --absolute", err=True)


@agent.command("uninstall")
@_client_option("every client")
@click.option("--scope", type=click.Choice(["project", "user"]), default=None,
              help="Only the repo's files or only your user config (default: both).")
@_PRINT_OPTION
@_REPO_OPTION
def uninstall(names: tuple[str, ...], scope: str | None, dry_run: bool, repo: Path) -> None:
    """Remove codeveil's entry (and its AGENTS.md / CLAUDE.md section) that install added.

    Other entries stay as they are, comments included; a file install created and
    nothing else uses is removed. Every file is checked first: when one cannot be
    edited, none is changed.
    """
    from retrieval.faces.agent_setup.install import uninstall as run_uninstall
    from retrieval.faces.agent_setup.install import uninstall_instructions

    root, home = _repo_root(repo), Path.home()
    clients = [client_named(n) for n in dict.fromkeys(names)] if names else list(CLIENTS)
    scopes = (scope,) if scope else ("project", "user")

    def run(write: bool) -> list[Change]:
        changes = run_uninstall(clients, scopes=scopes, repo=root, home=home, write=write)
        return changes + uninstall_instructions(root, write=write)

    changes = run(False)  # all or nothing: a file that cannot be edited stops it here
    if not dry_run:
        changes = run(True)
    shown = [c for c in changes if c.action != "absent"]
    if not shown:
        click.echo("codeveil was in no client's config file", err=True)
    _report(shown, dry_run)
