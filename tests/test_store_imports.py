"""What importing the store costs a command: measured in a fresh interpreter each."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_lancedb_import_defers_only_its_own_pydantic_models() -> None:
    proc = _fresh("""
        import sys
        from sync.store.embedded.lance_table import import_lancedb
        assert "lancedb" not in sys.modules  # the store's modules alone do not import it
        lancedb = import_lancedb()
        from lance_namespace_urllib3_client.models import ListTablesResponse
        from pydantic._internal import _config
        import pydantic
        # lancedb's namespace models were defined without building their validators ...
        assert not ListTablesResponse.__pydantic_complete__
        # ... and build them when used.
        assert ListTablesResponse(tables=["a"]).tables == ["a"]
        # Everyone else's models are built at definition, as before.
        assert _config.config_defaults["defer_build"] is False
        class Mine(pydantic.BaseModel):
            x: int
        assert Mine.__pydantic_complete__
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_index_and_search_paths_import_no_scipy() -> None:
    proc = _fresh("""
        import sys
        import retrieval.faces.api, retrieval.search.fusion, retrieval.indexes.lexical
        import sync.syncer.syncer
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "lancedb"))
        print(bad)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _first_index(repo: Path) -> dict[str, str]:
    """Index `repo` (sealed, the default) in a process of its own; returns the
    environment the next processes run in."""
    import os

    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing", PYTHONPATH=str(ROOT))
    first = subprocess.run([sys.executable, "-m", "retrieval", "index", "--wait", "-q"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    return env


def _imported_by_an_index(repo: Path, env: dict[str, str], heavy: tuple[str, ...]
                          ) -> list[str]:
    """Which of `heavy` a fresh `codeveil index` process in `repo` imports."""
    probe = textwrap.dedent(f"""
        import json, runpy, sys
        sys.argv = ["codeveil", "index", "--wait", "-q"]
        try:
            runpy.run_module("retrieval.faces.cli", run_name="__main__")
        except SystemExit as exc:
            assert not exc.code, exc.code
        print(json.dumps(sorted(m for m in {list(heavy)!r} if m in sys.modules)))
    """)
    again = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    return json.loads(again.stdout.splitlines()[-1])


def test_a_reindex_with_nothing_to_send_imports_no_index_stack(sample_repo: Path) -> None:
    """Nothing changed: the walk and one root comparison, without faiss, pyarrow,
    lancedb or the parsers (each tens of milliseconds to import, or seconds)."""
    env = _first_index(sample_repo)
    heavy = ("faiss", "pyarrow", "lancedb", "tree_sitter", "torch", "onnxruntime")
    assert _imported_by_an_index(sample_repo, env, heavy) == []


def test_a_sealed_one_file_reindex_imports_no_row_table_stack(sample_repo: Path) -> None:
    """One file edited: its rows are replaced in tree.sqlite, without lancedb, pyarrow
    or faiss (a second of import, for a handful of rows)."""
    env = _first_index(sample_repo)
    edited = sorted(sample_repo.rglob("*.py"))[0]
    edited.write_text(edited.read_text() + "\n\ndef added_later():\n    return 1\n")
    imported = _imported_by_an_index(sample_repo, env, ("faiss", "pyarrow", "lancedb",
                                                       "tree_sitter"))
    assert imported == ["tree_sitter"]  # it did chunk the edited file
