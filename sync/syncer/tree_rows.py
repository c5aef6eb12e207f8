"""What a paged ref's tree (sync.crypto.pages) holds, read from the store and opened with the
key: its files' leaves and the live rows of its pages. The sync trusts its own page
index, which is right whenever the store's root is its tree's; `codeveil doctor` asks
the store itself, so a file whose leaf stands without all its rows (another checkout
of the ref moved their page meanwhile) is named whatever the local index believes."""

from __future__ import annotations

from dataclasses import dataclass, field

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import ROOT
from sync.crypto.pages import opened_rows
from sync.crypto.sealed_rows import RowSealer
from sync.errors import MetadataAuthError, MetadataFormatError

#: (start line, end line, chunk hash): a chunk as its sealed row names it.
Place = tuple[int, int, bytes]


@dataclass
class TreeRows:
    """A ref's tree as the store holds it."""

    leaves: dict[bytes, bytes] = field(default_factory=dict)  # file key -> leaf value
    pages: list[bytes] = field(default_factory=list)
    #: (file key, value) -> the chunks of that version a page of the tree holds a row of.
    rows: dict[tuple[bytes, bytes], set[Place]] = field(default_factory=dict)

    def gaps(self, key: WorkspaceKey, digests: dict[str, bytes],
             places: dict[str, set[Place]]) -> dict[str, int]:
        """path -> how many of its chunks (`places`) lack a row, for each file whose
        leaf in the tree is this checkout's version of it (`digests`)."""
        out: dict[str, int] = {}
        for path, digest in digests.items():
            file_key = ciphers.node_key(key, path)
            value = ciphers.node_value(key, path, digest)
            if self.leaves.get(file_key) != value:
                continue  # not this version in the tree: the next sync sends it
            lacking = places.get(path, set()) - self.rows.get((file_key, value), set())
            if lacking:
                out[path] = len(lacking)
        return out


def read_tree_rows(client: StoreClient, key: WorkspaceKey, sealer: RowSealer) -> TreeRows:
    """The client's ref's tree, one request per level, and every page's rows opened
    (a row that does not open is left out, as a lost one)."""
    out = TreeRows()
    root = client.root()
    frontier = [] if root is None else [ciphers.node_key(key, ROOT)]
    while frontier:
        answer = client.children(frontier)
        frontier = []
        for kids in answer.values():
            for node in kids:
                if node.is_dir:
                    frontier.append(node.key)
                elif node.value == ciphers.page_value(key, node.key):
                    out.pages.append(node.key)
                elif node.value is not None:
                    out.leaves[node.key] = node.value
    for page, rows in client.file_rows(out.pages).items():
        try:
            opened = opened_rows(sealer, key, page, rows)
        except (MetadataAuthError, MetadataFormatError):
            continue  # its rows count as missing
        for row in opened:
            out.rows.setdefault((row.file_key, row.value), set()).add(
                (row.meta.start_line, row.meta.end_line, row.meta.chunk_hash))
    return out
