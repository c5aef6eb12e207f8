"""A repo's workspace as this machine holds it: the one place that creates, opens and
checks it and syncs it, for every face (`retrieval.Index`, the daemon, the CLI).

    ws = Workspace("path/to/repo")
    report = ws.sync()                # the first sync creates .codeveil/ and the workspace
    root, config, key, client = ws.open()
    ws.close()

What it owns: finding the root (upward, like git finds `.git/`), creating the workspace
under the init lock (embedded store or a server; sealed unless asked for server-side
search), joining one on a server, choosing the client (in-process or HTTP), checking
the key and the model against what the workspace holds, choosing the embedder (the
workspace's own model unless one is given), and the sync itself (`Syncer`, embedding
here or on a Ray cluster). Searching is retrieval's: it ranks over what `open` returns.

With the server unreachable, a sync brings this machine's index up to date alone
(`Syncer.run_local`) and says why in `SyncReport.offline`; the next sync that reaches
the server sends what it lacks. A workspace whose server was unreachable at `init` is
created there by the first `open` that reaches it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from indexer.embed_cache import CachedEmbedder, EmbeddingCache
from indexer.embedder import Embedder
from indexer.embedder_registry import default_embedder, embedder_for_model_id, embedder_name
from indexer.errors import CodeveilError
from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import (
    ConfigError,
    NoIndexError,
    RepoConfig,
    codeveil_dir,
    find_root,
    init_lock,
    load_config,
    load_token,
    missing_config_message,
    new_workspace_id,
    remember_checkout,
    save_config,
    save_token,
    server_url_problem,
    state_path,
    store_path,
    token_path,
)
from sync.checkout.index_state import mark_completed
from sync.checkout.refs import ref_id, ref_name
from sync.checkout.server_contact import (
    ServerRecord,
    Unreachable,
    load_record,
    record_check,
    record_sync,
    unreachable,
    utc_now,
)
from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import ENV_KEY, WorkspaceKey, create_key, key_path, load_key
from sync.crypto.pages import PageIndex
from sync.errors import KeyMismatchError, SyncError
from sync.records import DEFAULT_REF, MODE_SEALED, MODE_SERVER_SEARCH
from sync.syncer.paged_sync import PagedSync
from sync.syncer.progress import Progress, SyncFollower
from sync.syncer.rows_out import RowsOut
from sync.syncer.search_rows import SearchRows
from sync.syncer.syncer import Syncer, SyncReport
from sync.syncer.tree_check import check_tree
from sync.workspace.status import WorkspaceStatus

if TYPE_CHECKING:
    from indexer.ray_embedder import RayEmbedder

log = logging.getLogger(__name__)

__all__ = ["ENV_EMBED_ON", "ModelMismatchError", "Opened", "OpenedForRead", "Workspace"]

#: Seconds a read waits to connect to the server before answering from this machine.
READ_CONNECT_TIMEOUT = 3.0

#: The setting that sends a sync's embedding to a Ray cluster (see `Workspace.sync`).
ENV_EMBED_ON = "CODEVEIL_EMBED_ON"

# The key on this machine is not the one the workspace was built with (exported by
# retrieval under this name).
WrongKeyError = KeyMismatchError


class ModelMismatchError(CodeveilError):
    """The workspace holds vectors of another embedding model than the one in use."""


class Opened(NamedTuple):
    """An open workspace: where, what, under which key, through which client."""

    root: Path
    config: RepoConfig
    key: WorkspaceKey
    client: StoreClient


class OpenedForRead(NamedTuple):
    """`Opened` for a read: `client` is None where the read asks no server
    (`Workspace.open_for_read`)."""

    root: Path
    config: RepoConfig
    key: WorkspaceKey
    client: StoreClient | None


class Workspace:
    """The workspace of one folder (found upward from `path`), from the client's side."""

    def __init__(self, path: str | Path = ".", *, embedder: Embedder | None = None) -> None:
        self._start = Path(path)
        if not self._start.exists():
            raise CodeveilError(f"no such folder: {self._start}")
        if not self._start.is_dir():
            raise CodeveilError(f"not a folder: {self._start}")
        self._embedder_given = embedder
        self._embedder: CachedEmbedder | None = None
        self._client: StoreClient | None = None
        self._checked = False  # whether `_client` was checked against the workspace
        #: Set by `open_or_last_known` when the server did not answer and this machine's
        #: copy answers alone (sync.checkout.server_contact); None when the server answered or
        #: was not asked.
        self.offline: Unreachable | None = None
        self._connect_timeout: float | None = None  # the HTTP client's default
        self._pool = False  # whether the store keeps a tree per ref (set by `_check`)
        self.ref_name: str | None = None  # the ref this checkout syncs, with a pool

    @property
    def root(self) -> Path:
        """The folder holding `.codeveil/` (the folder given, before the first sync)."""
        try:
            return find_root(self._start)
        except CodeveilError:
            return self._start.resolve()

    @property
    def mode(self) -> str:
        """The workspace's mode: "sealed" (search runs here) or "server-search"."""
        return load_config(find_root(self._start)).mode

    @property
    def embedder(self) -> CachedEmbedder:
        """The embedder this workspace uses (its model), behind the cache."""
        if self._embedder is None:
            model = self._embedder_given or self._workspace_embedder() or default_embedder()
            self._embedder = CachedEmbedder(model, EmbeddingCache())
        return self._embedder

    def _workspace_embedder(self) -> Embedder | None:
        """The model an existing workspace was built with, so a later change of the
        default never mixes vectors; None for a new index, or when CODEVEIL_EMBEDDER
        names a model explicitly (then a mismatch is reported, not papered over)."""
        if os.environ.get("CODEVEIL_EMBEDDER"):
            return None
        try:
            config = load_config(find_root(self._start))
        except CodeveilError:
            return None
        return embedder_for_model_id(config.model_id)

    def init(self, *, server: str | None = None, workspace_id: str | None = None,
             token: str | None = None, server_search: bool = False) -> RepoConfig:
        """Create `.codeveil/` here and its workspace (in-process, or on `server`).

        A new workspace is sealed: the store keeps one envelope per chunk that it cannot
        compare, and search runs on this machine. `server_search` instead lets the
        server rank encrypted vectors (for repos too big for a client's memory), at the
        leakage measured in docs/threat-model.md; the mode is the workspace's for good.

        With `workspace_id` (and the key imported with `codeveil key import`), join an
        existing workspace on `server` instead of creating one; it keeps its own mode.
        """
        if server is not None:
            bad = server_url_problem(server)
            if bad is not None:  # refused before anything is written
                raise CodeveilError(bad)
        root = self._start.resolve()
        with init_lock(root):
            # Checked under the lock: of two inits of one folder at once, the second
            # must not make a second workspace (and key) and re-point the folder to it.
            if (codeveil_dir(root) / "config.json").exists():
                raise CodeveilError(
                    f"{root} is already indexed; remove {codeveil_dir(root)} first to"
                    " re-point it")
            return self._init(server=server, workspace_id=workspace_id, token=token,
                              server_search=server_search)

    def ensure(self) -> None:
        """Create the workspace here unless it exists. Another process (a daemon, a
        second agent) may be creating it at the same time: the first to take the lock
        creates it, the others use what it made, so one folder ends with one workspace
        and one key."""
        try:
            find_root(self._start)
            return
        except CodeveilError:
            pass
        root = self._start.resolve()
        # A checkout of a workspace on a server that lost its config.json: a new
        # workspace here would be detached from the team's, under a new key.
        recorded = missing_config_message(root)
        if recorded:
            raise NoIndexError(recorded + "; `codeveil init` instead starts a new workspace")
        with init_lock(root):
            if not (codeveil_dir(root) / "config.json").is_file():
                self._init()

    def _init(self, *, server: str | None = None, workspace_id: str | None = None,
              token: str | None = None, server_search: bool = False) -> RepoConfig:
        """`init`, its caller holding the init lock."""
        root = self._start.resolve()
        embedder = self.embedder
        mode = MODE_SERVER_SEARCH if server_search else MODE_SEALED
        if workspace_id is None:
            workspace_id = new_workspace_id()
            # CODEVEIL_KEY stands for every workspace: a new one is made under it (CI,
            # a second clone of a shared index); otherwise a fresh key is stored.
            key = load_key(workspace_id) if os.environ.get(ENV_KEY) else create_key(workspace_id)
            if server is None:
                from sync.store.local_client import LocalClient

                LocalClient.create_workspace(
                    store_path(root), workspace_id, dim=embedder.dim,
                    model_id=embedder.model_id, key_check=key.key_check, mode=mode,
                ).close()
            else:
                from sync.transport.http_client import ServerUnavailable

                try:
                    _create_on_server(server, workspace_id, key, embedder, mode)
                except ServerUnavailable as exc:
                    # The workspace id and the key are made here: the server can be
                    # told later. Until then this machine indexes alone.
                    log.warning("%s; the workspace is created there by the first index"
                                " that reaches it", exc)
                    _create_later(root).touch()
        elif server is None:
            raise CodeveilError("joining an existing workspace needs --server URL")
        else:
            from sync.transport.http_client import HttpClient

            load_key(workspace_id)
            if token:
                save_token(workspace_id, token)
            with HttpClient(server, workspace_id, load_token(workspace_id)) as joined:
                mode = joined.info().mode  # the workspace's, whatever was asked
        config = RepoConfig(workspace_id=workspace_id, model_id=embedder.model_id,
                            dim=embedder.dim, server=server, mode=mode)
        save_config(root, config)
        self._start = root
        if not _create_later(root).exists():
            self._check(config, load_key(workspace_id))
        return config

    def open(self) -> Opened:
        """The workspace as it stands: its root, config, key and client (opened and
        checked against the key and the model once, then kept)."""
        root = find_root(self._start)
        config = load_config(root)
        key = load_key(config.workspace_id)
        if self._client is None or not self._checked:
            if config.server is not None and _create_later(root).exists():
                if not token_path(config.workspace_id).exists():  # else made, then a crash
                    _create_on_server(config.server, config.workspace_id, key,
                                      self.embedder, config.mode)
                _create_later(root).unlink()
            self._check(config, key)
        self.offline = None
        assert self._client is not None  # set by _check
        return Opened(root, config, key, self._client)

    def open_for_read(self, *, ranks: bool = False) -> OpenedForRead:
        """The workspace for a read this machine's copy answers alone (search, status,
        the lookups). A workspace on a server is not asked: it opens on what the last
        check against the server confirmed (`sync.checkout.server_contact`), still refusing a
        key, model or mode other than that, and `client` is None. The server learns of
        a checkout's syncs, never of its reads, and a revoked, slow or stopped server
        changes no read. `ranks`: the read ranks on the store (a server-search
        workspace's search), which is opened as by `open_or_last_known`, as is an
        embedded store (no network)."""
        root = find_root(self._start)
        config = load_config(root)
        if config.server is None or (ranks and not config.sealed):
            return OpenedForRead(*self.open_or_last_known())
        key = load_key(config.workspace_id)
        if not self._as_last_confirmed(root, config, key):
            # never checked (the server was unreachable at init)
            self._compare_model(config)
            self._pool = config.sealed  # a sealed workspace on a server keeps refs
        self.offline = None
        return OpenedForRead(root, config, key, None)

    def _as_last_confirmed(self, root: Path, config: RepoConfig, key: WorkspaceKey) -> bool:
        """Refuse a key, model or mode other than what the server last confirmed
        (`sync.checkout.server_contact`), and take its pool from it; False where it never did."""
        assert config.server is not None
        record = load_record(root, config.workspace_id, config.server)
        if record is None:
            return False
        self._compare(config, key, key_check=bytes.fromhex(record.key_check),
                      dim=record.dim, model_id=record.model_id, mode=record.mode)
        self._pool = record.pool
        return True

    def open_or_last_known(self) -> Opened:
        """`open`, and when the server cannot be reached, the workspace as the last
        check against it confirmed (`sync.checkout.server_contact`), still refusing a key, model
        or mode other than that; `offline` then says that the server did not answer and
        when this copy last synced. The next call asks the server again."""
        if self._client is None:
            # Waits less for a connection than a sync: off the VPN, a server's address
            # may drop packets rather than refuse them.
            self._connect_timeout = READ_CONNECT_TIMEOUT
        try:
            return self.open()
        except SyncError as exc:
            root = find_root(self._start)
            config = load_config(root)
            if config.server is None or self._client is None or not _unreachable(exc):
                raise
            key = load_key(config.workspace_id)
            self._as_last_confirmed(root, config, key)
            self.offline = unreachable(root, config.workspace_id, config.server, exc)
            return Opened(root, config, key, self._client)

    def _check(self, config: RepoConfig, key: WorkspaceKey) -> None:
        root = find_root(self._start)
        client = self._client or _open_client(root, config, self._connect_timeout)
        self._client = client
        info = client.info()
        self._compare(config, key, key_check=info.key_check, dim=info.dim,
                      model_id=info.model_id, mode=info.mode)
        # A store with a blob pool keeps one tree per ref: this checkout's branch's.
        self._pool = info.mode == MODE_SEALED and bool(info.extra.get("pool"))
        self._follow_ref(root, key, client)
        self._checked = True
        if config.server is not None:
            remember_checkout(root, config)  # a checkout set up before such records
            record_check(root, ServerRecord(
                workspace_id=config.workspace_id, server=config.server,
                key_check=info.key_check.hex(), model_id=info.model_id, dim=info.dim,
                mode=info.mode, pool=self._pool, checked_at=utc_now()))

    def _compare(self, config: RepoConfig, key: WorkspaceKey, *, key_check: bytes,
                 dim: int, model_id: str, mode: str) -> None:
        """Refuse a key, config or embedder other than the workspace's (as the server
        answers it, or as it last answered)."""
        if key_check != key.key_check:
            source = (ENV_KEY if os.environ.get(ENV_KEY, "").strip()
                      else str(key_path(config.workspace_id)))
            raise WrongKeyError(
                f"the key for workspace {config.workspace_id} ({source}) does not match the"
                " one its index was built with; import the right one with `codeveil key"
                " import`")
        for name, have, want in (("dim", config.dim, dim),
                                 ("model_id", config.model_id, model_id),
                                 ("mode", config.mode, mode)):
            if have != want:
                path = codeveil_dir(find_root(self._start)) / "config.json"
                raise ConfigError(
                    f"{path}: {name} is {have!r} but workspace {config.workspace_id} holds"
                    f" {want!r}; set it back to {want!r}"
                )
        self._compare_model(config, model_id=model_id, dim=dim)

    def _compare_model(self, config: RepoConfig, *, model_id: str | None = None,
                       dim: int | None = None) -> None:
        """Refuse an embedder other than the workspace's (`model_id` and `dim` as the
        store holds them; the config's where not given)."""
        model_id = config.model_id if model_id is None else model_id
        dim = config.dim if dim is None else dim
        model = self.embedder
        if model_id != model.model_id or dim != model.dim:
            raise ModelMismatchError(
                f"workspace {config.workspace_id} holds vectors of {model_id} (dim"
                f" {dim}) but the embedder in use is {model.model_id} (dim {model.dim})"
            )

    def sync(self, *, progress: Progress | None = None, reupload: bool = False,
             embed_on: str | None = None, follower: SyncFollower | None = None) -> SyncReport:
        """Bring the workspace up to date with the folder; creates it on first use.

        `reupload` sends every file again, whatever the store's tree says: the repair of
        a store that lost rows (`codeveil doctor --repair`). `embed_on` (or the
        CODEVEIL_EMBED_ON setting) sends the embedding to a Ray cluster,
        `ray://HOST:PORT[?actors=N]`: the cluster sees the chunks' plain text, so it must
        be one you trust; vectors come back here and are encrypted here. `follower`
        runs beside the sync and is finished with it (its time is in the report).
        """
        if follower is None:
            return self._sync(progress, reupload, embed_on)
        report = None
        try:
            report = self._sync(follower.watch(progress), reupload, embed_on)
        finally:
            took = follower.finish(completed=report is not None)
        report.seconds_search_ready = took
        report.seconds += took
        return report

    def index_words(self, *, progress: Progress | None = None) -> SyncReport:
        """The part of a sync that needs neither the model nor the store
        (`Syncer.run_local`): changed files chunked into this machine's chunk table
        (pending until they have vectors), deleted ones dropped; creates the workspace on
        first use. `codeveil index` returns after this and leaves the rest to the
        builder, which runs `sync`."""
        self.ensure()
        root = find_root(self._start)
        config = load_config(root)
        syncer = self._syncer(root, config, load_key(config.workspace_id), None,
                              self.embedder, progress)
        try:
            report = syncer.run_local(embed=False)
        finally:
            syncer.close()
        mark_completed(root)  # the chunk table holds every file: the index exists
        return report

    def _sync(self, progress: Progress | None, reupload: bool,
              embed_on: str | None) -> SyncReport:
        from sync.transport.http_client import ServerUnavailable

        remote = self._remote_embedder(embed_on or os.environ.get(ENV_EMBED_ON))
        self.ensure()
        try:
            root, config, key, client = self.open()
        except ServerUnavailable as exc:
            if remote is not None:
                remote.close()
            return self._sync_offline(progress, exc)
        self._follow_ref(root, key, client)
        embedder = self.embedder
        if remote is not None:
            embedder = CachedEmbedder(remote, embedder.cache)
        syncer = self._syncer(root, config, key, client, embedder, progress)
        try:
            try:
                report = syncer.run(reupload=reupload)
            except ServerUnavailable as exc:  # it went away mid-sync: finish here alone
                log.info("%s; indexing on this machine only", exc)
                self.close()  # never reuse a client whose connection broke
                report = syncer.run_local(embed=True)
                report.offline = str(exc)
                mark_completed(root)
                return report
            report.embedded_on = (remote.address or "auto") if remote is not None else "here"
        finally:
            syncer.close()
            if remote is not None:
                remote.close()
        client.verify()  # never report success over a store that cannot read its rows
        mark_completed(root)
        if config.server is not None:
            record_sync(root, config.workspace_id, config.server)
        if self._pool and report.files_changed:
            drop_legacy_tree(client)
        return report

    def _sync_offline(self, progress: Progress | None, exc: Exception) -> SyncReport:
        """The sync with the server unreachable: this machine's index (chunks, words and,
        here, vectors) is brought up to date alone. Nothing is queued apart: the store's
        tree still says what it holds, so the next sync that reaches it sends exactly
        what it lacks (the Merkle diff), and nothing twice."""
        self.close()  # a client that could not connect is opened afresh next time
        root = find_root(self._start)
        config = load_config(root)
        embedder = self.embedder
        if (embedder.model_id, embedder.dim) != (config.model_id, config.dim):
            raise ModelMismatchError(
                f"workspace {config.workspace_id} holds vectors of {config.model_id} (dim"
                f" {config.dim}) but the embedder in use is {embedder.model_id} (dim"
                f" {embedder.dim})")
        log.info("%s; indexing on this machine only", exc)
        syncer = self._syncer(root, config, load_key(config.workspace_id), None, embedder,
                              progress)
        try:
            report = syncer.run_local(embed=True)
        finally:
            syncer.close()
        mark_completed(root)
        report.offline = str(exc)
        return report

    def _syncer(self, root: Path, config: RepoConfig, key: WorkspaceKey,
                client: StoreClient | None, embedder: CachedEmbedder,
                progress: Progress | None) -> Syncer:
        # The mode's rows, chosen here once: the Syncer asks nothing of the mode.
        rows: RowsOut = (
            PagedSync(key, config.workspace_id, embedder.dim, pool=self._pool,
                      shared=config.server is not None) if config.sealed
            else SearchRows(key, config.workspace_id, ciphers.VectorCipher(key, embedder.dim)))
        return Syncer(root, state_path(root), client, key, config.workspace_id, embedder,
                      rows, progress=progress)

    def _follow_ref(self, root: Path, key: WorkspaceKey, client: StoreClient) -> None:
        """Point `client` at the tree of the branch checked out now (a store with a
        pool): on open, and before each sync, since a daemon holds this Workspace across
        `git checkout`s and a sync after one must go to the new branch's tree, never
        rewrite the old one's with the new branch's files."""
        if not self._pool:
            return
        name = ref_name(root)
        if self.ref_name is not None and name != self.ref_name:
            log.info("ref %s -> %s", self.ref_name, name)
        self.ref_name = name
        client.ref = ref_id(key, name)  # a client opened again starts at the default ref

    def _remote_embedder(self, embed_on: str | None) -> RayEmbedder | None:
        """A Ray pool running this index's model, for `embed_on`; None for here."""
        if not embed_on:
            return None
        from indexer.ray_embedder import RayEmbedder, parse_embed_on

        address, actors = parse_embed_on(embed_on)
        model_id = self.embedder.model_id
        name = embedder_name(model_id)
        if name is None:
            raise CodeveilError(f"the model {model_id} cannot be run on a Ray cluster")
        return RayEmbedder(address, actors=actors or 2, model=name)

    def status(self, *, server: bool = False) -> WorkspaceStatus:
        """Where the workspace is, what it holds here and in the store, where that is.

        A workspace on a server is not asked (`open_for_read`): `server_chunks` is what
        this machine's pages say its last syncs left there (sealed; None otherwise).
        `server` asks it: the store's counts, and whether its tree of this checkout's
        ref is the one this checkout synced (`server_tree`, sync.syncer.tree_check)."""
        opened = OpenedForRead(*self.open_or_last_known()) if server else self.open_for_read()
        root, config, key, client = opened
        info = tree = None
        if self.offline is None and client is not None:
            try:
                info = client.info()
                if server:
                    tree = check_tree(root, config, key, client, self.ref_name).to_dict()
            except SyncError as exc:
                if config.server is None or not _unreachable(exc):
                    raise
                self.offline = unreachable(root, config.workspace_id, config.server, exc)
                info = tree = None
        ref = ref_name(root) if self._pool else None  # the next sync's, checked out now
        db = open_state_db(state_path(root))
        try:
            local = LocalChunks(db)
            files, chunks = local.count_files(), local.count()
            live = _live_rows(db, local, key) if config.sealed else None
        finally:
            db.close()
        held = live if live is not None else None if info is None else info.chunks
        return WorkspaceStatus(
            root=str(root), workspace_id=config.workspace_id,
            server=config.server or "embedded", mode=config.mode, model_id=config.model_id,
            files=files, chunks=chunks,
            # A sealed workspace counts the live rows of the pages this machine knows:
            # files embedded here but not sent yet (the builder sends a sealed
            # workspace's rows at its end; offline, later) hold no rows there.
            server_chunks=None if self.offline is not None else held,
            server_rows=None if info is None else info.chunks,
            server_nodes=None if info is None else info.nodes, ref=ref,
            last_sync=self._last_sync(root, config),
            offline=None if self.offline is None else self.offline.to_dict(),
            server_tree=tree,
        )

    @staticmethod
    def _last_sync(root: Path, config: RepoConfig) -> str | None:
        """When this copy last completed a sync with its server (None: embedded, or not
        recorded)."""
        if config.server is None:
            return None
        record = load_record(root, config.workspace_id, config.server)
        return None if record is None else record.last_sync

    def close(self) -> None:
        """Close the client (a later call opens it again)."""
        if self._client is not None:
            self._client.close()
            self._client = None
            self._checked = False


def drop_legacy_tree(client: StoreClient) -> None:
    """Once this checkout's ref holds its tree, drop the default ref's: the one tree of a
    workspace made before refs, migrated there (sync.store.embedded.pool), which no client of
    refs syncs any more. Its blobs stay where this ref names them."""
    if client.ref != DEFAULT_REF and any(r.ref == DEFAULT_REF for r in client.refs()):
        client.drop_ref(DEFAULT_REF)


def _unreachable(exc: SyncError) -> bool:
    """Whether `exc` says that the server could not be reached (`ServerUnavailable`,
    whose module only a workspace on a server imports)."""
    from sync.transport.http_client import ServerUnavailable

    return isinstance(exc, ServerUnavailable)


def _live_rows(db: sqlite3.Connection, local: LocalChunks, key: WorkspaceKey) -> int:
    """The chunks of this machine's files that a sealed store holds a row of: the live
    rows of the pages this machine knows (sync.crypto.pages; the store's own count also holds
    padding, and rows of versions since replaced, until their page goes)."""
    owners = {ciphers.node_key(key, p): ciphers.node_value(key, p, d)
              for p, d in local.file_digests().items()}
    return PageIndex(db, read_only=True).live_rows(owners)


def _create_later(root: Path) -> Path:
    """Present while the workspace of a server that was unreachable at `init` is still
    to be created there (the next `open` that reaches it does)."""
    return codeveil_dir(root) / "create-on-server"


def _create_on_server(server: str, workspace_id: str, key: WorkspaceKey,
                      embedder: CachedEmbedder, mode: str) -> None:
    """Create the workspace on `server` and keep its token."""
    from sync.transport.http_client import HttpClient

    token = HttpClient.create_workspace(
        server, workspace_id=workspace_id, dim=embedder.dim, model_id=embedder.model_id,
        key_check=key.key_check, mode=mode)
    save_token(workspace_id, token)


def _open_client(root: Path, config: RepoConfig,
                 connect_timeout: float | None = None) -> StoreClient:
    if config.server is None:
        from sync.store.local_client import LocalClient
        from sync.wire import WorkspaceNotFound

        try:
            return LocalClient.open(store_path(root), config.workspace_id)
        except WorkspaceNotFound:
            # The registry was lost or replaced, or config.json names another
            # workspace (copied from another checkout): the repair sorts out which.
            raise WorkspaceNotFound(
                f"the embedded store {store_path(root)} holds no workspace"
                f" {config.workspace_id!r}, the one {codeveil_dir(root) / 'config.json'}"
                " names: its registry.sqlite was lost or replaced, or config.json is"
                " another checkout's; run `codeveil doctor --repair`") from None
    from sync.transport.http_client import HttpClient

    token = load_token(config.workspace_id)
    if connect_timeout is None:
        return HttpClient(config.server, config.workspace_id, token)
    return HttpClient(config.server, config.workspace_id, token,
                      connect_timeout=connect_timeout)
