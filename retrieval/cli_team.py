"""`codeveil invite` and `codeveil join`: a teammate joins a workspace with one string
(sync.invite, sync.join)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from retrieval.cli_base import _index

_SECRET_NOTE = (
    "This string is a secret, like a password: it holds the workspace key (anyone with it"
    " can read the index) and the server token. Send it over a private channel only."
)


@click.command()
@click.option("--expires", "expires", metavar="DURATION",
              help="Make `codeveil join` refuse the string after DURATION (30m, 12h, 7d,"
                   " 2w). The token it carries is the workspace's own and stays valid.")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path),
              help="The checkout whose workspace to share (default: the one around here).")
def invite(expires: str | None, repo: Path) -> None:
    """Print one string that lets a teammate join this workspace (`codeveil join`).

    It carries the server URL, the workspace id, the server token and the workspace key,
    versioned and checksummed so that a cut or altered copy is refused. Only workspaces
    on a server (`codeveil init --server URL`) can be shared. The server has no
    per-invitee tokens: the string carries the workspace's own token, so it cannot be
    revoked alone.
    """
    from sync.invite import make_invite, parse_duration

    seconds = parse_duration(expires) if expires else None
    made = make_invite(repo, expires_in=seconds)
    click.echo(f"# invite to workspace {made.workspace_id} on {made.server}", err=True)
    click.echo(f"# {_SECRET_NOTE}", err=True)
    click.echo("# In the teammate's clone: codeveil join 'STRING'", err=True)
    click.echo(made.encode())


@click.command()
@click.argument("string")
@click.argument("path", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the first index's summary as JSON.")
@click.option("--no-index", "no_index", is_flag=True,
              help="Only join; run `codeveil index` later.")
def join(string: str, path: Path, as_json: bool, no_index: bool) -> None:
    """Join the workspace of an invite STRING (from `codeveil invite`) in the clone at PATH.

    The string is checked first (format, checksum, expiry, then the server's answer to
    its token and the key's match): a bad one is refused before anything is written.
    Then the key and token are stored in your config dir, PATH is pointed at the
    workspace, and the first index runs: it pulls the vectors your teammates already
    made instead of embedding them. STRING may be - to read it from stdin (which keeps
    it out of your shell history).
    """
    from sync.invite import decode_invite
    from sync.join import join_workspace

    if string == "-":
        string = sys.stdin.read()
    config = join_workspace(path, decode_invite(string))
    click.echo(f"joined workspace {config.workspace_id} ({config.mode}) on {config.server}",
               err=True)
    if no_index:
        return
    idx = _index(path)
    try:
        report = idx.index()
    finally:
        idx.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from retrieval.cli import _print_report

        _print_report(report)
