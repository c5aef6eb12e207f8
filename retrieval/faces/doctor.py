"""`codeveil doctor`: check every file the client and its store own, and with `repair`
rebuild what can be rebuilt.

What is checked, in order (a check that cannot pass stops the ones that need it): the
config and key, then each of `PARTS`, the parts of an index and the files each keeps:

- `.codeveil/config.json`: format version and every value (`sync.checkout.config`);
- the workspace key: present, well-formed, the one the workspace was created with;
- `.codeveil/state.sqlite`: SQLite integrity, and that it holds the chunks;
- the embedding cache: SQLite integrity, its vectors of this model finite and of unit
  length, and one for every local chunk (else exact scores silently fall back);
- `.codeveil/lexical/`, `vectors/`, `static/`, `trigrams/`: readable, their checksums
  right;
- the store: for the embedded one, its registry and tree (integrity), its chunk table
  (read in full), the search snapshot (the table's rows), and that it holds exactly the
  chunks of the local state, file by file; for a server, that it answers.

Repairs never delete: a damaged file or folder is renamed aside (`<name>.damaged-<time>`)
and rebuilt: the client state from the working tree, the cache by embedding again, the
lexical index from the state, the embedded store from the working tree (same workspace
id and key), and rows a store lost by sending every file again. A crash during a repair
leaves the renamed copy and a state the next `codeveil index` or doctor run finishes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.embed_cache import CACHE_FORMAT, cache_key
from indexer.embedder import Embedder
from indexer.errors import CodeveilError
from indexer.formats import sqlite_format_problem
from indexer.local_chunks import STATE_FORMAT, LocalChunks, open_state_db
from indexer.paths import cache_dir
from indexer.sqlite_files import integrity_problem
from retrieval.faces.api import Index
from retrieval.indexes.lexical import LexicalStore
from retrieval.indexes.local_vectors import LocalVectorStore
from retrieval.indexes.static_vectors import StaticVectorStore
from retrieval.indexes.trigram_index import TrigramStore
from sync.checkout.checkout_id import kept_id_problem
from sync.checkout.checkouts import find_recorded
from sync.checkout.config import (
    ConfigError,
    NoIndexError,
    RepoConfig,
    codeveil_dir,
    find_root,
    load_config,
    state_path,
    store_path,
)
from sync.checkout.index_state import recorded_workspace
from sync.checkout.refs import ref_id, ref_name
from sync.crypto import ciphers
from sync.crypto.keys import ENV_KEY, WorkspaceKey, key_path, load_key
from sync.crypto.pages import PageIndex, opened_rows
from sync.crypto.sealed_rows import RowSealer
from sync.records import DEFAULT_REF
from sync.store.embedded.registry import Store
from sync.store.embedded.workspace import WorkspaceStore
from sync.syncer.syncer import SyncReport
from sync.syncer.tree_rows import read_tree_rows
from sync.workspace.config_recovery import recover_config

# A cached vector of this model whose norm is further than this from 1 is damaged.
NORM_TOLERANCE = 1e-2


@dataclass
class Finding:
    """One file checked: `problem` is None when it is fine."""

    path: str
    problem: str | None = None
    repaired: str | None = None  # what the repair did, once done
    # Worth repairing but not wrong: a teammate's cache lacks the vectors of chunks it
    # never embedded, exactly as an emptied one does. Does not fail the check.
    advisory: bool = False


@dataclass
class DoctorReport:
    root: Path
    findings: list[Finding] = field(default_factory=list)
    index: SyncReport | None = None  # the index run by the repair, if any
    remaining: list[Finding] = field(default_factory=list)  # still wrong after repairing

    @property
    def healthy(self) -> bool:
        return not any(f for f in self.remaining if not f.advisory) and all(
            f.problem is None or f.repaired or f.advisory for f in self.findings)

    def lines(self) -> list[str]:
        out = []
        for f in self.findings:
            if f.problem is None:
                out.append(f"ok        {f.path}")
            elif f.advisory and not f.repaired:
                out.append(f"note      {f.path}: {f.problem}")
            elif f.repaired:
                out.append(f"repaired  {f.path}: {f.problem} -> {f.repaired}")
            else:
                out.append(f"PROBLEM   {f.path}: {f.problem}")
        out += [f"PROBLEM   {f.path}: {f.problem} (still, after repairing)"
                for f in self.remaining]
        return out


@dataclass
class _Plan:
    """Which repairs the checks asked for."""

    aside: list[tuple[Path, Finding]] = field(default_factory=list)  # rename, rebuild
    config: Finding | None = None  # config.json unreadable: rebuilt from store and key
    config_aside: bool = False  # config.json readable but wrong: moved aside first
    rebuild_store: Finding | None = None
    reupload: list[Finding] = field(default_factory=list)
    embed: list[Finding] = field(default_factory=list)
    index: list[Finding] = field(default_factory=list)
    resync: list[Finding] = field(default_factory=list)  # a tree the index puts back
    retry: list[tuple[Path, Finding]] = field(default_factory=list)  # a record to clear


def doctor(path: str | Path = ".", *, repair: bool = False,
           embedder: Embedder | None = None) -> DoctorReport:
    """Check the index of the folder at (or above) `path`; with `repair`, fix what can
    be fixed and check again. The report lists every file looked at."""
    root = _root(Path(path))
    report, plan = _check(root, embedder)
    if not repair or not any(f.problem for f in report.findings):
        return report
    if plan.config is not None:
        # Nothing else can be checked without the config: rebuild it, then check again.
        if plan.config_aside:
            _aside(codeveil_dir(root) / "config.json")
        try:
            recovered = recover_config(root)
        except CodeveilError as exc:
            report.remaining = [Finding(plan.config.path, f"{plan.config.problem}; {exc}")]
            return report
        rebuilt = plan.config
        rebuilt.repaired = (
            "rebuilt from the store's registry and the key file" if recovered.server is None
            else f"rebuilt for workspace {recovered.workspace_id} on {recovered.server}"
                 " from this machine's record of the checkout")
        report, plan = _check(root, embedder)
        report.findings[0] = rebuilt
        if not any(f.problem for f in report.findings[1:]):
            return report
    if report.findings[0].problem and not report.findings[0].repaired:
        # No config or no key: an index run now would start a new workspace.
        report.remaining = [report.findings[0]]
        return report
    _repair(root, plan, embedder, report)
    after, _ = _check(root, embedder)
    report.remaining = [f for f in after.findings if f.problem is not None]
    return report


def _key_source(workspace_id: str) -> str:
    """Where the key of `workspace_id` is read from: CODEVEIL_KEY when it is set, else
    its file."""
    return ENV_KEY if os.environ.get(ENV_KEY, "").strip() else str(key_path(workspace_id))


def _root(start: Path) -> Path:
    """The repo's root; also a folder whose config.json is gone but whose embedded store
    is there, so that --repair can rebuild the config."""
    try:
        return find_root(start)
    except NoIndexError:
        if (store_path(start.resolve()) / "registry.sqlite").is_file():
            return start.resolve()
        recorded = find_recorded(start)  # a checkout of a workspace on a server
        if recorded is not None:
            return Path(recorded.root)
        raise


# -- checks -----------------------------------------------------------------------------


def _check(root: Path, embedder: Embedder | None) -> tuple[DoctorReport, _Plan]:
    report, plan = DoctorReport(root), _Plan()
    folder = codeveil_dir(root)
    config_finding = Finding(str(folder / "config.json"))
    report.findings.append(config_finding)
    try:
        config = load_config(root)
    except (ConfigError, NoIndexError) as exc:
        config_finding.problem = str(exc)
        plan.config = config_finding
        return report, plan
    except CodeveilError as exc:
        config_finding.problem = str(exc)
        return report, plan
    try:
        key = load_key(config.workspace_id)
    except CodeveilError as exc:
        config_finding.path = _key_source(config.workspace_id)  # at fault, not the config
        config_finding.problem = str(exc)
        return report, plan
    idx = Index(root, embedder=embedder)
    try:
        checking = _Checking(root, config, key, idx, report, plan)
        for part in PARTS:
            if part.check is not None:
                part.check(checking)
    finally:
        idx.close()
    return report, plan


@dataclass
class _Checking:
    """What every part's check is given: the repo, its config and key, and the report
    and repair plan it adds to."""

    root: Path
    config: RepoConfig
    key: WorkspaceKey
    idx: Index
    report: DoctorReport
    plan: _Plan


@dataclass(frozen=True)
class Part:
    """A part of the index: the files it keeps (globs under `.codeveil/`, or under the
    cache or config dir as `cache:GLOB`, `config:GLOB`) and how the doctor checks them.
    Each part also checks itself when it is opened (a damaged derived index is rebuilt,
    a damaged SQLite file, config or key is refused in one line naming it and the
    remedy); `store` names the derived index class the part is, so that a test can tell
    that none lacks a check. `check` None: files checked before the parts (config, key),
    or whose content is never read (locks) or read as a hint (a cache of what the server
    said), ignored when damaged."""

    name: str
    owns: tuple[str, ...]
    check: Callable[[_Checking], None] | None
    store: type | None = None


def _check_checkout_id(c: _Checking) -> None:
    """The id that names this checkout's ref (sync.checkout.checkout_id): checked before any
    other part, since opening the tree would make a new one in its place."""
    if not state_path(c.root).exists():
        return  # never indexed: its first index makes the id
    path = codeveil_dir(c.root) / "checkout.json"
    f = Finding(str(path))
    c.report.findings.append(f)
    bad = kept_id_problem(c.root)
    if bad is not None:
        f.problem = (f"{bad}; `codeveil index` (or `doctor --repair`) gives this checkout an "
                     "id of its own and moves its tree to it")
        c.plan.resync.append(f)


def _check_state(c: _Checking) -> None:
    root, report, plan = c.root, c.report, c.plan
    path = state_path(root)
    f = Finding(str(path))
    report.findings.append(f)
    if not path.exists():
        f.problem = "missing (searches would lose their lexical side and exact scores)"
        plan.index.append(f)
        return
    bad = integrity_problem(path)
    if bad is not None:
        f.problem = f"corrupt ({bad})"
        plan.aside.append((path, f))
        return
    newer = sqlite_format_problem(path, what="the client state", version=STATE_FORMAT)
    if newer is not None:
        f.problem = newer
        plan.aside.append((path, f))
        return
    with _state(root) as local:
        if not local.count_files():
            f.problem = "holds no chunks"
            plan.index.append(f)
            return
    db = open_state_db(path)
    try:
        held = recorded_workspace(db)
    finally:
        db.close()
    if held is not None and held != c.config.workspace_id:
        f.problem = (f"holds the files of workspace {held}, not of {c.config.workspace_id}"
                     " (another checkout's copy?)")
        plan.aside.append((path, f))


def _check_cache(c: _Checking) -> None:
    root, idx, report, plan, sealed = c.root, c.idx, c.report, c.plan, c.config.sealed
    path = cache_dir() / "embeddings.sqlite"  # checked before the cache opens it
    f = Finding(str(path))
    report.findings.append(f)
    bad = integrity_problem(path) if path.exists() else None
    if bad is not None:
        f.problem = f"corrupt ({bad})"
        plan.aside.append((path, f))
        return
    newer = (sqlite_format_problem(path, what="the embedding cache", version=CACHE_FORMAT)
             if path.exists() else None)
    if newer is not None:
        f.problem = newer
        plan.aside.append((path, f))
        return
    cached = idx.embedder
    dim, cache = cached.dim, cached.cache
    damaged = sum(
        1 for vec in cache.vectors_of_size(dim)
        if not np.isfinite(vec).all() or abs(float(np.linalg.norm(vec)) - 1.0) > NORM_TOLERANCE
    )
    if damaged:
        f.problem = f"{damaged} cached vectors of dim {dim} are not finite unit vectors"
        plan.aside.append((path, f))
        return
    if not _state_readable(root):
        return
    with _state(root) as local:
        texts = [c.embed_text for _rowid, c in local.iter_all()]
        # Only a sealed workspace's search ranks the header vectors.
        headers = sorted(local.headers()) if sealed else []
    lacking = []
    # Distinct texts: chunks with the same path, symbol and code share one vector, and
    # `known` answers each key once.
    keys = sorted({cache_key(cached.model_id, t) for t in texts})
    missing = len(keys) - len(cache.known(keys))
    if missing:
        lacking.append(f"the vectors of {missing} of {len(keys)} distinct local chunks (their"
                       " scores are the server's approximate ones; normal for a teammate's"
                       " chunks)")
    header_keys = sorted({cache_key(cached.model_id, h) for h in headers})
    missing = len(header_keys) - len(cache.known(header_keys))
    if missing:
        lacking.append(f"the header vectors of {missing} of {len(header_keys)} chunk headers"
                       " (search ranks their chunks by the code only)")
    if lacking:
        f.problem = f"lacks {' and '.join(lacking)}: --repair embeds them"
        f.advisory = True
        plan.embed.append(f)


def _check_lexical(c: _Checking) -> None:
    report, plan = c.report, c.plan
    folder = codeveil_dir(c.root) / "lexical"
    f = Finding(str(folder))
    report.findings.append(f)
    if LexicalStore(folder).damaged():
        f.problem = "damaged (searches rebuild it each time until it is saved again)"
        plan.aside.append((folder, f))


def _check_vectors(c: _Checking) -> None:
    config, report, plan = c.config, c.report, c.plan
    folder = codeveil_dir(c.root) / "vectors"
    f = Finding(str(folder))
    report.findings.append(f)
    store = LocalVectorStore(folder)
    bad = store.problem(config.model_id, config.dim)
    if bad is not None:
        f.problem = f"damaged ({bad}; the next search rebuilds it)"
        plan.aside.append((folder, f))
        return
    failed = store.approx_failure()
    if failed is not None:
        record, why = failed
        # Search still answers, exactly and slower: worth a repair, not a failed check.
        g = Finding(str(record), advisory=True,
                    problem=f"the approximate vector index could not be built ({why}); "
                            "search is exact")
        report.findings.append(g)
        plan.retry.append((record, g))


def _check_static(c: _Checking) -> None:
    from indexer.errors import EmbedderError

    folder = codeveil_dir(c.root) / "static"
    f = Finding(str(folder))
    c.report.findings.append(f)
    try:
        bad = StaticVectorStore(folder).problem()
    except EmbedderError as exc:  # the model, not the index: a search answers by words
        f.problem = str(exc)
        return
    if bad is not None:
        f.problem = f"damaged ({bad}; the next search rebuilds it)"
        c.plan.aside.append((folder, f))


def _check_trigrams(c: _Checking) -> None:
    folder = codeveil_dir(c.root) / "trigrams"
    f = Finding(str(folder))
    c.report.findings.append(f)
    bad = TrigramStore(folder).problem()
    if bad is not None:
        f.problem = f"damaged ({bad}; the next grep rebuilds it)"
        c.plan.aside.append((folder, f))


def _check_builder(c: _Checking) -> None:
    """The vector builder given up (sync.daemon.builder): search answers by words and names,
    and by meaning only for what was embedded before; worth a repair, not a failure."""
    from sync.daemon.builder import Builder

    report, plan = c.report, c.plan
    builder = Builder(c.root)
    why = builder.given_up()
    if why is not None:
        f = Finding(str(builder.files.failed), advisory=True,
                    problem=f"the vector builder was given up: {why}; run `codeveil index"
                            f" --wait` to build the vectors here (log: {builder.files.log})")
        report.findings.append(f)
        plan.retry.append((builder.files.failed, f))


def _check_store(c: _Checking) -> None:
    if c.config.server is None:
        _check_embedded_store(c.root, c.config, c.key, c.report, c.plan)
    else:
        _check_server(c.idx, c.config, c.key, c.report, c.plan)


def _check_embedded_store(root: Path, config: RepoConfig, key: WorkspaceKey,
                          report: DoctorReport, plan: _Plan) -> None:
    data = store_path(root)
    registry = Finding(str(data / "registry.sqlite"))
    report.findings.append(registry)
    bad = integrity_problem(data / "registry.sqlite")
    if bad is not None:
        registry.problem = f"corrupt ({bad})"
        plan.rebuild_store = registry
        return
    ws_dir = data / "workspaces" / config.workspace_id
    with Store(data) as store:
        held = store.workspace_ids()
    if config.workspace_id not in held:
        if ws_dir.is_dir() or not held:
            # The workspace's folder is here and the registry no longer lists it.
            registry.problem = (f"does not list workspace {config.workspace_id}, the one"
                                " config.json names (lost or replaced)")
            plan.rebuild_store = registry
        else:  # config.json names a workspace this store never held: another checkout's
            config_finding = report.findings[0]
            config_finding.problem = (
                f"names workspace {config.workspace_id}, which the embedded store does not"
                f" hold (it holds {', '.join(held)}): another checkout's config?")
            plan.config, plan.config_aside = config_finding, True
        return
    f = Finding(str(ws_dir))
    report.findings.append(f)
    try:
        with Store(data) as store:
            ws = store.workspace(config.workspace_id)
            problems = ws.check()
            if problems:
                f.problem = "; ".join(problems)
                plan.rebuild_store = f
                return
            if ws.info().key_check != key.key_check:
                # The key at fault, not the store: no repair makes the right one.
                f.path = _key_source(config.workspace_id)
                f.problem = (f"is not the key workspace {config.workspace_id} was built"
                             " with; import the right one (`codeveil key import`)")
                return
            lost = _files_differing(root, config, key, ws)
    except CodeveilError as exc:
        f.problem = str(exc)
        plan.rebuild_store = f
        return
    if lost:
        f.problem = (f"holds other chunks than the local state for {len(lost)} files"
                     f" (e.g. {lost[0]})")
        plan.reupload.append(f)


def _files_differing(root: Path, config: RepoConfig, key: WorkspaceKey,
                     ws: WorkspaceStore) -> list[str]:
    """Local files whose rows in the store are not those of their local chunks: the
    chunk hashes sealed in each file's rows, against the local chunk table's."""
    if not _state_readable(root):
        return []
    sealer = RowSealer(key, config.workspace_id, config.dim) if config.sealed else None
    # The tree of this checkout's ref: a sealed embedded store keeps one per ref.
    ref = ref_id(key, ref_name(root)) if config.sealed else DEFAULT_REF
    if sealer is not None:
        return _paged_files_differing(root, key, ws, ref, sealer)
    out = []
    with _state(root) as local:
        paths = sorted(local.file_digests())
        for start in range(0, len(paths), 512):
            part = paths[start : start + 512]
            keys = [ciphers.node_key(key, p) for p in part]
            rows = ws.file_rows(keys, ref)
            for path, file_key in zip(part, keys, strict=True):
                want = sorted(c.chunk_hash for c in local.for_file(path))
                hashes = (_chunk_hash(sealer, key, config.workspace_id, file_key, r, b)
                          for r, b in rows.get(file_key, []))
                have = sorted(h for h in hashes if h is not None)  # None: padding
                if have != want:
                    out.append(path)
    return out


def _paged_files_differing(root: Path, key: WorkspaceKey, ws: WorkspaceStore, ref: bytes,
                           sealer: RowSealer) -> list[str]:
    """`_files_differing` of a sealed workspace, whose rows are in pages (sync.crypto.pages):
    the live rows of the pages this machine knows and the store still holds, by the file
    they name, against the local chunk table."""
    db = open_state_db(state_path(root))
    try:
        local = LocalChunks(db)
        digests = local.file_digests()
        pages = sorted(PageIndex(db, read_only=True).known())
        held: dict[str, set[tuple[int, int, bytes]]] = {}
        for start in range(0, len(pages), 512):
            for page, rows in ws.file_rows(pages[start : start + 512], ref).items():
                for row in opened_rows(sealer, key, page, rows):
                    path = row.meta.path
                    if path in digests and row.value == ciphers.node_value(key, path,
                                                                          digests[path]):
                        held.setdefault(path, set()).add(
                            (row.meta.start_line, row.meta.end_line, row.meta.chunk_hash))
        out = []
        for path in sorted(digests):
            want = {(c.start_line, c.end_line, c.chunk_hash) for c in local.for_file(path)}
            if held.get(path, set()) != want:
                out.append(path)
        return out
    finally:
        db.close()


def _chunk_hash(sealer: RowSealer | None, key: WorkspaceKey, workspace_id: str,
                file_key: bytes, row_id: bytes, blob: bytes) -> bytes | None:
    if sealer is not None:
        opened = sealer.open(row_id, file_key, blob)
        return None if opened is None else opened.meta.chunk_hash
    return ciphers.open_meta(key, workspace_id, row_id, blob).chunk_hash


def _check_server(idx: Index, config: RepoConfig, key: WorkspaceKey, report: DoctorReport,
                  plan: _Plan) -> None:
    f = Finding(f"{config.server} (workspace {config.workspace_id})")
    report.findings.append(f)
    try:
        status = idx.status(server=True)
        gaps = (_server_gaps(idx, config, key)
                if config.sealed and idx.offline is None else {})
    except CodeveilError as exc:
        # The server's files are its operator's to repair (`codeveil doctor --data DIR`
        # on the server); a client can only re-send once it answers again.
        f.problem = str(exc)
        return
    if idx.offline is not None:
        f.problem = f"{idx.offline.summary()}: its tree of this checkout is not checked"
        return
    tree = status.server_tree
    problems = []
    if tree is not None and not tree["in_step"]:
        # Another checkout syncing the same ref (CODEVEIL_REF), or an interrupted sync:
        # a sync puts this checkout's files back.
        problems.append(str(tree["summary"]))
        plan.resync.append(f)
    if gaps:
        path = min(gaps)
        problems.append(f"the server's tree holds {len(gaps)} files of this checkout"
                        f" without all their rows ({sum(gaps.values())} chunks; e.g. {path})")
        plan.reupload.append(f)
    if problems:
        f.problem = "; ".join(problems)


def _server_gaps(idx: Index, config: RepoConfig, key: WorkspaceKey) -> dict[str, int]:
    """path -> its chunks without a row, for each file whose leaf in the server's tree
    of this checkout's ref is this checkout's version (sync.syncer.tree_rows): asked of the
    server, whatever this machine's page index believes."""
    root, _, _, client = idx.workspace.open_or_last_known()
    if idx.workspace.offline is not None or not _state_readable(root):
        return {}
    ref = client.ref
    client.ref = ref_id(key, ref_name(root))
    try:
        tree = read_tree_rows(client, key, RowSealer(key, config.workspace_id, config.dim))
    finally:
        client.ref = ref
    with _state(root) as local:
        return tree.gaps(key, local.file_digests(), local.places())


#: The parts of an index and the files each keeps, in the order the doctor checks them
#: (config.json and the key are checked before: nothing else can be without them).
#: Every file under `.codeveil/`, the cache dir and the config dir belongs to one
#: (tests/test_corruption walks them: a new file kind or derived index cannot come
#: without its part and check).
PARTS: tuple[Part, ...] = (
    # Checked first, in `_check`: nothing else can be checked without them.
    Part("config", ("config.json",), None),
    Part("workspace key", ("config:keys/*.key",), None),
    Part("checkout id", ("checkout.json", "checkout.lock"), _check_checkout_id),
    Part("client state", ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"),
         _check_state),
    Part("embedding cache", ("cache:embeddings.sqlite", "cache:embeddings.sqlite-wal",
                             "cache:embeddings.sqlite-shm"), _check_cache),
    Part("lexical index", ("lexical/*",), _check_lexical, LexicalStore),
    Part("vector index", ("vectors/*",), _check_vectors, LocalVectorStore),
    Part("static vector index", ("static/*",), _check_static, StaticVectorStore),
    Part("grep index", ("trigrams/*",), _check_trigrams, TrigramStore),
    # Its state and log are read defensively (a damaged one is ignored and rewritten);
    # a build given up is what is worth reporting.
    Part("vector builder", ("builder.*",), _check_builder),
    Part("store", ("store/*", "store/workspaces/*", "store/workspaces/*/*",
                   "store/workspaces/*/chunks.lance/*", "store/workspaces/*/chunks.lance/*/*"),
         _check_store),
    # A cache of what the server last answered, ignored when unreadable; markers and
    # locks hold nothing to check.
    Part("server contact", ("server.json", "create-on-server", "config:tokens/*.token",
                            "config:checkouts/*.json"), None),
    Part("daemon", ("daemon.*",), None),
    Part("folder", (".gitignore", "init.lock"), None),
)


def check_data_dir(data: str | Path) -> DoctorReport:
    """Check a server's data dir (`codeveil doctor --data DIR`): the registry, then each
    workspace's tree, chunk table and snapshot. Run it with the server stopped or not;
    it only reads. Damaged workspaces are the operator's to restore from a backup."""
    data = Path(data)
    report = DoctorReport(data)
    registry = Finding(str(data / "registry.sqlite"))
    report.findings.append(registry)
    if not (data / "registry.sqlite").exists():
        registry.problem = "missing: this is not a codeveil data dir"
        return report
    bad = integrity_problem(data / "registry.sqlite")
    if bad is not None:
        registry.problem = f"corrupt ({bad}); restore it from a backup of the data dir"
        return report
    with Store(data) as store:
        for workspace_id in store.workspace_ids():
            f = Finding(str(data / "workspaces" / workspace_id))
            report.findings.append(f)
            try:
                problems = store.workspace(workspace_id).check()
            except CodeveilError as exc:
                problems = [str(exc)]
            if problems:
                f.problem = "; ".join(problems)
    return report


def _state_readable(root: Path) -> bool:
    path = state_path(root)
    return (path.exists() and integrity_problem(path) is None
            and sqlite_format_problem(path, what="", version=STATE_FORMAT) is None)


@contextlib.contextmanager
def _state(root: Path) -> Iterator[LocalChunks]:
    db = open_state_db(state_path(root))
    try:
        yield LocalChunks(db)
    finally:
        db.close()


# -- repairs ----------------------------------------------------------------------------


def _aside(path: Path) -> Path:
    """Rename a damaged file or folder (and SQLite's -wal/-shm beside it) out of the way."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    if path.exists():
        path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


def _repair(root: Path, plan: _Plan, embedder: Embedder | None, report: DoctorReport) -> None:
    for path, f in plan.aside:
        f.repaired = f"moved to {_aside(path).name}, rebuilt"
    for path, f in plan.retry:
        path.unlink(missing_ok=True)
        f.repaired = "cleared: the next search builds it again"
    reupload = bool(plan.reupload)
    if plan.rebuild_store is not None:
        config = load_config(root)
        key = load_key(config.workspace_id)
        moved = _aside(store_path(root))
        with Store(store_path(root)) as store:
            store.create_workspace(config.dim, config.model_id, key.key_check,
                                   workspace_id=config.workspace_id, mode=config.mode)
        plan.rebuild_store.repaired = (f"store moved to {moved.name}; rebuilt from the"
                                       " working tree")
        reupload = True
    # The index rebuilds a missing or moved state (and re-embeds from the cache), a
    # moved cache (by embedding), and sends every file again if the store lost rows.
    with Index(root, embedder=embedder) as idx:
        report.index = idx.index(wait=True, reupload=reupload)
        chunks = _all_chunks(root)
        config = load_config(root)
        sealed = config.sealed
        missing = [c.embed_text for c in chunks]
        missing += sorted({c.header for c in chunks}) if sealed else []
        idx.embedder.embed(missing)  # fills what the cache lacks; a no-op when it is full
        db = open_state_db(state_path(root))
        try:
            if sealed:
                # Recorded, and the change stamp bumped: the next search re-reads the
                # chunks its vector index holds without a header vector.
                LocalChunks(db).mark_headers_embedded(idx.embedder.model_id)
            LexicalStore(codeveil_dir(root) / "lexical").current(db)  # rebuilt and saved
            TrigramStore(codeveil_dir(root) / "trigrams").current(db)
            if sealed:  # only a sealed workspace searches its own vectors
                LocalVectorStore(codeveil_dir(root) / "vectors").current(
                    db, idx.embedder.cache, config.model_id, config.dim)
        finally:
            db.close()
    for f in plan.reupload:
        f.repaired = "sent every file again"
    for f in plan.embed:
        f.repaired = "embedded the missing chunks"
    for f in plan.index:
        f.repaired = "rebuilt from the working tree"
    for f in plan.resync:
        f.repaired = "synced this checkout's files to its ref's tree again"


def _all_chunks(root: Path) -> list:
    with _state(root) as local:
        return [c for _rowid, c in local.iter_all()]


__all__ = ["PARTS", "DoctorReport", "Finding", "Part", "check_data_dir", "doctor"]
