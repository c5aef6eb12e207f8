"""What the privacy benchmarks share (bench/privacy.py, bench/privacy_pages.py): the
set-up of one run, the shape a store shows without a key, the public files an attacker
knows, and the counting of a tree's shape both sides can do."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Setup:
    repo: Path
    store_dir: Path
    workspace_id: str
    key: object  # sync.crypto.keys.WorkspaceKey
    canaries: list[str]
    public_prefix: str
    duplicate: tuple[str, str]  # (public file, its private copy)
    private: str  # the private module's path
    sealed: bool
    dim: int
    private_test: str = ""  # a private test beside the copied file's original, if any


@dataclass
class StoredShape:
    """What a sealed store's data dir shows without a key: the tree's nodes (key, parent,
    is_dir), each file's rows as (rid, envelope length), and every node's depth."""

    parent: dict[bytes, bytes | None]
    is_dir: dict[bytes, bool]
    rows: dict[bytes, list[tuple[int, int]]]  # file key -> [(rid, length)], rid order


def stored_node(stored: bytes) -> bytes:
    """A node key as stored, less the ref id in front of it (sync.store.embedded.pool:
    every ref's tree shares the table; these stores hold one ref)."""
    from sync.records import KEY_BYTES

    return bytes(stored[-KEY_BYTES:])


@dataclass
class PublicFile:
    path: str
    lengths: list[int]  # the envelope length of each chunk, in chunk order
    chunks: list[tuple[bytes, int]]  # (chunk hash, start line) of each, for the truth


def public_shape(paths: list[str]) -> tuple[dict[str, str | None], dict[str, bool]]:
    parent: dict[str, str | None] = {"": None}
    is_dir: dict[str, bool] = {"": True}
    for path in paths:
        is_dir[path] = False
        child = path
        while child:
            up = child.rpartition("/")[0]
            parent[child] = up
            if up in is_dir:
                break
            is_dir[up] = True
            child = up
    return parent, is_dir


def depths(parent: dict) -> dict:
    out: dict = {}

    def depth(node: object) -> int:
        if node not in out:
            up = parent[node]
            out[node] = 0 if up is None else depth(up) + 1
        return out[node]

    for node in parent:
        depth(node)
    return out


def ancestor_shapes(parent: dict, is_dir: dict) -> dict:
    """node -> the (files, directories) counts of each directory above it, root first:
    what a directory listing of the public tree and of the store both give."""
    counts: dict = defaultdict(lambda: [0, 0])
    for node, up in parent.items():
        if up is not None:
            counts[up][0 if not is_dir[node] else 1] += 1
    out: dict = {}
    for node in parent:
        chain, up = [], parent[node]
        while up is not None:
            chain.append(tuple(counts[up]))
            up = parent[up]
        out[node] = tuple(reversed(chain))
    return out


def narrow_one_to_one(cands: dict[bytes, set[str]]) -> None:
    """Take a file that is the only candidate left for some stored file off the other
    stored files' lists, until nothing changes (in place)."""
    changed = True
    while changed:
        changed = False
        taken = {next(iter(c)): s for s, c in cands.items() if len(c) == 1}
        for s, c in cands.items():
            if len(c) > 1 and c & taken.keys():
                c -= {p for p in c if taken[p] != s}
                changed = True
