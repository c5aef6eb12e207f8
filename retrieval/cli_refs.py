"""`codeveil refs`: the refs (branch trees) of this repo's sealed workspace, and removing
one. The store knows refs by keyed ids only, so a ref is named here by the name it is
made from (`user@host:branch`, sync.refs), whose id this machine can compute."""

from __future__ import annotations

import time
from pathlib import Path

import click

from retrieval.cli_base import _fail, _index
from sync.refs import local_ref_names, ref_id


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@click.command()
@click.option("--remove", "remove", metavar="NAME",
              help="Remove the ref of this name (e.g. alice@laptop:old-branch).")
@click.option("-C", "--repo", "repo", default=".", type=click.Path(path_type=Path))
def refs(remove: str | None, repo: Path) -> None:
    """List the workspace's refs (age, files, rows), or remove one."""
    with _index(repo) as idx:
        ws = idx.workspace
        _root, _config, key, client = ws.open()
        this_ref = ws.ref_name
        if this_ref is None:
            _fail("this workspace keeps one tree (server-search, or a store without refs)")
        if remove is not None:
            client.drop_ref(ref_id(key, remove))
            click.echo(f"removed ref {remove}")
            return
        mine = client.ref
        # The refs this machine made for its local branches are named; others (a
        # teammate's, a deleted branch's) show their id's first bytes.
        named = {ref_id(key, n): n for n in local_ref_names(ws.root)}
        named[mine] = this_ref
        now = time.time()
        for r in client.refs():
            name = named.get(r.ref, r.ref.hex()[:12])
            click.echo(f"{'*' if r.ref == mine else ' '} {name:<40} {_age(now - r.synced_at):>5}"
                       f" {r.files:>7} files {r.rows:>8} rows")
