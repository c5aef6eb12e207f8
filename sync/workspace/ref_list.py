"""The refs (branch trees) of a checkout's sealed workspace, as `codeveil refs` lists
them, and removing one by its name.

The store knows refs by keyed ids only (sync.checkout.refs). This machine can name the ids this
checkout would make for its own branches (and those it made before checkout ids) and
the one it syncs; the others (a teammate's, another clone's, a deleted branch's) keep
their id's first bytes as a name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sync.checkout.refs import local_ref_names, ref_id
from sync.errors import SyncError
from sync.workspace.workspace import Workspace


class OneTree(SyncError):
    """The workspace keeps one tree (server-search, or a store without refs)."""


@dataclass(frozen=True)
class NamedRef:
    """One ref of the workspace: its name (or its id's first bytes), whether this
    checkout syncs it, when it last wrote (seconds since the epoch) and what it holds."""

    name: str
    current: bool
    synced_at: float
    files: int
    rows: int


def list_refs(ws: Workspace) -> list[NamedRef]:
    """Every ref of the workspace with a tree, in the store's order."""
    _root, _config, key, client = ws.open()
    this_ref = _this_ref(ws)
    mine = client.ref
    named = {ref_id(key, n): f"{n} (before checkout ids)"
             for n in local_ref_names(ws.root, legacy=True)}
    named.update({ref_id(key, n): n for n in local_ref_names(ws.root)})
    named[mine] = this_ref
    return [NamedRef(name=named.get(r.ref, r.ref.hex()[:12]), current=r.ref == mine,
                     synced_at=r.synced_at, files=r.files, rows=r.rows)
            for r in client.refs()]


def drop_ref(ws: Workspace, name: str) -> None:
    """Delete the tree of the ref called `name` (`user@host/ID:branch`); RefNotFound if it
    has none."""
    _root, _config, key, client = ws.open()
    _this_ref(ws)
    client.drop_ref(ref_id(key, name))


def _this_ref(ws: Workspace) -> str:
    """The name of the ref this checkout syncs (set by `Workspace.open`)."""
    if ws.ref_name is None:
        raise OneTree("this workspace keeps one tree (server-search, or a store without"
                      " refs)")
    return ws.ref_name
