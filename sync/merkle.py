"""The client's Merkle tree of the repo, and the diff against the tree a store holds.

Locally, a leaf is a file (its xxh3-128 content digest) and a directory's digest is the
xxh3-128 of its sorted children's names, kinds and digests. What the server sees is keyed:
node key = HMAC(k_path, path), node value = HMAC(k_tree, digest); see sync.crypto.

The diff compares roots (one request when nothing changed), then descends one batched
request per tree level, into mismatched directories only, so its cost grows with the
number of changed paths times the depth, not with the size of the repo.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import xxhash

from sync import crypto
from sync.client import StoreClient
from sync.keys import WorkspaceKey
from sync.records import DirValue, children_digest

ROOT = ""
# Directory keys per `children` request (the server accepts up to 10,000).
CHILDREN_BATCH = 5_000


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def ancestors_of(path: str) -> list[str]:
    """Directory paths above `path`, root ("") first."""
    parts = path.split("/")[:-1]
    return [ROOT] + ["/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass
class LocalTree:
    """The repo as a tree of digests: files -> content digest, dirs -> digest of children."""

    files: dict[str, bytes]
    dirs: dict[str, bytes] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, files: dict[str, bytes]) -> LocalTree:
        children: dict[str, set[str]] = {}
        for path in files:
            child = path
            parent = parent_of(child)
            while True:
                siblings = children.setdefault(parent, set())
                if child in siblings:
                    break
                siblings.add(child)
                if parent == ROOT:
                    break
                child, parent = parent, parent_of(parent)
        tree = cls(files=files, children={d: sorted(c) for d, c in children.items()})
        # Deepest directories first, so each directory's children are done before it.
        for d in sorted(tree.children, key=lambda p: -p.count("/") - (p != ROOT)):
            h = xxhash.xxh3_128()
            for child in tree.children[d]:
                is_dir = child in tree.children
                digest = tree.dirs[child] if is_dir else files[child]
                name = child.rpartition("/")[2].encode("utf-8", "surrogateescape")
                h.update(len(name).to_bytes(4, "little") + name + (b"d" if is_dir else b"f"))
                h.update(digest)
            tree.dirs[d] = h.digest()
        return tree

    def is_dir(self, path: str) -> bool:
        return path in self.children

    def files_under(self, path: str) -> list[str]:
        if not self.is_dir(path):
            return [path]
        out: list[str] = []
        stack = [path]
        while stack:
            for child in self.children[stack.pop()]:
                if self.is_dir(child):
                    stack.append(child)
                else:
                    out.append(child)
        return out

    def digest(self, path: str) -> bytes:
        return self.dirs[path] if self.is_dir(path) else self.files[path]


@dataclass
class Diff:
    """What a sync must do to make the store's tree equal the client's."""

    upload: list[str] = field(default_factory=list)  # file paths to (re)send
    delete: list[bytes] = field(default_factory=list)  # server node keys to remove
    dirs: list[str] = field(default_factory=list)  # directory values to set, deepest first
    requests: int = 0

    @property
    def empty(self) -> bool:
        return not (self.upload or self.delete or self.dirs)


def diff(tree: LocalTree, client: StoreClient, key: WorkspaceKey) -> Diff:
    """Find the files to upload and the server nodes to delete, level by level."""
    out = Diff()
    root = client.root()
    out.requests += 1
    if not tree.files:
        if root is not None:
            out.delete.append(root.key)
        return out
    if root is not None and root.value == crypto.node_value(key, ROOT, tree.dirs[ROOT]):
        return out
    touched_dirs: set[str] = set()
    if root is None:
        out.upload = sorted(tree.files)
    else:
        frontier = [ROOT]
        while frontier:
            keys = {crypto.node_key(key, d): d for d in frontier}
            answer: dict[bytes, list] = {}
            key_list = list(keys)
            # One request per level, split only where a level is wider than a request.
            for start in range(0, len(key_list), CHILDREN_BATCH):
                answer.update(client.children(key_list[start : start + CHILDREN_BATCH]))
                out.requests += 1
            next_frontier: list[str] = []
            for dir_key, d in keys.items():
                touched_dirs.add(d)
                local = {crypto.node_key(key, c): c for c in tree.children[d]}
                seen: set[str] = set()
                for node in answer.get(dir_key, []):
                    path = local.get(node.key)
                    if path is None:
                        out.delete.append(node.key)
                        continue
                    seen.add(path)
                    if node.is_dir != tree.is_dir(path):
                        out.delete.append(node.key)
                        out.upload.extend(tree.files_under(path))
                    elif node.value == crypto.node_value(key, path, tree.digest(path)):
                        continue
                    elif node.is_dir:
                        next_frontier.append(path)
                    else:
                        out.upload.append(path)
                for path in tree.children[d]:
                    if path not in seen:
                        out.upload.extend(tree.files_under(path))
            frontier = next_frontier
    for path in out.upload:
        touched_dirs.update(ancestors_of(path))
    out.upload.sort()
    out.dirs = sorted(touched_dirs, key=lambda p: (-(p.count("/") + (p != ROOT)), p))
    return out


def dir_values(tree: LocalTree, key: WorkspaceKey, dirs: Iterable[str]) -> list[DirValue]:
    """Server-side values of local directories, in the order given, each with the digest
    of the children it stands for (the store sets it only over those children)."""
    keys: dict[str, bytes] = {}

    def node_key(path: str) -> bytes:
        k = keys.get(path)
        if k is None:
            k = keys[path] = crypto.node_key(key, path)
        return k

    out = []
    for d in dirs:
        kids = [(node_key(c), crypto.node_value(key, c, tree.digest(c)))
                for c in tree.children[d]]
        out.append(DirValue(node_key(d), crypto.node_value(key, d, tree.dirs[d]),
                            children_digest(kids)))
    return out
