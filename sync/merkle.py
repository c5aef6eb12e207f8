"""The client's Merkle tree of the repo, and the diff against the tree a store holds.

The tree the store sees does not follow the repo's directories: every file hangs under
two levels of buckets picked by its keyed file id (`node_key`, which the store never
links to a path), so the store learns how many files there are and nothing of where
they sit (how many files a directory has, how deep a file is). Locally, a leaf is a file
(its xxh3-128 content digest) and a bucket's digest is the xxh3-128 of its sorted
children's names, kinds and digests. What the server sees is keyed: node key =
HMAC(k_path, name), node value = HMAC(k_tree, name, digest); see sync.crypto.

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
# Buckets per level and levels: 4,096 buckets hold 250 files each at a million files,
# so a one-file sync's answers stay small at any size; and a small repo's buckets hold
# one file each, which tells the store nothing either.
FANOUT = 64
LEVELS = 2
# Bucket names start with NUL, which no path holds: they never share a key with a file.
_BUCKET = "\0"
# A page (sync.pages) is a leaf named by its random key: NUL twice, then the key in hex
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
    return page if page is not None else crypto.node_key(key, name)


def leaf_value(key: WorkspaceKey, name: str, digest: bytes) -> bytes:
    """The server's value of node `name` (a page, a file or a bucket) whose local digest
    is `digest`."""
    page = page_key_of(name)
    return crypto.page_value(key, page) if page is not None else \
        crypto.node_value(key, name, digest)


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


@dataclass
class Diff:
    """What a sync must do to make the store's tree equal the client's."""

    upload: list[str] = field(default_factory=list)  # file paths to (re)send
    delete: list[bytes] = field(default_factory=list)  # server node keys to remove
    dirs: list[str] = field(default_factory=list)  # directory values to set, deepest first
    requests: int = 0
    #: Leaves of the store's tree this client does not know that are pages of the
    #: workspace (sync.pages): another machine wrote them; read before anything is sent.
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
    if root is not None and root.value == crypto.node_value(key, ROOT, tree.dirs[ROOT]):
        return out
    touched_dirs: set[str] = set()
    # Paged: a bucket the tree lacks may hold pages another machine wrote; it is read
    # (a "probe") rather than deleted, and deleted whole only if it holds none.
    probes: dict[str, tuple[bytes, str]] = {}  # probe -> (its key, its parent)
    holds_foreign: set[str] = set()
    probe_deletes: dict[str, list[bytes]] = {}
    names = _bucket_names(key) if known_pages is not None else {}
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
                if d not in probes:
                    touched_dirs.add(d)
                local = {leaf_key(key, c): c for c in tree.children.get(d, ())}
                seen: set[str] = set()
                for node in answer.get(dir_key, []):
                    path = local.get(node.key)
                    if path is None:
                        if (known_pages is not None and not node.is_dir
                                and node.key not in known_pages
                                and node.value == crypto.page_value(key, node.key)):
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


_BUCKET_NAMES: dict[bytes, dict[bytes, str]] = {}


def _bucket_names(key: WorkspaceKey) -> dict[bytes, str]:
    """node key -> name of every bucket (4,160 of them): what a bucket the tree lacks
    is called, so that the diff can read it."""
    names = _BUCKET_NAMES.get(key.path_key)
    if names is None:
        all_names = [_BUCKET + f"{a:02x}" for a in range(FANOUT)]
        all_names += [n + f"{b:02x}" for n in list(all_names) for b in range(FANOUT)]
        names = {crypto.node_key(key, n): n for n in all_names}
        if len(_BUCKET_NAMES) > 8:
            _BUCKET_NAMES.clear()
        _BUCKET_NAMES[key.path_key] = names
    return names


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
        out.append(DirValue(node_key(d), crypto.node_value(key, d, tree.dirs[d]),
                            children_digest(kids)))
    return out
