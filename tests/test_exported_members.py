"""The faces of the three packages, of the store and of the lexical and vector indexes:
exactly these names, each importable, none eager."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

EXPORTED = {
    "indexer": [
        "CachedEmbedder", "Chunk", "ChunkLocation", "CodeveilError", "Embedder", "EmbedderError",
        "EmbeddingCache", "IndexerError", "WalkResult", "chunk_file", "default_embedder",
        "walk_repo",
    ],
    "sync": [
        "HttpClient", "LocalClient", "Store", "StoreClient", "StoreError", "SyncError",
        "SyncReport", "Syncer", "WorkspaceKey", "create_key", "load_key",
    ],
    "sync.store": [
        "SNAPSHOT", "STORE_FORMAT", "AuthError", "BadRequest", "IndexPolicy",
        "PermissionDenied", "Store", "StoreCorrupt", "StoreError", "StoreOptions",
        "WorkspaceExists", "WorkspaceNotFound", "WorkspaceStore", "fid_of",
    ],
    "retrieval": [
        "CodeveilError", "CorruptFileError", "Coverage", "Hit", "Index", "KeyMissingError",
        "ModelMismatchError", "MultiIndex", "NoIndexError", "SearchError", "ServerUnavailable",
        "SyncReport", "WorkspaceStatus", "WrongKeyError",
    ],
    "retrieval.indexes.lexical": [
        "LexicalIndex", "LexicalStore", "Tokenizer", "lexical_text",
    ],
    "retrieval.indexes.local_vectors": [
        "DELTA_FILE", "FORMAT_VERSION", "MERGE_SHARE", "ONE_THREAD_VALUES", "REBUILD_SHARE",
        "LocalVectorIndex", "LocalVectorStore", "one_blas_thread", "read_stamp",
    ],
}
PACKAGES = {package.split(".")[0] for package in EXPORTED}


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_exported_names_are_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(EXPORTED[package])
    assert dir(module) == sorted(EXPORTED[package])


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_every_exported_name_resolves_to_its_home(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        if isinstance(value, int | float | str):  # a constant (STORE_FORMAT) has no home
            continue
        home = getattr(value, "__module__", None)
        assert home is not None and home.split(".")[0] in PACKAGES, (name, home)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018


def test_importing_the_faces_loads_no_heavy_stack() -> None:
    """A fresh interpreter imports all the faces without torch, LanceDB or faiss."""
    probe = ("import sys, indexer, sync, sync.store, retrieval, retrieval.indexes.lexical,"
             " retrieval.indexes.local_vectors; "
             "print(sorted(m for m in ('torch', 'lancedb', 'faiss', 'onnxruntime')"
             " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
