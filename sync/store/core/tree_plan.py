"""Step 1 of an apply's write order, decided once for both store backends: from the
updates' ancestors and the deletes, and what the tree holds now, which nodes go pending,
which rows go and which nodes step 3 deletes (docs/architecture.md, "Write order").

`plan_tree` is pure: it reads the tree through a `TreeReads` the backend supplies (the
embedded store's SQLite over `ref || key`, sync.store.embedded.sqlite_tree; PostgreSQL's rows of
one ref, sync.store.postgres.tree) and writes nothing; each backend then writes the plan in
its own step 1 (`gone` and `shape` pending, then every node above `seeds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sync.store.core.checks import Update
from sync.store.core.rows import fid_of, refuse_fid_collisions
from sync.wire import BadRequest

#: key -> (parent, is_dir): the nodes an apply upserts, root first.
Shape = dict[bytes, tuple[bytes | None, bool]]


class TreeReads(Protocol):
    """What `plan_tree` reads of one ref's tree, in the caller's transaction. Keys are
    as the backend stores them (the keys of the updates it was given)."""

    def roots(self) -> list[bytes]:
        """The keys of the tree's parentless nodes."""
        ...

    def subtree(self, roots: Sequence[bytes]) -> dict[bytes, bool]:
        """Every existing node at or below `roots`: key -> is_dir."""
        ...

    def existing(self, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes | None, bool]]:
        """key -> (parent, is_dir) of those of `keys` the tree holds."""
        ...

    def near(self, file_keys: Sequence[bytes]) -> list[bytes]:
        """The stored keys that share a fid (`fid_bounds`) with one of `file_keys`."""
        ...


@dataclass(frozen=True, slots=True)
class TreePlan:
    """What step 1 writes, and what steps 2 and 3 need of it."""

    shape: Shape  # upserted with value NULL (parents and kinds as the batch says)
    gone: frozenset[bytes]  # set NULL: deleted subtrees, old subtrees of new files
    seeds: tuple[bytes, ...]  # set NULL with every node above them
    fids: frozenset[int]  # files whose rows go
    remove: frozenset[bytes]  # nodes deleted at step 3
    replaced: frozenset[bytes]  # nodes of `shape` the tree held before


def _same(key: bytes) -> bytes:
    return key


def plan_tree(updates: Sequence[Update], deletes: Sequence[bytes], reads: TreeReads,
              node_key: Callable[[bytes], bytes] = _same) -> TreePlan:
    """Step 1 of `WorkspaceBackend.apply`'s write order, decided (the whole request was
    checked by `validate_apply`). `node_key` maps a stored key to the node key a client
    sent (whose first 8 bytes are its fid). BadRequest for an update under another
    root, or a file whose fid another node shares."""
    shape: Shape = {}
    for u in updates:
        for j, key in enumerate(u.ancestors):
            shape[key] = (u.ancestors[j - 1] if j else None, True)
        shape[u.file_key] = (u.ancestors[-1], False)
    if updates:
        roots = reads.roots()
        if roots and roots != [updates[0].ancestors[0]]:
            raise BadRequest(
                "updates[0].ancestors[0] is not this workspace's root key; to"
                " change roots, delete the old root in an apply of its own first"
            )
    deleted = reads.subtree(deletes)
    existing = reads.existing(list(shape))
    fids = {fid_of(node_key(u.file_key)) for u in updates}
    fids.update(fid_of(node_key(k)) for k, is_dir in deleted.items() if not is_dir)
    moved_from: set[bytes] = set()
    became_files: list[bytes] = []
    for key, (parent, is_dir) in shape.items():
        old = existing.get(key)
        if old is None:
            continue
        if old[1] and not is_dir and key not in deleted:
            became_files.append(key)  # its old subtree goes as if deleted
        elif is_dir and not old[1]:
            fids.add(fid_of(node_key(key)))  # a file that became a directory: its rows go
        if old[0] != parent and old[0] is not None:
            moved_from.add(old[0])
    below = reads.subtree(became_files)
    fids.update(fid_of(node_key(k)) for k, is_dir in below.items() if not is_dir)
    gone = set(deleted) | set(below)
    if updates:
        stored = reads.near([u.file_key for u in updates])
        refuse_fid_collisions([node_key(u.file_key) for u in updates],
                              _keys(shape, node_key), _keys(stored, node_key),
                              set(_keys(gone, node_key)))
    seeds = (*(k for k in deletes if k in deleted), *sorted(moved_from))
    return TreePlan(shape, frozenset(gone), seeds, frozenset(fids),
                    frozenset(gone - shape.keys()), frozenset(k for k in shape if k in existing))


def _keys(keys: Iterable[bytes], node_key: Callable[[bytes], bytes]) -> list[bytes]:
    return [node_key(k) for k in keys]
