"""Imports run one way: retrieval -> sync -> indexer, and within the embedders from the
registry down to the backends. Read from the source (every import, also those inside
functions), so a lazy import cannot hide a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"indexer": 0, "sync": 1, "retrieval": 2}


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, set[str]]:
    """Every module of `package`, its subpackages' (sync.daemon.loop) included."""
    out = {}
    for p in (ROOT / package).rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = imports_of(p)
    return out


def test_no_import_runs_upward() -> None:
    upward = []
    for package, layer in LAYERS.items():
        for module, names in _modules(package).items():
            for name in names:
                top = name.split(".")[0]
                if LAYERS.get(top, -1) > layer:
                    upward.append((module, name))
    assert not upward, upward


def test_the_embedders_import_one_way() -> None:
    mods = _modules("indexer")
    backends = {"indexer.onnx_embedder", "indexer.cuda_embedder", "indexer.ray_embedder"}

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    # The interface module knows no backend and no registry.
    for target in (*backends, "indexer.embedder_registry"):
        assert not imported("indexer.embedder", target), target
    # The registry does not reach the remote pool, which builds on it.
    assert not imported("indexer.embedder_registry", "indexer.ray_embedder")
    # The local backends do not reach back up to the registry, nor ONNX to CUDA.
    for backend in ("indexer.onnx_embedder", "indexer.cuda_embedder"):
        assert not imported(backend, "indexer.embedder_registry"), backend
    assert not imported("indexer.onnx_embedder", "indexer.cuda_embedder")


def test_the_local_indexes_build_on_one_machinery_and_not_on_each_other() -> None:
    mods = _modules("retrieval")
    indexes = ("retrieval.indexes.lexical", "retrieval.indexes.local_vectors",
               "retrieval.indexes.trigram_index")

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    for module in (m for m in mods if m.startswith("retrieval.indexes.derived")):
        assert not any(imported(module, t) for t in indexes), module
    for module in mods:
        own = next((t for t in indexes if module == t or module.startswith(t + ".")), None)
        if own is not None:
            assert not any(imported(module, t) for t in indexes if t != own), module
            assert any(imported(m, "retrieval.indexes.derived") for m in mods
                       if m == own or m.startswith(own + ".")), own


def test_ranking_never_calls_back_into_what_assembles_a_search() -> None:
    mods = _modules("retrieval")
    for target in ("retrieval.faces.api", "retrieval.search.searcher", "retrieval.faces.multi"):
        for module in ("retrieval.search.fusion", "retrieval.search.server_vectors",
                       "retrieval.search.query", "retrieval.search.grouping"):
            assert not any(n == target or n.startswith(target + ".")
                           for n in mods[module]), (module, target)


# sync/ by job: each folder (and the vocabulary modules at the top, which both sides
# speak) and the parts of sync it may import. The client's folders (crypto, checkout,
# transport, syncer) never reach the server's store nor the server; the store and the
# server never reach the key code; the workspace and the daemon put the others together
# (a workspace without a server keeps its store in-process, through
# sync.store.local_client).
VOCABULARY = {"records", "wire", "errors", "client"}
SYNC_FOLDERS: dict[str, set[str]] = {
    "vocabulary": set(),
    "crypto": {"vocabulary"},
    "checkout": {"vocabulary", "crypto"},
    "store": {"vocabulary"},
    "transport": {"vocabulary", "crypto", "checkout"},
    "syncer": {"vocabulary", "crypto", "checkout"},
    "server": {"vocabulary", "store"},
    "workspace": {"vocabulary", "crypto", "checkout", "store", "transport", "syncer"},
    "daemon": {"vocabulary", "crypto", "checkout", "transport", "syncer", "workspace"},
}


def _sync_folder(module: str) -> str | None:
    """The folder of sync a module (or an imported name) belongs to; None for the face."""
    parts = module.split(".")
    if parts[0] != "sync" or len(parts) < 2:
        return None
    return "vocabulary" if parts[1] in VOCABULARY else parts[1]


def test_sync_is_laid_out_by_job_and_imports_one_way() -> None:
    mods = _modules("sync")
    folders = {_sync_folder(m) for m in mods} - {None}
    assert folders == set(SYNC_FOLDERS), folders
    wrong = []
    for module, names in mods.items():
        own = _sync_folder(module)
        if own is None:
            continue
        for name in names:
            target = _sync_folder(name)
            if target is not None and target != own and target not in SYNC_FOLDERS[own]:
                wrong.append((module, name))
    assert not wrong, wrong


def test_the_store_imports_no_key_code() -> None:
    # The store keeps what clients send and never holds a key: no module of sync.store
    # reaches the keys, the ciphers or the sealing of rows (a checker that opens a store's
    # rows with a key, bench.store_contents, lives outside it).
    key_code = ("sync.crypto", "sync.checkout", "sync.transport")
    mods = _modules("sync")
    store = [m for m in mods if m == "sync.store" or m.startswith("sync.store.")]
    assert len(store) > 5, store
    reached = [(m, n) for m in store for n in mods[m]
               if any(n == t or n.startswith(t + ".") for t in key_code)]
    assert not reached, reached


def test_the_embedded_workspace_is_composed_of_members_built_on_its_files() -> None:
    # sync.store.embedded.workspace holds the members and the write order; each member is built
    # on the workspace's files and never reaches back up to the workspace, and the files
    # are built on none of them (docs/architecture.md, "The embedded workspace"). The
    # rows of each mode are members of their own, chosen when the workspace opens.
    mods = _modules("sync")
    files = "sync.store.embedded.workspace_files"
    held = ("sync.store.embedded.sealed_rows", "sync.store.embedded.search_rows",
            "sync.store.embedded.pool_ops", "sync.store.embedded.workspace_checks")
    members = (*held, "sync.store.embedded.lance_rows", "sync.store.embedded.search_index")

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    for member in (files, *held):
        assert imported("sync.store.embedded.workspace", member), member
    for member in (files, *members):
        assert not imported(member, "sync.store.embedded.workspace"), member
    for member in members:
        assert imported(member, files), member
        assert not imported(files, member), member
    # The two modes' rows know nothing of each other.
    for a, b in (held[:2], held[1::-1]):
        assert not imported(a, b), (a, b)
    # Members, not base classes: the workspace derives from nothing of its own.
    tree = ast.parse((ROOT / "sync" / "store" / "embedded" / "workspace.py").read_text())
    (store,) = [n for n in tree.body if isinstance(n, ast.ClassDef)
                and n.name == "WorkspaceStore"]
    assert store.bases == []


def test_the_postgres_workspace_holds_one_member_per_mode() -> None:
    mods = _modules("sync")
    modes = ("sync.store.postgres.sealed_rows", "sync.store.postgres.search_rows")

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    for member in modes:
        assert imported("sync.store.postgres.workspace", member), member
        assert not imported(member, "sync.store.postgres.workspace"), member
    assert not imported(modes[0], modes[1]) and not imported(modes[1], modes[0])


# A branch on the workspace's mode: its test names the mode, or the stand-in the embedded
# workspace once had for it (a search index of None).
MODE_TEST = re.compile(r"\bsealed\b|\bmode\b|MODE_SEALED|MODE_SERVER_SEARCH|search_index"
                       r"|\bindex is (not )?None")


def mode_branches(path: Path) -> list[str]:
    """The `if`s, conditional expressions and comprehension filters of `path` whose
    test names the mode."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If | ast.IfExp):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        else:
            continue
        found += [f"{path.name}:{t.lineno}: {ast.unparse(t)}" for t in tests
                  if MODE_TEST.search(ast.unparse(t))]
    return found


def test_the_workspaces_never_branch_on_the_mode() -> None:
    # The mode is a member chosen when a workspace opens (sync.store.core.mode_rows): its
    # rows of each mode are classes of their own, and the workspaces, their pool and
    # ref requests and their checks call it instead of asking which mode they are of.
    store = ROOT / "sync" / "store"
    paths = [store / "embedded" / name for name in (
        "workspace.py", "pool_ops.py", "workspace_checks.py", "sealed_rows.py",
        "search_rows.py", "pool.py")]
    paths += [store / "postgres" / name for name in (
        "workspace.py", "pool.py", "conn.py", "sealed_rows.py", "search_rows.py", "tree.py")]
    found = [b for p in paths for b in mode_branches(p)]
    assert not found, found


def _store_graph() -> dict[str, set[str]]:
    """sync.store's modules and the store modules each imports, read from the source:
    every import, inside functions and `if TYPE_CHECKING:` blocks too. An import names the
    deepest module it reaches (`from sync.store.postgres import schema` names
    sync.store.postgres.schema); the parent packages Python loads on the way are not
    edges, as the face (sync.store) imports its names on first use only."""
    mods = {m: names for m, names in _modules("sync").items()
            if m == "sync.store" or m.startswith("sync.store.")}
    graph: dict[str, set[str]] = {}
    for module, names in mods.items():
        reached = set()
        for name in names:
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                if ".".join(parts[:cut]) in mods:
                    reached.add(".".join(parts[:cut]))
                    break
        graph[module] = reached - {module}
    return graph


def test_the_store_has_no_relative_imports() -> None:
    # The graph below reads absolute imports only.
    for path in (ROOT / "sync" / "store").rglob("*.py"):
        tree = ast.parse(path.read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], path


def test_the_store_backends_build_on_the_core_and_not_on_each_other() -> None:
    graph = _store_graph()
    folders = {"core": "sync.store.core", "embedded": "sync.store.embedded",
               "postgres": "sync.store.postgres"}

    def inside(module: str, folder: str) -> bool:
        return module == folders[folder] or module.startswith(folders[folder] + ".")

    assert sum(inside(m, "embedded") for m in graph) > 5, sorted(graph)
    assert sum(inside(m, "postgres") for m in graph) > 5, sorted(graph)
    wrong = []
    for module, reached in graph.items():
        for target in reached:
            for a, b in (("embedded", "postgres"), ("postgres", "embedded")):
                if inside(module, a) and inside(target, b):
                    wrong.append((module, target))
            # The core imports neither backend, nor what opens them, nor the face.
            if inside(module, "core") and not inside(target, "core"):
                wrong.append((module, target))
    assert not wrong, wrong


def test_the_store_has_no_import_circle() -> None:
    graph = _store_graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError([*path[path.index(module):], module])
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_registry_is_written_once() -> None:
    # The token rules, the caches and close live in sync.store.core.registry; each
    # backend's registry module only keeps its SQL (its RegistryTable).
    rules = {"create_workspace", "authenticate", "create_invitee", "invitees",
             "revoke_invitee", "workspace", "workspace_ids", "close", "_owner",
             "_invitee_owner", "_record", "_check_open"}
    for backend in ("embedded", "postgres"):
        tree = ast.parse((ROOT / "sync" / "store" / backend / "registry.py").read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            bases = {ast.unparse(b) for b in cls.bases}
            if any(b.startswith("Registry[") for b in bases):
                defined = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
                assert not defined & rules, (backend, cls.name, defined & rules)
        assert any(isinstance(n, ast.ClassDef) and any(ast.unparse(b).startswith("Registry[")
                                                       for b in n.bases)
                   for n in tree.body), backend


RETRIEVAL_JOBS = {"indexes": 0, "search": 1, "agent": 1, "faces": 2}


def test_retrievals_four_jobs_import_one_way() -> None:
    """The local indexes know no search, the search and the agent tools no face and not
    each other beyond the result counts, so each job reads on its own."""
    upward = []
    for module, names in _modules("retrieval").items():
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in RETRIEVAL_JOBS:
            continue
        job = parts[1]
        for name in names:
            target = name.split(".")
            if target[0] != "retrieval" or len(target) < 2 or target[1] not in RETRIEVAL_JOBS:
                continue
            if target[1] == job or name == "retrieval.search.limits" or \
                    name.startswith("retrieval.search.limits."):
                continue
            if RETRIEVAL_JOBS[target[1]] >= RETRIEVAL_JOBS[job]:
                upward.append((module, name))
    assert not upward, upward


# A branch of one sync on the workspace's mode: its test names the mode, a flag of it,
# one of the members that only one mode had (the sealer, the cipher, the pages), or what
# the rows member tells of its mode (`searched_here`, `streams`).
SYNC_MODE_TEST = re.compile(r"\bsealed\b|paged|\bpages\b|\bpool\b|\bshared\b|streamed"
                            r"|\bmode\b|sealer|cipher|searched_here|\bstreams\b")
ONE_SYNC_MODE_BRANCHES = 3


def test_one_sync_asks_its_rows_member_and_not_the_mode() -> None:
    # The rows of a sync are one member chosen when the workspace opens
    # (sync.syncer.rows_out.RowsOut: sealed in pages, or searched by the server): the
    # Syncer calls its hooks at each step, and tests what it is told at most these times.
    tree = ast.parse((ROOT / "sync" / "syncer" / "syncer.py").read_text())
    (syncer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Syncer"]
    found = []
    for node in ast.walk(syncer):
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        else:
            continue
        found += [f"syncer.py:{t.lineno}: {ast.unparse(t)}" for t in tests
                  if SYNC_MODE_TEST.search(ast.unparse(t))]
    assert len(found) <= ONE_SYNC_MODE_BRANCHES, found
