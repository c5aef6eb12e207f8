"""The client's Merkle tree of the repo: its buckets, keyed names and values (the diff
against the tree a store holds: sync.syncer.diff).

The tree the store sees does not follow the repo's directories: every file hangs under
two levels of buckets picked by its keyed file id (`node_key`, which the store never
links to a path), so the store learns how many files there are and nothing of where
they sit (how many files a directory has, how deep a file is). Locally, a leaf is a file
(its xxh3-128 content digest) and a bucket's digest is the xxh3-128 of its sorted
children's names, kinds and digests. What the server sees is keyed: node key =
HMAC(k_path, name), node value = HMAC(k_tree, name, digest); see sync.crypto.ciphers.

"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import xxhash

from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.records import DirValue, children_digest

ROOT = ""
# Buckets per level and levels: 4,096 buckets hold 250 files each at a million files,
# so a one-file sync's answers stay small at any size; and a small repo's buckets hold
# one file each, which tells the store nothing either.
FANOUT = 64
LEVELS = 2
# Bucket names start with NUL, which no path holds: they never share a key with a file.
_BUCKET = "\0"
# A page (sync.crypto.pages) is a leaf named by its random key: NUL twice, then the key in hex
# (a bucket's NUL is followed by hex digits, never by a second NUL).
_PAGE = "\0\0"


def page_name(page_key: bytes) -> str:
    """The local tree's name of the page whose key is `page_key`."""
    return _PAGE + page_key.hex()


def page_key_of(name: str) -> bytes | None:
    """The key of the page named `name`; None for a file or a bucket."""
    return bytes.fromhex(name[len(_PAGE):]) if name.startswith(_PAGE) else None


def leaf_key(key: WorkspaceKey, name: str) -> bytes:
    """The server's key of node `name`: a page's own key, else the keyed name."""
    page = page_key_of(name)
    return page if page is not None else ciphers.node_key(key, name)


def leaf_value(key: WorkspaceKey, name: str, digest: bytes) -> bytes:
    """The server's value of node `name` (a page, a file or a bucket) whose local digest
    is `digest`."""
    page = page_key_of(name)
    return ciphers.page_value(key, page) if page is not None else \
        ciphers.node_value(key, name, digest)


def bucket_path(key: WorkspaceKey, path: str) -> list[str]:
    """The buckets above file or page `path`, root first: [ROOT, level 1, level 2]."""
    return buckets_of(leaf_key(key, path))


def buckets_of(file_key: bytes) -> list[str]:
    """`bucket_path` of the file whose node key is `file_key`."""
    out, name = [ROOT], _BUCKET
    for level in range(LEVELS):
        name += f"{file_key[level] % FANOUT:02x}"
        out.append(name)
    return out


def level_of(name: str) -> int:
    """0 for the root, 1.. for a bucket, LEVELS + 1 for a file."""
    if name == ROOT:
        return 0
    if name.startswith(_BUCKET) and not name.startswith(_PAGE):
        return (len(name) - len(_BUCKET)) // 2
    return LEVELS + 1


def deepest_first(dirs: Iterable[str]) -> list[str]:
    """Buckets bottom-up (each after its children), the root last."""
    return sorted(dirs, key=lambda d: (-level_of(d), d))


@dataclass
class LocalTree:
    """The repo as a tree of digests: files -> content digest, buckets -> digest of
    their children (see the module docstring)."""

    files: dict[str, bytes]
    dirs: dict[str, bytes] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    ancestors: dict[str, list[str]] = field(default_factory=dict)
    file_keys: set[bytes] = field(default_factory=set)  # the server's keys of `files`

    @classmethod
    def build(cls, files: dict[str, bytes], key: WorkspaceKey) -> LocalTree:
        children: dict[str, set[str]] = {}
        ancestors: dict[str, list[str]] = {}
        file_keys: set[bytes] = set()
        for path in files:
            # One HMAC per file per sync: it names the file and picks its buckets.
            file_key = leaf_key(key, path)
            file_keys.add(file_key)
            chain = ancestors[path] = buckets_of(file_key)
            for up, down in zip(chain, [*chain[1:], path], strict=True):
                children.setdefault(up, set()).add(down)
        tree = cls(files=files, children={d: sorted(c) for d, c in children.items()},
                   ancestors=ancestors, file_keys=file_keys)
        for d in deepest_first(tree.children):
            h = xxhash.xxh3_128()
            for child in tree.children[d]:
                is_dir = child in tree.children
                digest = tree.dirs[child] if is_dir else files[child]
                name = child.encode("utf-8", "surrogateescape")
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


def dir_values(tree: LocalTree, key: WorkspaceKey, dirs: Iterable[str]) -> list[DirValue]:
    """Server-side values of local directories, in the order given, each with the digest
    of the children it stands for (the store sets it only over those children)."""
    keys: dict[str, bytes] = {}

    def node_key(path: str) -> bytes:
        k = keys.get(path)
        if k is None:
            k = keys[path] = leaf_key(key, path)
        return k

    out = []
    for d in dirs:
        kids = [(node_key(c), leaf_value(key, c, tree.digest(c))) for c in tree.children[d]]
        out.append(DirValue(node_key(d), ciphers.node_value(key, d, tree.dirs[d]),
                            children_digest(kids)))
    return out


_BUCKET_NAMES: dict[bytes, dict[bytes, str]] = {}


def bucket_names(key: WorkspaceKey) -> dict[bytes, str]:
    """node key -> name of every bucket (4,160 of them): what a bucket the tree lacks
    is called, so that the diff can read it."""
    names = _BUCKET_NAMES.get(key.path_key)
    if names is None:
        all_names = [_BUCKET + f"{a:02x}" for a in range(FANOUT)]
        all_names += [n + f"{b:02x}" for n in list(all_names) for b in range(FANOUT)]
        names = {ciphers.node_key(key, n): n for n in all_names}
        if len(_BUCKET_NAMES) > 8:
            _BUCKET_NAMES.clear()
        _BUCKET_NAMES[key.path_key] = names
    return names
