"""The diff of the client's Merkle tree (sync.crypto.merkle) against the tree a store holds.

The diff compares roots (one request when nothing changed), then descends one batched
request per level into mismatched buckets only: a sync's requests are 1 with nothing
changed and 1 + LEVELS otherwise, whatever the size or depth of the repo; the bytes of
the answers grow with the changed files times a bucket's size (files / FANOUT^LEVELS).

A store written before buckets holds the repo's directories under the same root key:
the diff finds none of its root's children among the buckets, so it deletes them and
sends every file again in the bucket layout (`Diff.relayout`); the deletes go out after
the files, so each file's rows stay in the store until its new ones replace them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import (
    ROOT,
    LocalTree,
    bucket_names,
    deepest_first,
    leaf_key,
    leaf_value,
    level_of,
)

# Directory keys per `children` request (the server accepts up to 10,000).
CHILDREN_BATCH = 5_000


@dataclass
class Diff:
    """What a sync must do to make the store's tree equal the client's."""

    upload: list[str] = field(default_factory=list)  # file paths to (re)send
    delete: list[bytes] = field(default_factory=list)  # server node keys to remove
    dirs: list[str] = field(default_factory=list)  # directory values to set, deepest first
    requests: int = 0
    #: Leaves of the store's tree this client does not know that are pages of the
    #: workspace (sync.crypto.pages): another machine wrote them; read before anything is sent.
    foreign_pages: list[bytes] = field(default_factory=list)
    #: The store's tree is in a layout from before buckets: every file is sent again, and
    #: the old directories are deleted after them.
    relayout: bool = False

    @property
    def empty(self) -> bool:
        return not (self.upload or self.delete or self.dirs)


def diff(tree: LocalTree, client: StoreClient, key: WorkspaceKey,
         known_pages: frozenset[bytes] | set[bytes] | None = None) -> Diff:
    """Find the files to upload and the server nodes to delete, level by level. With
    `known_pages` (a workspace whose rows are in pages), a leaf the tree lacks that is
    a page of the workspace and not among them is listed in `foreign_pages`, not
    deleted: the tree leaves out the pages it knows hold no live row."""
    out = Diff()
    root = client.root()
    out.requests += 1
    if not tree.files:
        if root is not None:
            out.delete.append(root.key)
        return out
    if root is not None and root.value == ciphers.node_value(key, ROOT, tree.dirs[ROOT]):
        return out
    touched_dirs: set[str] = set()
    # Paged: a bucket the tree lacks may hold pages another machine wrote; it is read
    # (a "probe") rather than deleted, and deleted whole only if it holds none.
    probes: dict[str, tuple[bytes, str]] = {}  # probe -> (its key, its parent)
    holds_foreign: set[str] = set()
    probe_deletes: dict[str, list[bytes]] = {}
    names = bucket_names(key) if known_pages is not None else {}
    if root is None:
        out.upload = sorted(tree.files)
    else:
        frontier = [ROOT]
        while frontier:
            keys = {ciphers.node_key(key, d): d for d in frontier}
            answer: dict[bytes, list] = {}
            key_list = list(keys)
            # One request per level, split only where a level is wider than a request.
            for start in range(0, len(key_list), CHILDREN_BATCH):
                answer.update(client.children(key_list[start : start + CHILDREN_BATCH]))
                out.requests += 1
            next_frontier: list[str] = []
            for dir_key, d in keys.items():
                if d not in probes:
                    touched_dirs.add(d)
                local = {leaf_key(key, c): c for c in tree.children.get(d, ())}
                seen: set[str] = set()
                for node in answer.get(dir_key, []):
                    path = local.get(node.key)
                    if path is None:
                        if (known_pages is not None and not node.is_dir
                                and node.key not in known_pages
                                and node.value == ciphers.page_value(key, node.key)):
                            out.foreign_pages.append(node.key)
                            holds_foreign.add(d)
                            continue
                        probe = names.get(node.key) if node.is_dir else None
                        if probe is not None and level_of(probe) == level_of(d) + 1:
                            probes[probe] = (node.key, d)
                            next_frontier.append(probe)
                            continue
                        # A file of ours in another place (the layout from before
                        # buckets) moves when it is sent; deleting it would lose it.
                        if node.key not in tree.file_keys:
                            if d in probes:
                                probe_deletes.setdefault(d, []).append(node.key)
                            else:
                                out.delete.append(node.key)
                        continue
                    seen.add(path)
                    if node.is_dir != tree.is_dir(path):
                        out.delete.append(node.key)
                        out.upload.extend(tree.files_under(path))
                    elif node.value == leaf_value(key, path, tree.digest(path)):
                        continue
                    elif node.is_dir:
                        next_frontier.append(path)
                    else:
                        out.upload.append(path)
                for path in tree.children.get(d, ()):
                    if path not in seen:
                        out.upload.extend(tree.files_under(path))
                if d == ROOT and answer.get(dir_key) and not seen:
                    out.relayout = True
            frontier = next_frontier
    # A probe that holds a foreign page keeps it and loses the rest; one that holds
    # none is deleted whole (deepest first, so a holder's parent holds too).
    for probe in deepest_first(probes):
        probe_key, parent = probes[probe]
        if probe in holds_foreign:
            out.delete.extend(probe_deletes.get(probe, ()))
            holds_foreign.add(parent)
        elif parent in probes:
            probe_deletes.setdefault(parent, []).append(probe_key)
        else:
            out.delete.append(probe_key)
    for path in out.upload:
        touched_dirs.update(tree.ancestors[path])
    out.upload.sort()
    out.dirs = deepest_first(touched_dirs)
    return out
