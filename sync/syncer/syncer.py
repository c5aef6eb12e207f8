"""One sync: walk the repo, find what changed, and make the store match it.

Steps: walk (stat only) -> hash files whose stat changed -> local Merkle tree ->
diff against the store's tree -> for each changed file: chunk, embed (cache), encrypt,
send in batches -> set directory values. Deleted files go in the first batch.

The workspace's mode (sync.records) is one member, its rows (sync.syncer.rows_out): in
a sealed workspace pages that name no file, search on this machine and the pull of what
the store holds (sync.syncer.paged_sync.PagedSync); in a server-search one rows whose
encrypted vectors the server ranks (sync.syncer.search_rows.SearchRows). The Syncer
calls its hooks at each step and asks nothing of the mode. In both, row ids are random
and fresh on every send.

Searchable while it builds: a thread chunks every changed file ahead of the model and
writes its chunks to the local chunk table at once, marked pending (the lexical index
and the path/symbol evidence read that table), while the model embeds them in
`indexer.priority` order (source first, recently changed first); a file stops being
pending when the store holds its vectors. A search meanwhile answers from what is
there and says how many chunks have vectors (`LocalChunks.coverage`).

Write order, client side: a file's leaf value is sent with its chunks in one `apply`;
directory values are sent only after every file below them landed. If anything moved
under our feet (a file changed while we read it), directory values are left pending so
the next sync descends again: the tree never claims a state the store does not hold.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.chunk import Chunk
from indexer.dir_handles import DirHandles, handles_for
from indexer.embed_cache import CachedEmbedder, cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.priority import embed_order
from indexer.statcache import StatCache, scan
from indexer.walk import Skipped, SourceFile, read_source, walk_repo
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.crypto.merkle import deepest_first, dir_values
from sync.crypto.pages import PageRow
from sync.records import FileUpdate
from sync.syncer.diff import Diff
from sync.syncer.progress import Progress
from sync.syncer.rows_out import RowsOut
from sync.syncer.sync_report import SyncReport
from sync.wire import LIMITS

log = logging.getLogger(__name__)
_random = random.SystemRandom()

# Upload batches: big enough to keep the model busy, small enough to bound a request.
BATCH_CHUNKS = 512
# The first batches are smaller, doubling up to BATCH_CHUNKS: during a first index the
# first vectors reach the store (and searches) seconds after the model starts.
FIRST_BATCH_CHUNKS = 64
BATCH_FILES = 256
DELETE_BATCH = 2048
DIRS_BATCH = 50_000  # directory values per request (the server accepts 100,000)
# Passes of a paged sync while another checkout of its ref writes between its diff and
# its directory values (each pass diffs the store as it is then).
PASSES = 4
PASS_PAUSE_S = 0.05
WRITE_FILES = 64  # files per local write while chunking ahead of the model
WORDS_FIRST_FILES = 256  # files not chunked here from which a paged sync chunks first


@dataclass
class _Pulled:
    """What a pull did for a batch: chunks it filled from the workspace's rows, chunks
    the cache already had, and the texts of those still lacking a vector."""

    filled: int
    cached: int
    lacking: list[str]


@dataclass
class _Pending:
    path: str
    digest: bytes
    chunks: int  # how many; the chunks themselves wait in the local chunk table
    upload: bool
    # The store holds this file but this machine needs its vectors (`RowsOut.pulls`).
    pull: bool = False
    # The store holds this version's rows (another ref sent it): the tree links to it.
    link: bool = False
    # The store's leaf matches but none of its rows is there (a workspace written
    # before pages, or a page lost): pulled, then sent again.
    resend: bool = False


class Syncer:
    """Brings the store's copy of one repo in line with the working tree."""

    def __init__(
        self,
        root: Path,
        state_path: Path,
        client: StoreClient | None,
        key: WorkspaceKey,
        workspace_id: str,
        embedder: CachedEmbedder,
        rows: RowsOut,
        *,
        progress: Progress | None = None,
        max_file_bytes: int = 1_000_000,
    ) -> None:
        """`rows`: the workspace's rows, as its mode sends them (sync.syncer.rows_out).
        `client` may be None for `run_local`, which never reaches the store."""
        self.root = root
        self._client = client
        self.key = key
        self.workspace_id = workspace_id
        self.embedder = embedder
        self.rows = rows
        self._db = open_state_db(state_path)
        rows.attach(self._db, self._cached_vectors)
        self.progress = progress or Progress()
        self.max_file_bytes = max_file_bytes
        self._state_path = state_path
        self.stat_cache = StatCache(state_path)
        self.local = LocalChunks(self._db)

    def close(self) -> None:
        self.stat_cache.close()
        self._db.close()

    @property
    def client(self) -> StoreClient:
        if self._client is None:
            raise RuntimeError("this Syncer was made without a store client (run_local only)")
        return self._client

    # -- scan -----------------------------------------------------------------------

    def scan(self, report: SyncReport) -> dict[str, bytes]:
        """path -> content digest of every indexable file, reading only stat-changed ones."""
        t0 = time.perf_counter()
        # A file deeper than the store's limit on ancestors is skipped, not sent.
        walked = walk_repo(self.root, max_file_bytes=self.max_file_bytes,
                           max_depth=LIMITS.max_depth - 1)
        self.progress.scanned(len(walked.files))
        with handles_for(self.root) as dirs:
            result = scan(self.root, walked, self.stat_cache,
                          read=lambda root, path: self._read(root, path, dirs))
        report.skipped.extend((s.path, s.describe()) for s in result.skipped)
        report.files_scanned = len(walked.files)
        report.files_skipped = len(result.skipped)
        report.seconds_walk = time.perf_counter() - t0
        return result.digests

    def _read(self, root: Path, path: str, dirs: DirHandles | None) -> SourceFile | Skipped:
        return read_source(root, path, max_file_bytes=self.max_file_bytes, dirs=dirs)

    # -- the local pass: what needs no store ----------------------------------------

    def run_local(self, *, embed: bool) -> SyncReport:
        """Bring this machine's chunk table in line with the folder without the store.

        Every file whose content changed is read and chunked into the local chunk table,
        marked pending, and deleted files leave it: the words, names and structure are
        searchable at once. `codeveil index` returns after this (`embed=False`) and
        leaves the model's work to the builder. With `embed` (the server is unreachable)
        the pending files are also embedded into the cache; where search runs here they
        then stop being pending (`RowsOut.embedded_here`), since there "pending" means
        "no vectors on this machine". What the store lacks is not recorded apart: the
        next sync's Merkle diff finds exactly that and sends it."""
        started = time.perf_counter()
        report = SyncReport()
        files = self.scan(report)
        local_digests = self.local.file_digests()
        stale = {p for p, d in files.items() if local_digests.get(p) != d}
        gone = [p for p in local_digests if p not in files]
        report.files_changed = len(stale)
        report.files_deleted = len(gone)
        self.local.remove_files(gone)
        if embed:
            stale |= self.local.pending_files() & files.keys()
        todo = embed_order(stale, self.root) if embed else sorted(stale)
        self.progress.planned(len(todo), 0)
        moved = threading.Event()  # nothing is sent: a file that moves is read next time
        for batch in self._batches(todo, set(todo), files, moved, report):
            if embed:
                self._embed_here(batch, report)
            else:
                self.progress.files_done(len(batch))
        report._rate()
        report.chunks_total = self.local.count()
        report.seconds = time.perf_counter() - started
        return report

    @contextlib.contextmanager
    def _words_first(self, files: dict[str, bytes], local_digests: dict[str, bytes],
                     report: SyncReport) -> Iterator[None]:
        """While the body runs, a thread chunks the files this machine has not chunked
        at their content (when there are WORDS_FIRST_FILES or more) into the local chunk
        table, pending; an error there is raised once the body is done."""
        unknown = sorted(p for p, d in files.items() if local_digests.get(p) != d)
        if len(unknown) < WORDS_FIRST_FILES:
            yield
            return
        failed: list[BaseException] = []

        def chunk() -> None:
            try:
                for _ in self._batches(unknown, set(unknown), files, threading.Event(),
                                       report):
                    pass
            except BaseException as exc:  # raised in the sync's own thread below
                failed.append(exc)

        worker = threading.Thread(target=chunk, name="codeveil-words", daemon=True)
        worker.start()
        try:
            yield
        finally:
            worker.join()
        if failed:
            raise failed[0]

    def _embed_here(self, batch: list[_Pending], report: SyncReport) -> None:
        """Embed one batch into the cache, sending nothing (`run_local`)."""
        chunks = [(p, self.local.for_file(p.path)) for p in batch]
        t0 = time.perf_counter()
        result = self.embedder.embed([c.embed_text for _, cs in chunks for c in cs],
                                     progress=self.progress.chunks_done)
        report.chunks_embedded += result.embedded
        report.chunks_from_cache += result.from_cache
        headers = self.rows.headers(c for _, cs in chunks for c in cs)
        if headers:
            report.headers_embedded += self.embedder.embed(headers).embedded
        self.local.mark_stored(self.rows.embedded_here([p.path for p in batch]))
        report.seconds_embed += time.perf_counter() - t0
        report._rate()
        self.progress.files_done(len(batch))
        self.progress.stages(report.stages(), report.embed_chunks_per_s)

    # -- the sync -------------------------------------------------------------------

    def run(self, *, reupload: bool = False) -> SyncReport:
        """One sync. `reupload` sends every file and directory value again, whatever the
        store's tree claims (a store that lost rows it still has leaves for)."""
        started = time.perf_counter()
        report = SyncReport()
        before = (self.client.stats.requests, self.client.stats.bytes_sent,
                  self.client.stats.bytes_received)
        files = self.scan(report)
        for attempt in range(PASSES):
            if self._pass(files, report, reupload=reupload, keep=attempt > 0):
                break
            # Paged: another checkout syncing this ref wrote between this pass's diff and
            # its directory values (a value was refused, or the root moved on after):
            # pages it moved or deleted may have held rows of this tree. The next pass
            # diffs the store as it is now and sends what it lacks, deleting no page and
            # linking no file (`PagedSync.diff`'s `keep`): whatever the other writer
            # does meanwhile, no leaf this pass sets rests on a page it deletes.
            log.info("another writer of this ref synced meanwhile; syncing again")
            reupload = False
            # A random pause, longer each time: two checkouts that keep overwriting
            # each other's files stop passing in step, and one finishes first.
            time.sleep(_random.uniform(0, PASS_PAUSE_S * (attempt + 1)))
        else:
            log.warning("another writer of this ref kept syncing: %d passes, the next"
                        " sync sends what the store lacks", PASSES)
        report._rate()
        report.chunks_total = self.local.count()
        stats = self.client.stats
        report.requests = stats.requests - before[0]
        report.bytes_sent = stats.bytes_sent - before[1]
        report.bytes_received = stats.bytes_received - before[2]
        report.seconds = time.perf_counter() - started
        return report

    def _pass(self, files: dict[str, bytes], report: SyncReport, *, reupload: bool,
              keep: bool = False) -> bool:
        """Diff, send, set the directory values. False where another writer of this ref
        synced meanwhile (`RowsOut.settled`). `keep`: see `RowsOut.plan`."""
        local_digests = self.local.file_digests()
        t0 = time.perf_counter()
        planned = self.rows.plan(
            self.client, files, self.local, local_digests, fresh=reupload, keep=keep,
            meanwhile=lambda: self._words_first(files, local_digests, report))
        tree, plan, resend = planned.tree, planned.diff, planned.resend
        local_digests = planned.local_digests
        if reupload:
            plan.upload = sorted(files)
            plan.dirs = deepest_first(tree.children)
            resend = set()
        report.seconds_sync += time.perf_counter() - t0

        stale_local = [p for p, d in files.items() if local_digests.get(p) != d]
        gone_local = [p for p in local_digests if p not in files]
        upload = set(plan.upload)
        report.files_changed = len(upload)
        # A changed file whose rows the store holds (another ref wrote them) gets its
        # leaf and no row.
        linked = planned.linked
        report.files_linked = len(linked)
        report.files_deleted = len(gone_local)
        self.local.remove_files(gone_local)
        redo, stored = self.rows.left_pending(self.local.pending_files(), upload)
        stale_local.extend(sorted(redo & files.keys()))
        self.local.mark_stored(stored)
        # Linked files this machine has as they are need no reading: only their links.
        links_only = sorted(linked - set(stale_local))
        upload -= linked
        todo = self.rows.order(upload | (linked - set(links_only)) | set(stale_local) | resend,
                               upload, self.root, relayout=plan.relayout)
        self.progress.planned(len(todo), 0)

        complete = self._send(todo, upload, files, plan, report, linked, resend)
        for start in range(0, len(links_only), BATCH_FILES):
            self._apply([self._link(p, files[p])
                         for p in links_only[start : start + BATCH_FILES]], [])
        if complete and self.rows.searched_here:
            self._embed_missing_headers(report)
        compacted = self.rows.compact() if complete else []
        if compacted:
            self._apply(compacted, [])
        tree, dirs = self.rows.final_tree(tree, files, plan.dirs)
        if not (complete and (dirs or plan.delete)):
            return True
        t0 = time.perf_counter()
        values = dir_values(tree, self.key, dirs)
        root = None
        for start in range(0, len(values), DIRS_BATCH):
            root = self.client.set_dir_values(values[start : start + DIRS_BATCH])
        report.seconds_sync += time.perf_counter() - t0
        return self.rows.settled(root, tree)

    def _send(
        self,
        todo: Sequence[str],
        upload: set[str],
        files: dict[str, bytes],
        plan: Diff,
        report: SyncReport,
        linked: set[str] | None = None,
        resend: set[str] | None = None,
    ) -> bool:
        """Chunk, embed and send `todo` in batches. False if a file moved under us.

        Reading and chunking run in a thread ahead of the model (which releases the GIL
        while it computes), so the model never waits for the disk or the parser.
        """
        moved = threading.Event()
        stop = threading.Event()
        # Unbounded: the chunker runs ahead over every file (that is what makes them
        # searchable early), and the batches it queues are small (paths and counts).
        batches: queue.Queue[list[_Pending] | BaseException | None] = queue.Queue()

        def put(item: list[_Pending] | BaseException | None) -> None:
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def produce() -> None:
            try:
                for batch in self._batches(todo, upload, files, moved, report,
                                           relayout=plan.relayout, linked=linked or set(),
                                           resend=resend or set()):
                    put(batch)
                    if stop.is_set():  # the consumer failed: stop chunking at once
                        return
                put(None)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                put(exc)

        producer = threading.Thread(target=produce, name="codeveil-chunker", daemon=True)
        producer.start()
        # Deletes go with the first batch; in a relayout after the last, so that the old
        # directories hold no file of ours any more when they go (sync.crypto.merkle).
        deletes = [] if plan.relayout else list(plan.delete)
        # Rows that do not stream: files are embedded in `todo` order (the priority),
        # and sent afterwards in a random one. Streamed: `todo` is random already, and
        # each batch is sent as it is embedded.
        deferred: list[_Pending] | None = None if self.rows.streams else []
        try:
            while True:
                item = batches.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self._flush(item, [] if deferred is not None else deletes, report, deferred)
                deletes = deletes if deferred is not None else []
        finally:
            stop.set()
            producer.join()
        if deferred:
            deletes = self._send_shuffled(deferred, deletes, report)
        deletes += list(plan.delete) if plan.relayout else []
        if deletes:
            self._flush([], deletes, report)
        return not moved.is_set()

    def _send_shuffled(self, files: list[_Pending], deletes: list[bytes],
                       report: SyncReport) -> list[bytes]:
        """Seal and send the rows of `files` (embedded already: their vectors are in the
        cache) in a random order, in batches of about BATCH_CHUNKS chunks; the first
        batch carries `deletes`. Returns the deletes left unsent (no batch to carry them)."""
        files = _random.sample(files, len(files))
        while files:
            batch: list[tuple[_Pending, list[Chunk]]] = []
            n = 0
            links: list[FileUpdate] = []
            while files and n < BATCH_CHUNKS and len(batch) + len(links) < BATCH_FILES:
                p = files.pop()
                if p.link:
                    links.append(self._link(p.path, p.digest))
                    continue
                batch.append((p, self.local.for_file(p.path)))
                n += len(batch[-1][1])
            t0 = time.perf_counter()
            vectors = self.embedder.embed([c.embed_text for _, cs in batch for c in cs]).vectors
            updates = self._updates(batch, vectors) + links
            report.seconds_encrypt += time.perf_counter() - t0
            t0 = time.perf_counter()
            self._apply(updates, deletes[:DELETE_BATCH])
            deletes = deletes[DELETE_BATCH:]
            report.seconds_sync += time.perf_counter() - t0
        return deletes

    def _batches(
        self,
        todo: Sequence[str],
        upload: set[str],
        files: dict[str, bytes],
        moved: threading.Event,
        report: SyncReport,
        *,
        relayout: bool = False,
        linked: set[str] | None = None,
        resend: set[str] | None = None,
    ) -> Iterator[list[_Pending]]:
        """Read and chunk `todo` into the local chunk table (files to upload marked
        pending, `RowsOut.waits`), in batches of about BATCH_CHUNKS chunks to send."""
        if not todo:
            return  # nothing to read: no connection, no parsers
        # Imported here: the parsers cost ~30 ms that a sync with nothing to send skips.
        from indexer.definitions import Definition, chunk_and_define
        from indexer.sibling_chunks import SiblingChunks

        # Its own connection: this runs in the chunker thread.
        with contextlib.closing(open_state_db(self._state_path)) as db, \
                contextlib.closing(SiblingChunks.for_root(self.root)) as siblings, \
                contextlib.closing(SiblingChunks([self._state_path])) as own, \
                handles_for(self.root) as dirs:
            writer = LocalChunks(db)
            batch: list[_Pending] = []
            batch_chunks = 0
            target = FIRST_BATCH_CHUNKS
            unwritten: list[tuple[str, bytes, list[Chunk]]] = []
            defined: dict[str, list[Definition]] = {}
            last_write = time.perf_counter()

            def waits(path: str) -> bool:
                return self.rows.waits(path in upload)

            def write() -> None:
                nonlocal last_write
                writer.replace_files([u for u in unwritten if waits(u[0])], pending=True,
                                     definitions=defined)
                writer.replace_files([u for u in unwritten if not waits(u[0])],
                                     definitions=defined)
                unwritten.clear()
                defined.clear()
                last_write = time.perf_counter()

            for path in todo:
                t0 = time.perf_counter()
                source = self._read(self.root, path, dirs)
                if not isinstance(source, SourceFile):
                    # Vanished or became unreadable since the scan: leave directories pending.
                    moved.set()
                    report.seconds_chunk += time.perf_counter() - t0
                    continue
                if source.digest != files[path]:
                    moved.set()
                # This checkout's own table first (the words pass chunked the file
                # already: `codeveil index` before its builder), then another worktree's.
                reused = own.lookup(path, source.digest) if own else None
                if reused is None and siblings:
                    reused = siblings.lookup(path, source.digest)
                    if reused is not None:
                        report.files_reused += 1
                if reused is not None:  # chunked already at this very content
                    chunks, defined[path] = reused
                else:
                    chunks, defined[path] = chunk_and_define(path, source.text)
                    report.files_parsed += 1
                unwritten.append((path, source.digest, chunks))
                # One transaction per batch of files, or twice a second: searchable soon.
                if len(unwritten) >= WRITE_FILES or time.perf_counter() - last_write > 0.5:
                    write()
                report.seconds_chunk += time.perf_counter() - t0
                batch.append(_Pending(path, source.digest, len(chunks), path in upload,
                                      pull=self.rows.pulls(path in upload, relayout),
                                      link=path in (linked or ()),
                                      resend=path in (resend or ())))
                batch_chunks += len(chunks) if waits(path) else 0
                if batch_chunks >= target or len(batch) >= BATCH_FILES:
                    write()  # a batch is only sent once its chunks are in the table
                    yield batch
                    batch, batch_chunks = [], 0
                    target = min(2 * target, BATCH_CHUNKS)
            t0 = time.perf_counter()
            write()
            report.seconds_chunk += time.perf_counter() - t0
            if batch:
                yield batch

    def _flush(self, batch: list[_Pending], deletes: list[bytes], report: SyncReport,
               deferred: list[_Pending] | None = None) -> None:
        """Pull, embed and send one batch; with `deferred`, the files to send are added to
        it instead (sent later by `_send_shuffled`) and marked as having their vectors."""
        for p in batch:  # linked before it was chunked here: its rows checked now
            if p.link and not self.rows.complete(p.path, p.digest,
                                                 self.local.for_file(p.path)):
                p.link, p.upload = False, True
        sending = [(p, self.local.for_file(p.path)) for p in batch
                   if p.upload or (p.resend and p.chunks)]
        pulling = [(p, self.local.for_file(p.path)) for p in batch if p.pull]
        texts = [c.embed_text for _, chunks in sending for c in chunks]
        n_sending = len(texts)
        if pulling:
            t0 = time.perf_counter()
            pulled = self._pull(pulling)
            report.chunks_pulled += pulled.filled
            report.chunks_from_cache += pulled.cached
            self.progress.chunks_done(0, pulled.filled + pulled.cached)
            texts += pulled.lacking  # only what neither the cache nor the workspace had
            report.seconds_sync += time.perf_counter() - t0
        t0 = time.perf_counter()
        result = self.embedder.embed(texts, progress=self.progress.chunks_done)
        report.chunks_embedded += result.embedded
        report.chunks_from_cache += result.from_cache
        headers = self.rows.headers(c for _, chunks in sending + pulling for c in chunks)
        if headers:
            report.headers_embedded += self.embedder.embed(headers).embedded
        report.seconds_embed += time.perf_counter() - t0

        if deferred is not None:
            # Held back: "pending" means "no vectors here yet"; a crash before the rows
            # are sent leaves the store's tree short, and the next diff sends them.
            deferred.extend(p for p, _ in sending)
            deferred.extend(p for p in batch if p.link)
            self.local.mark_stored([p.path for p, _ in sending + pulling])
            report._rate()
            self.progress.files_done(len(batch))
            self.progress.stages(report.stages(), report.embed_chunks_per_s)
            return
        t0 = time.perf_counter()
        updates = self._updates(sending, result.vectors[:n_sending])
        updates += [self._link(p.path, p.digest) for p in batch if p.link]
        report.seconds_encrypt += time.perf_counter() - t0
        t0 = time.perf_counter()
        for start in range(0, max(len(deletes), 1), DELETE_BATCH):
            part = deletes[start : start + DELETE_BATCH]
            first = updates if start == 0 else []
            if first or part:
                self._apply(first, part)
        # Pending until the server holds them: a crash before this re-sends them (the
        # server's tree, not this mark, decides what is sent).
        self.local.mark_stored([p.path for p, _ in sending + pulling])
        report.seconds_sync += time.perf_counter() - t0
        report._rate()
        self.progress.files_done(len(batch))
        self.progress.stages(report.stages(), report.embed_chunks_per_s)

    def _link(self, path: str, digest: bytes) -> FileUpdate:
        """The leaf of a file whose rows the store holds already."""
        return self.rows.leaf(path, digest)

    def _apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> None:
        deletes = self.rows.deletes(deletes)  # what this apply empties goes with it
        missing = self.client.apply(updates, deletes)
        self.rows.applied()
        if missing:  # the GC took their blobs since the look-up: the next sync sends them
            log.info("%d linked files were no longer in the pool; left pending",
                     len(missing))

    def _embed_missing_headers(self, report: SyncReport) -> None:
        """Once per state database and model: embed the header of every chunk whose
        header vector the cache lacks. Each sync embeds the headers of the files it
        writes; this fills in the chunks written before chunks had header vectors."""
        model_id = self.embedder.model_id
        if self.local.headers_embedded(model_id):
            return
        t0 = time.perf_counter()
        keys = {h: cache_key(model_id, h) for h in sorted(self.local.headers())}
        known = self.embedder.cache.known(list(keys.values()))
        lacking = [h for h, k in keys.items() if k not in known]
        if lacking:
            log.info("embedding the headers of %d chunks indexed before chunks had"
                     " header vectors", len(lacking))
            report.headers_embedded += self.embedder.embed(lacking).embedded
            report.seconds_embed += time.perf_counter() - t0
            report._rate()
            self.progress.stages(report.stages(), report.embed_chunks_per_s)
        self.local.mark_headers_embedded(model_id)

    def _pull(self, pulling: list[tuple[_Pending, list[Chunk]]]) -> _Pulled:
        """Fill the embedding cache from the store's rows of files it already holds,
        for the chunks the cache lacks."""
        cache, model_id = self.embedder.cache, self.embedder.model_id
        keyed = [(p, [(cache_key(model_id, c.embed_text), c) for c in chunks])
                 for p, chunks in pulling]
        have = cache.get_many([k for _, kc in keyed for k, _ in kc], self.embedder.dim)
        # file key -> (path, the chunks whose vectors the cache lacks), for every file of
        # the batch: the files asked for are the files pulled, in their (random) order,
        # whatever they hold. Asking only for those with something lacking would name
        # the empty files (no chunks) to the server, and the ones this cache holds.
        wanted: dict[bytes, tuple[str, list[tuple[bytes, Chunk]]]] = {
            ciphers.node_key(self.key, p.path): (p.path, [(k, c) for k, c in kc
                                                         if k not in have])
            for p, kc in keyed}
        digests = {ciphers.node_key(self.key, p.path): (p.path, p.digest) for p, _ in pulling}
        filled = self.rows.pull(wanted, digests)
        cache.put_many(filled)
        self.rows.consumed((p.path, p.digest) for p, _ in pulling)
        got = {k for k, _ in filled}
        unfilled = [c.embed_text for _, kc in wanted.values() for k, c in kc if k not in got]
        cached = sum(len(kc) for _, kc in keyed) - len(unfilled) - len(filled)
        return _Pulled(filled=len(filled), cached=cached, lacking=unfilled)

    def _cached_vectors(self, rows: list[PageRow]) -> list[np.ndarray | None]:
        """The vector of each row from this machine's embedding cache, through the local
        chunk its place names (None where the cache or the chunk table lacks it)."""
        cache, model_id = self.embedder.cache, self.embedder.model_id
        chunks: dict[str, dict[tuple[int, int, bytes], Chunk]] = {}
        keys: list[bytes | None] = []
        for r in rows:
            if r.meta.path not in chunks:
                chunks[r.meta.path] = {(c.start_line, c.end_line, c.chunk_hash): c
                                       for c in self.local.for_file(r.meta.path)}
            c = chunks[r.meta.path].get((r.meta.start_line, r.meta.end_line,
                                         r.meta.chunk_hash))
            keys.append(None if c is None else cache_key(model_id, c.embed_text))
        found = cache.get_many([k for k in keys if k is not None], self.embedder.dim)
        return [None if k is None else found.get(k) for k in keys]

    def _updates(self, sending: list[tuple[_Pending, list[Chunk]]],
                 vectors: np.ndarray) -> list[FileUpdate]:
        return self.rows.updates([(p.path, p.digest, c) for p, c in sending], vectors)
