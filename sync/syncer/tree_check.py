"""Whether the store's tree of this checkout's ref holds what this checkout last synced:
asked on demand (`codeveil status --server`, `codeveil doctor`), never by a read.

The tree this checkout left is rebuilt from its own state, as a sync builds it: each
indexed file's leaf, and in a sealed workspace the pages this machine knows to hold one
of their rows (sync.crypto.pages). The Merkle diff against the store (sync.crypto.merkle; a request
for the root, one per level below it where they differ) then names what disagrees:

- files whose leaf there is another version, or missing (another checkout synced the
  same ref, or a sync of this one was interrupted);
- pages holding this checkout's rows that the tree lacks;
- nodes this checkout never wrote (files or pages another checkout put there).

Files edited since the last index are not a disagreement: the next sync sends them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import RepoConfig, state_path
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import LocalTree, page_key_of, page_name
from sync.crypto.pages import PageIndex
from sync.syncer.diff import diff

__all__ = ["TreeCheck", "check_tree"]

#: Paths a disagreement names before "and N more".
SHOWN = 3


@dataclass(frozen=True)
class TreeCheck:
    """What the store's tree of this checkout's ref holds against this checkout."""

    ref: str | None  # the ref's name; None where the workspace keeps one tree
    files: list[str] = field(default_factory=list)  # indexed files it holds otherwise
    pages: int = 0  # pages of this checkout's rows it lacks
    foreign: int = 0  # nodes it holds that this checkout did not write

    @property
    def in_step(self) -> bool:
        return not (self.files or self.pages or self.foreign)

    def summary(self) -> str:
        """One line: `in step`, or what differs."""
        if self.in_step:
            return "in step with this checkout"
        parts = []
        if self.files:
            shown = ", ".join(self.files[:SHOWN])
            more = f" and {len(self.files) - SHOWN} more" if len(self.files) > SHOWN else ""
            parts.append(f"{len(self.files)} indexed files differ ({shown}{more})")
        if self.pages:
            parts.append(f"{self.pages} pages of this checkout's rows are missing")
        if self.foreign:
            parts.append(f"{self.foreign} nodes another checkout wrote")
        where = f"the tree of ref {self.ref}" if self.ref else "the store's tree"
        return f"{where} differs: " + "; ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {"ref": self.ref, "in_step": self.in_step, "summary": self.summary(),
                "files_differing": self.files,
                "pages_missing": self.pages, "foreign_nodes": self.foreign}


def check_tree(root: Path, config: RepoConfig, key: WorkspaceKey, client: StoreClient,
               ref: str | None) -> TreeCheck:
    """Compare the store's tree of `client`'s ref (called `ref`) with what the checkout
    at `root` last synced (asks the store; the module's doc)."""
    db = open_state_db(state_path(root))
    try:
        files = LocalChunks(db).file_digests()
        pages: set[bytes] = set()
        known: set[bytes] = set()
        if config.sealed:
            owners = {ciphers.node_key(key, p): ciphers.node_value(key, p, d)
                      for p, d in files.items()}
            index = PageIndex(db, read_only=True)
            counts, _holders = index.live(owners)
            pages = {p for p, n in counts.items() if n}
            known = index.known()
    finally:
        db.close()
    tree = LocalTree.build(files | {page_name(p): p for p in pages}, key)
    plan = diff(tree, client, key, known_pages=known if config.sealed else None)
    differing = sorted(p for p in plan.upload if page_key_of(p) is None)
    missing = sum(1 for p in plan.upload if page_key_of(p) is not None)
    return TreeCheck(ref=ref, files=differing, pages=missing,
                     foreign=len(plan.foreign_pages) + len(plan.delete))
