"""Imports run one way: retrieval -> sync -> indexer, and within the embedders from the
registry down to the backends. Read from the source (every import, also those inside
functions), so a lazy import cannot hide a circle."""

from __future__ import annotations

import ast
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
    indexes = ("retrieval.lexical", "retrieval.local_vectors", "retrieval.trigram_index")

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    for module in (m for m in mods if m.startswith("retrieval.derived")):
        assert not any(imported(module, t) for t in indexes), module
    for module in mods:
        own = next((t for t in indexes if module == t or module.startswith(t + ".")), None)
        if own is not None:
            assert not any(imported(module, t) for t in indexes if t != own), module
            assert any(imported(m, "retrieval.derived") for m in mods
                       if m == own or m.startswith(own + ".")), own


def test_ranking_never_calls_back_into_what_assembles_a_search() -> None:
    mods = _modules("retrieval")
    for target in ("retrieval.api", "retrieval.searcher", "retrieval.multi"):
        for module in ("retrieval.fusion", "retrieval.server_vectors", "retrieval.query",
                       "retrieval.grouping"):
            assert not any(n == target or n.startswith(target + ".")
                           for n in mods[module]), (module, target)


def test_the_store_imports_no_key_code() -> None:
    # The store keeps what clients send and never holds a key: no module of sync.store
    # reaches the keys, the ciphers or the sealing of rows (a checker that opens a store's
    # rows with a key, sync.store_contents, lives outside it).
    key_code = ("sync.keys", "sync.crypto", "sync.sealed_rows", "sync.server_search")
    mods = _modules("sync")
    store = [m for m in mods if m == "sync.store" or m.startswith("sync.store.")]
    assert len(store) > 5, store
    reached = [(m, n) for m in store for n in mods[m]
               if any(n == t or n.startswith(t + ".") for t in key_code)]
    assert not reached, reached


def test_the_embedded_workspace_is_composed_of_members_built_on_its_files() -> None:
    # sync.store.workspace holds the members and the write order; each member is built
    # on the workspace's files and never reaches back up to the workspace, and the files
    # are built on none of them (docs/architecture.md, "The embedded workspace").
    mods = _modules("sync")
    files = "sync.store.workspace_files"
    members = ("sync.store.lance_rows", "sync.store.search_index", "sync.store.pool_ops",
               "sync.store.workspace_checks")

    def imported(module: str, target: str) -> bool:
        return any(n == target or n.startswith(target + ".") for n in mods[module])

    for member in (files, *members):
        assert imported("sync.store.workspace", member), member
        assert not imported(member, "sync.store.workspace"), member
    for member in members:
        assert imported(member, files), member
        assert not imported(files, member), member
    # Members, not base classes: the workspace derives from nothing of its own.
    tree = ast.parse((ROOT / "sync" / "store" / "workspace.py").read_text())
    (store,) = [n for n in tree.body if isinstance(n, ast.ClassDef)
                and n.name == "WorkspaceStore"]
    assert store.bases == []
