"""The workspace's lifecycle below retrieval: `sync.workspace.workspace.Workspace` creates, opens,
checks and syncs a repo on its own, without the ranking stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.errors import CodeveilError
from sync.records import MODE_SEALED
from sync.workspace.workspace import ModelMismatchError, Workspace
from tests.conftest import write_repo

ROOT = Path(__file__).resolve().parent.parent


def test_a_workspace_syncs_and_reports_on_its_own(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    repo = write_repo(tmp_path / "repo", {"a.py": "def a():\n    return 1\n",
                                          "pkg/b.py": "def b():\n    return 2\n"})
    ws = Workspace(repo / "pkg", embedder=HashingEmbedder())  # found upward once made
    assert ws.root == (repo / "pkg").resolve()  # nothing to find yet
    with pytest.raises(CodeveilError, match="no codeveil index"):
        ws.open()
    ws.close()
    ws = Workspace(repo, embedder=HashingEmbedder())
    report = ws.sync()
    assert report.files_changed == 2 and report.chunks_total == 2
    root, config, key, client = ws.open()
    assert root == repo.resolve() and config.mode == MODE_SEALED
    assert client.info().key_check == key.key_check
    assert ws.status()["server_chunks"] == ws.status()["chunks"] == 2
    assert ws.sync().files_changed == 0
    ws.close()
    with pytest.raises(ModelMismatchError, match="holds vectors of"):
        Workspace(repo / "pkg", embedder=HashingEmbedder(dim=8)).open()


def test_syncing_through_the_workspace_imports_no_ranking(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", {"a.py": "def a():\n    return 1\n"})
    code = (
        "import json, sys\n"
        "from indexer.embedder import HashingEmbedder\n"
        "from sync.workspace.workspace import Workspace\n"
        f"Workspace({str(repo)!r}, embedder=HashingEmbedder()).sync()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'retrieval')))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), CODEVEIL_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
