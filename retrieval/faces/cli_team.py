"""`codeveil invite` and `codeveil join`: a teammate joins a workspace with one string
(sync.workspace.invite, sync.workspace.join)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from retrieval.faces.cli_base import _index, folder_params, json_option, print_report, repo_option

if TYPE_CHECKING:
    from sync.store.core.invitees import Invitee

_SECRET_NOTE = (
    "This string is a secret, like a password: it holds the workspace key (anyone with it"
    " can read the index) and the server token. Send it over a private channel only."
)


@click.command()
@click.option("--expires", "expires", metavar="DURATION",
              help="The invite's token stops working after DURATION (30m, 12h, 7d, 2w;"
                   " default: until revoked).")
@click.option("--list", "show", is_flag=True, help="List the invite tokens not revoked.")
@click.option("--revoke", "revoke", metavar="ID",
              help="Revoke the invite token ID (from the invite's output, or --list).")
@repo_option("The checkout whose workspace to share (default: the one around here).")
def invite(expires: str | None, show: bool, revoke: str | None, repo: Path) -> None:
    """Print one string that lets a teammate join this workspace (`codeveil join`).

    It carries the server URL, the workspace id, a token made for this invite alone and
    the workspace key, versioned and checksummed so that a cut or altered copy is
    refused. The token can be revoked on its own (--revoke), or made to expire
    (--expires). Only workspaces on a server (`codeveil init --server URL`) can be
    shared, and only with the token they were created with (a teammate who joined asks
    the owner). Revoking a token stops that teammate's access to the server, not what
    they already pulled, nor the key they hold.
    """
    from sync.workspace.invite import list_invitees, make_invite, parse_duration, revoke_invitee

    if sum((bool(expires), show, revoke is not None)) > 1:
        raise click.UsageError("give one of --expires, --list and --revoke")
    if show:
        _print_invitees(list_invitees(repo))
        return
    if revoke is not None:
        revoke_invitee(repo, revoke)
        click.echo(f"revoked invite token {revoke}")
        return
    seconds = parse_duration(expires) if expires else None
    made, token_id = make_invite(repo, expires_in=seconds)
    until = "until revoked" if made.expires_at is None else f"until {_when(made.expires_at)}"
    click.echo(f"# invite to workspace {made.workspace_id} on {made.server}; its token"
               f" {token_id} works {until} (`codeveil invite --revoke {token_id}`)", err=True)
    click.echo(f"# {_SECRET_NOTE}", err=True)
    click.echo("# In the teammate's clone: codeveil join 'STRING'", err=True)
    click.echo(made.encode())


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _print_invitees(invitees: list[Invitee]) -> None:
    if not invitees:
        click.echo("no invite tokens", err=True)
        return
    now = time.time()
    for i in invitees:
        if i.expires_at is None:
            state = "until revoked"
        elif i.expires_at <= now:
            state = f"expired {_when(i.expires_at)}"
        else:
            state = f"until {_when(i.expires_at)}"
        click.echo(f"{i.token_id}  made {_when(i.created_at)}  {state}")


@click.command()
@click.argument("string")
@folder_params("The clone to join with (default: here).")
@json_option("Print the first index's summary as JSON.")
@click.option("--no-index", "no_index", is_flag=True,
              help="Only join; run `codeveil index` later.")
def join(string: str, repo: Path, as_json: bool, no_index: bool) -> None:
    """Join the workspace of an invite STRING (from `codeveil invite`) in the clone at -C
    (or PATH; default: here).

    The string is checked first (format, checksum, expiry, then the server's answer to
    its token and the key's match): a bad one is refused before anything is written.
    Then the key and token are stored in your config dir, the clone is pointed at the
    workspace, and the first index runs: it pulls the vectors your teammates already
    made instead of embedding them. STRING may be - to read it from stdin (which keeps
    it out of your shell history).
    """
    from sync.workspace.invite import decode_invite
    from sync.workspace.join import join_workspace

    if string == "-":
        string = sys.stdin.read()
    config = join_workspace(repo, decode_invite(string))
    click.echo(f"joined workspace {config.workspace_id} ({config.mode}) on {config.server}",
               err=True)
    if no_index:
        return
    idx = _index(repo)
    try:
        report = idx.index(wait=True)
    finally:
        idx.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
