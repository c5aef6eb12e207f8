"""`codeveil refs`: the refs (branch trees) of this repo's sealed workspace, and removing
one by its name (`user@host/ID:branch`): sync.workspace.ref_list."""

from __future__ import annotations

import time
from pathlib import Path

import click

from retrieval.faces.cli_base import _index, repo_option


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@click.command()
@click.option("--remove", "remove", metavar="NAME",
              help="Remove the ref of this name (e.g. alice@laptop/3f9c0a1b2d4e:old-branch).")
@repo_option()
def refs(remove: str | None, repo: Path) -> None:
    """List the workspace's refs (age; leaves: its files, and in a sealed workspace the
    pages of their rows; rows, padding included), or remove one."""
    from sync.workspace.ref_list import drop_ref, list_refs

    with _index(repo) as idx:
        if remove is not None:
            drop_ref(idx.workspace, remove)
            click.echo(f"removed ref {remove}")
            return
        now = time.time()
        for r in list_refs(idx.workspace):
            click.echo(f"{'*' if r.current else ' '} {r.name:<40} {_age(now - r.synced_at):>5}"
                       f" {r.files:>7} leaves {r.rows:>8} rows")
