"""A sealed workspace's rows in a sync (sync.syncer.rows_out.RowsOut): in pages
(sync.crypto.pages) that name no file. Search runs on this machine, so every chunk read
here waits for its vectors here, and a file the store holds but this machine has no
vectors for (a teammate's clone, a new laptop) is *pulled*: the pages it does not know
are read and opened, and their vectors fill the embedding cache, so only what the
workspace lacks is embedded. What the tree holds, the pages read and linked before
anything is sent, the pages each apply writes and empties, and the tree the sync leaves
are this member's; `sync.syncer.syncer.Syncer` calls it at each step."""

from __future__ import annotations

import contextlib
import logging
import random
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from indexer.chunk import Chunk
from indexer.local_chunks import LocalChunks
from indexer.priority import embed_order
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import (
    ROOT,
    LocalTree,
    bucket_path,
    deepest_first,
    page_key_of,
    page_name,
)
from sync.crypto.pages import (
    BucketLoad,
    PagedWrite,
    PageIndex,
    PageRow,
    PageWriter,
    opened_rows,
    page_update,
)
from sync.crypto.sealed_rows import RowSealer
from sync.errors import MetadataAuthError, MetadataFormatError
from sync.records import FileUpdate, NodeInfo
from sync.syncer.diff import Diff, diff
from sync.syncer.pool_sync import leaf_update, pull_rows
from sync.syncer.ref_watch import RefWatch
from sync.syncer.rows_out import CachedVectors, Lacking, SyncPlan, chunk_meta

log = logging.getLogger(__name__)
_random = random.SystemRandom()

PULL_PAGES = 512  # pages per request when reading them
PULL_FILES = 512  # files per request when pulling the rows no page holds


def matched(vectors: dict[tuple[bytes, str], np.ndarray],
            chunks: list[tuple[bytes, Chunk]]) -> list[tuple[bytes, np.ndarray]]:
    """(cache key, vector) of each of `chunks` ((cache key, chunk)) that `vectors`, by
    chunk hash and symbol, holds one for."""
    return [(k, vectors[c.chunk_hash, c.symbol]) for k, c in chunks
            if (c.chunk_hash, c.symbol) in vectors]


class PagedSync:
    """The rows of a sync of a sealed workspace: its pages."""

    searched_here = True

    def __init__(self, key: WorkspaceKey, workspace_id: str, dim: int, *, pool: bool,
                 shared: bool) -> None:
        """`pool`: the store keeps a blob pool (sync.store.embedded.pool), so files any
        ref sent are linked, not sent, and pulled by content. `shared`: the store is a
        server teammates pull from, so rows are sent as each batch is embedded: a
        teammate pulls what the first machine has embedded so far instead of waiting
        for all of it."""
        self.key = key
        self.sealer = RowSealer(key, workspace_id, dim)
        self.pool = pool
        self.streams = shared
        self._client: StoreClient | None = None
        self._index: PageIndex | None = None
        #: The vectors of rows the page index keeps none of (this machine's embedding
        #: cache holds them), for the rows a write moves.
        self.vectors: CachedVectors | None = None
        self._writer: PageWriter | None = None
        self._load: BucketLoad | None = None
        self._pending: PagedWrite | None = None
        self._touched: set[bytes] = set()
        self._covered: set[bytes] = set()
        self._upload: set[str] = set()
        self._keys: dict[str, bytes] = {}  # path -> file key, of the files diffed
        self._owners: dict[bytes, bytes] = {}  # file key -> the value this sync leaves

    def attach(self, db: sqlite3.Connection, vectors: CachedVectors) -> None:
        self._index = PageIndex(db)
        self.vectors = vectors

    @property
    def index(self) -> PageIndex:
        assert self._index is not None, "attach first"
        return self._index

    @property
    def client(self) -> StoreClient:
        assert self._client is not None, "plan first"
        return self._client

    # -- what this machine keeps: every chunk's vectors and headers -------------------

    def waits(self, uploaded: bool) -> bool:
        return True  # "pending" means "no vectors on this machine yet"

    def pulls(self, uploaded: bool, relayout: bool) -> bool:
        # In a relayout every file is pulled before it is sent: its rows in the old
        # layout fill the cache of a machine that lacks its vectors, instead of the model.
        return relayout or not uploaded

    def headers(self, chunks: Iterable[Chunk]) -> list[str]:
        # The second vector of every chunk searched here: a few word pieces each, so
        # about a tenth of a chunk's cost, and shared along a file.
        return list(dict.fromkeys(c.header for c in chunks))

    def order(self, todo: set[str], upload: set[str], root: Path, *,
              relayout: bool) -> list[str]:
        """On this machine's own store: the files to pull first in a random order (their
        rows are asked for in it) and the rest in priority order (`embed_order`), whose
        rows are sent in a random one once all are embedded. On a shared server
        (`streams`: a teammate pulls the rows sent so far while this machine still
        embeds) and in a relayout every file goes in a random order: the vectors here
        then land in that order too, and the words and names answer meanwhile. Only
        what is embedded here is put in priority order: ordering a joining teammate's
        169k files to pull, then shuffling them, took 2 s of the time before the first
        answer."""
        if relayout or self.streams:
            return _random.sample(sorted(todo), len(todo))
        pulls = sorted(todo - upload)
        return _random.sample(pulls, len(pulls)) + embed_order(todo & upload, root)

    def left_pending(self, pending: set[str], upload: set[str]) -> tuple[set[str], set[str]]:
        # Search runs here: a pending file (its vectors not yet here, say a crash cut a
        # pull short) is done again; the cache makes that cheap.
        return pending, set()

    def embedded_here(self, paths: list[str]) -> list[str]:
        return paths

    # -- the plan ---------------------------------------------------------------------

    def plan(self, client: StoreClient, files: dict[str, bytes], local: LocalChunks,
             local_digests: dict[str, bytes], *, fresh: bool, keep: bool,
             meanwhile: Callable[[], contextlib.AbstractContextManager[None]]) -> SyncPlan:
        """The diff reads every page the store holds that this machine does not know
        before anything is sent: a machine that has not chunked the tree yet (a
        teammate's join) chunks it `meanwhile`, so its words answer at once."""
        self._client = client
        self._pending, self._touched = None, set()
        with meanwhile():
            tree, plan, covered = self.diff(files, fresh=fresh, keep=keep)
        local_digests = local.file_digests()
        places = local.places()
        # Rows count per chunk: a file some of whose rows went (another checkout of
        # this ref moved their page without them) is sent, not linked.
        incomplete = self.incomplete(files, local_digests, places)
        covered -= incomplete
        resend = self.resend(files, local_digests, places, incomplete)
        return SyncPlan(tree, plan, covered, resend, local_digests)

    # -- before anything is sent --------------------------------------------------------

    def diff(self, files: dict[str, bytes], *, fresh: bool = False, keep: bool = False
             ) -> tuple[LocalTree, Diff, set[str]]:
        """The diff of a paged workspace: the tree holds the files and the pages this
        machine knows to hold a live row; pages another machine wrote are read first
        (their rows into the page index), and pages this ref's tree lacks are linked
        from the pool (or forgotten), then the diff runs again. Before a file whose rows
        no known page holds is embedded, the pages other refs wrote since this checkout
        last looked are read (sync.syncer.ref_watch), so those holding its rows are linked and
        pulled, not embedded and sent again.

        Returns the tree, the diff (files only), and the changed files whose rows a page
        of the tree holds (only their leaf is sent). `fresh` (a re-upload): the tree
        holds no page, so every page the store holds goes. `keep` (a pass after another
        writer of this ref was met): this sync deletes no page and links no file; every
        page it knows stays in the tree (`PageWriter`), and every changed file is sent
        with its rows, so nothing it writes rests on a page the other writer may be
        deleting, and nothing it deletes held a row the other's tree names."""
        key = self.key
        self._keys = keys = {p: ciphers.node_key(key, p) for p in files}
        self._owners = owners = {keys[p]: ciphers.node_value(key, p, d)
                                 for p, d in files.items()}
        other_refs = self.pool and not fresh
        for attempt in range(3):
            writer = PageWriter(key, self.sealer, self.index, owners, fresh=fresh,
                                keep=keep, vectors=self.vectors)
            live = writer.live_pages()
            tree = LocalTree.build(files | {page_name(p): p for p in live}, key)
            plan = diff(tree, self.client, key, known_pages=self.index.known())
            absent = [k for k in map(page_key_of, plan.upload) if k is not None]
            if other_refs:
                other_refs = False
                have = writer.covered()
                lacking = {k: owners[k] for k in (ciphers.node_key(key, p) for p in plan.upload
                                                  if page_key_of(p) is None)
                           if k not in have}
                # Before anything is embedded: a file version another ref sent is
                # pulled from its pages, not embedded and sent again.
                if lacking and self._read_other_refs(lacking):
                    continue
            if attempt == 2 or not (plan.foreign_pages or absent):
                break
            self._read(plan.foreign_pages)
            self._link(absent)
        plan.upload = [p for p in plan.upload if page_key_of(p) is None]
        # Pages of no live row stay out of the tree, and the diff deletes them.
        self.index.drop(self.index.known() - live)
        self._writer = writer
        self._load = BucketLoad(tree, key)
        self._covered = covered = writer.covered()
        self._upload = upload = set(plan.upload)
        linked = set() if keep else {p for p in upload if ciphers.node_key(key, p) in covered}
        return tree, plan, linked

    def resend(self, files: dict[str, bytes], local_digests: dict[str, bytes],
               places: dict[str, set[tuple[int, int, bytes]]], incomplete: set[str]
               ) -> set[str]:
        """After `diff`: the files whose leaf matches but whose rows no page holds (sent
        again: `_Pending.resend`), of those that have a chunk here (`places`) or are
        not chunked at their version (`local_digests`) yet; and those chunked here at
        their version some chunk of which no page holds a row of (`incomplete`)."""
        return {p for p, d in files.items()
                if p not in self._upload and self._keys[p] not in self._covered
                and (local_digests.get(p) != d or p in places)
                } | (incomplete - self._upload)

    def incomplete(self, files: dict[str, bytes], local_digests: dict[str, bytes],
                   places: dict[str, set[tuple[int, int, bytes]]]) -> set[str]:
        """After `diff`, of the same `files`: those chunked here at their version
        (`local_digests`; `places`: each one's chunks) some chunk of which no page of
        the tree holds a row of (another checkout syncing this ref moved or deleted the
        page that held it: its own tree had another version of the file). Their rows
        are sent again, whatever the leaf says: a row counts per chunk, never per file.
        A local check: no request."""
        chunked = {p: k for p, k in self._keys.items()
                   if local_digests.get(p) == files[p] and places.get(p)}
        held = self.index.live_places({k: self._owners[k] for k in chunked.values()})
        return {p for p, k in chunked.items() if not places[p] <= held.get(k, set())}

    def complete(self, path: str, digest: bytes, chunks: Sequence[Chunk]) -> bool:
        """Whether a page of the tree holds a row of every one of `chunks` (of `path` at
        `digest`): a file whose rows are there is linked (its leaf alone is sent)."""
        have = {(r.meta.start_line, r.meta.end_line, r.meta.chunk_hash)
                for r in self.index.rows_of(ciphers.node_key(self.key, path),
                                            ciphers.node_value(self.key, path, digest))}
        return all((c.start_line, c.end_line, c.chunk_hash) in have for c in chunks)

    def _read_other_refs(self, wanted: dict[bytes, bytes]) -> bool:
        """Read into the page index the pages other refs wrote since this checkout last
        looked, and those seen before that hold a version of `wanted` (file key -> leaf
        value): sync.syncer.ref_watch. True if any was read."""
        return RefWatch(self.index.db).look(self.client, self.key, self.index.known(),
                                            wanted, self._read)

    def _read(self, pages: list[bytes]) -> dict[bytes, list[PageRow]]:
        """Read pages another machine wrote, in a random order, into the page index;
        returns those read (a page that does not open under the key is left out)."""
        pages = _random.sample(pages, len(pages))
        out: dict[bytes, list[PageRow]] = {}
        for start in range(0, len(pages), PULL_PAGES):
            read = {}
            for page, rows in self.client.file_rows(pages[start : start + PULL_PAGES]).items():
                try:
                    read[page] = opened_rows(self.sealer, self.key, page, rows)
                except (MetadataAuthError, MetadataFormatError) as exc:
                    log.warning("ignoring a page the store returned: %s", exc)
            self.index.add(read)
            out.update(read)
        return out

    def _link(self, pages: list[bytes]) -> None:
        """Point this ref's tree at pages the pool holds (another ref wrote them);
        those it lacks are forgotten, and their files' rows are sent again."""
        missing = set(pages)
        if self.pool:
            missing = set(self.client.apply(
                [page_update(self.key, p, link=True) for p in pages], []))
        self.index.drop(missing)

    # -- what is sent -------------------------------------------------------------------

    def leaf(self, path: str, digest: bytes) -> FileUpdate:
        """A file's leaf, which holds no row (its rows are in pages)."""
        return leaf_update(self.key, path, digest)

    def updates(self, sending: Sequence[tuple[str, bytes, list[Chunk]]],
                vectors: np.ndarray) -> list[FileUpdate]:
        """The leaves of `sending` ((path, digest, chunks), the chunks' vectors in
        order) and the pages that hold their rows; the next `deletes` and `applied`
        belong to the apply that sends them."""
        assert self._writer is not None, "diff first"
        rows: list[PageRow] = []
        for path, digest, chunks in sending:
            file_key = ciphers.node_key(self.key, path)
            value = ciphers.node_value(self.key, path, digest)
            rows += [PageRow(file_key, value, chunk_meta(path, c), vectors[len(rows) + i])
                     for i, c in enumerate(chunks)]
        write = self._writer.write(rows)
        self._pending = write if write.written or write.deletes else None
        return write.updates + [self.leaf(path, digest) for path, digest, _ in sending]

    def compact(self) -> list[FileUpdate]:
        """The pages that compact the store where deleted files' rows left it sparse
        ([] where it is not); the next `deletes` and `applied` belong to their apply."""
        assert self._writer is not None, "diff first"
        write = self._writer.compact()
        self._pending = write if write.written else None
        return write.updates

    def deletes(self, deletes: list[bytes]) -> list[bytes]:
        """`deletes` and the pages the pending write empties, each with the buckets it
        leaves empty (a bucket with no child would make the next root differ)."""
        write, load = self._pending, self._load
        if write is None or load is None:
            return deletes
        for page in write.written:
            load.add(page)
        buckets = {b for b in (load.remove(p) for p in write.deletes) if b is not None}
        return [*deletes, *buckets, *(
            p for p in write.deletes
            if not buckets & {ciphers.node_key(self.key, b)
                              for b in bucket_path(self.key, page_name(p))})]

    def applied(self) -> None:
        """The store took the pending write: the page index records it."""
        write, self._pending = self._pending, None
        if write is not None:
            self.index.add(write.written, vectors=False)  # the cache holds them
            self.index.drop(write.deletes)
            self.index.forget_copies(write.copied)
            self._touched |= set(write.written) | set(write.deletes)

    def pull(self, wanted: Lacking, digests: dict[bytes, tuple[str, bytes]]
             ) -> list[tuple[bytes, np.ndarray]]:
        """The rows of the pages this machine knows, read in the diff (`fill`); only a
        file no page holds (a workspace written before pages) is asked for, with a
        pool by content: whichever ref sent this version of the file."""
        filled = self.fill(wanted, digests)
        got = {k for k, _ in filled}
        wanted = {fk: (path, [(k, c) for k, c in kc if k not in got])
                  for fk, (path, kc) in wanted.items()}
        if not any(lacking for _, lacking in wanted.values()):
            return filled  # the cache and the pages have it all: no request
        file_keys = list(wanted)
        for start in range(0, len(file_keys), PULL_FILES):
            part = file_keys[start : start + PULL_FILES]
            answer = (pull_rows(self.client, self.key, {k: digests[k] for k in part})
                      if self.pool else self.client.file_rows(part))
            for file_key, rows in answer.items():
                if file_key in wanted:
                    filled.extend(self._open_rows(file_key, rows, *wanted[file_key]))
        return filled

    def _open_rows(self, file_key: bytes, rows: list[tuple[bytes, bytes]], path: str,
                   chunks: list[tuple[bytes, Chunk]]) -> list[tuple[bytes, np.ndarray]]:
        """(cache key, vector) for each local chunk a row of `path` holds the vector of.

        A row that does not open, or opens to another file's chunk, is a store that
        returned something it was not given: it is reported and its chunk embedded here."""
        by_chunk: dict[tuple[bytes, str], np.ndarray] = {}
        for row_id, blob in rows:
            try:
                opened = self.sealer.open(row_id, file_key, blob)
            except (MetadataAuthError, MetadataFormatError) as exc:
                log.warning("ignoring a row of %s the store returned: %s", path, exc)
                continue
            if opened is None:
                continue  # a padding row
            if opened.meta.path != path:
                log.warning("ignoring a row the store returned for %s: it belongs to %s",
                            path, opened.meta.path)
                continue
            by_chunk[(opened.meta.chunk_hash, opened.meta.symbol)] = opened.vector
        return matched(by_chunk, chunks)

    def fill(self, wanted: dict[bytes, tuple[str, list[tuple[bytes, Chunk]]]],
             digests: dict[bytes, tuple[str, bytes]]) -> list[tuple[bytes, np.ndarray]]:
        """(cache key, vector) of each lacking chunk of `wanted` (file key -> (path,
        [(cache key, chunk)])) that the page index holds a row of, for the version
        being read (`digests`: file key -> (path, digest))."""
        out: list[tuple[bytes, np.ndarray]] = []
        for file_key, (path, lacking) in wanted.items():
            if not lacking:
                continue
            rows = self.index.rows_of(file_key,
                                      ciphers.node_value(self.key, path, digests[file_key][1]))
            out += matched({(r.meta.chunk_hash, r.meta.symbol): r.vector for r in rows
                            if r.meta.path == path and r.vector is not None}, lacking)
        return out

    def consumed(self, versions: Iterable[tuple[str, bytes]]) -> None:
        """The cache holds the vectors of these (path, digest) versions now: the page
        index keeps no copy."""
        self.index.forget_vectors((ciphers.node_key(self.key, path),
                                   ciphers.node_value(self.key, path, digest))
                                  for path, digest in versions)

    # -- after ------------------------------------------------------------------------

    def final_tree(self, tree: LocalTree, files: dict[str, bytes], dirs: list[str]
                   ) -> tuple[LocalTree, list[str]]:
        """The tree as the sync left it (the pages it wrote in, those it emptied out),
        and the directories to set: the diff's, and those above the pages it touched."""
        assert self._writer is not None, "diff first"
        live = self._writer.live_pages()
        tree = LocalTree.build(files | {page_name(p): p for p in live}, self.key)
        above = {b for p in self._touched for b in bucket_path(self.key, page_name(p))}
        return tree, deepest_first((set(dirs) | above) & tree.children.keys())

    def settled(self, root: NodeInfo | None, tree: LocalTree) -> bool:
        # An older server names no root, and a tree of no files has none.
        return (root is None or not tree.files
                or root.value == ciphers.node_value(self.key, ROOT, tree.dirs[ROOT]))
