"""`codeveil doctor --repair` rebuilds a damaged or deleted `.codeveil/config.json` from
the embedded store's registry and the key file, so the repo keeps its workspace and
key; it refuses, saying why, when they do not settle which workspace it was. Real repo
in a tmp dir, real store, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from retrieval.faces.doctor import doctor
from sync.checkout.config import load_config
from sync.crypto.keys import key_path
from sync.records import MODE_SEALED, MODE_SERVER_SEARCH
from tests.conftest import write_repo


def indexed(tmp_path: Path, *, server_search: bool = False) -> Path:
    root = write_repo(tmp_path / "repo")
    with Index(root, embedder=HashingEmbedder()) as idx:
        if server_search:
            idx.init(server_search=True)
        idx.index(wait=True)
    return root


def config_file(root: Path) -> Path:
    return root / ".codeveil" / "config.json"


def top_hits(root: Path) -> tuple[tuple[str, int], frozenset[tuple[str, int]]]:
    """The best hit and the set of the top 5 (a server-search query is perturbed afresh
    each time, so the order below the best varies)."""
    with Index(root, embedder=HashingEmbedder()) as idx:
        hits = [(h.path, h.start_line) for h in idx.search("shopping cart total", k=5)]
    return hits[0], frozenset(hits)


def run_doctor(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")
    return subprocess.run([sys.executable, "-m", "retrieval", "doctor", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", [MODE_SEALED, MODE_SERVER_SEARCH])
def test_a_garbled_config_is_rebuilt_with_the_same_workspace(tmp_path: Path,
                                                              mode: str) -> None:
    root = indexed(tmp_path, server_search=mode == MODE_SERVER_SEARCH)
    before, hits = load_config(root), top_hits(root)
    config_file(root).write_bytes(b"\x00garbled{" * 20)

    found = doctor(root, embedder=HashingEmbedder())
    assert not found.healthy
    assert found.findings[0].path == str(config_file(root))

    fixed = doctor(root, repair=True, embedder=HashingEmbedder())
    assert fixed.healthy, fixed.lines()
    assert fixed.findings[0].repaired
    assert load_config(root) == before  # same workspace, model, dim and mode
    assert top_hits(root) == hits
    with Index(root, embedder=HashingEmbedder()) as idx:
        assert idx.index(wait=True).files_changed == 0  # nothing sent again: the same workspace


def test_a_deleted_config_is_rebuilt_by_the_command(tmp_path: Path) -> None:
    root = indexed(tmp_path)
    before = load_config(root)
    config_file(root).unlink()

    repaired = run_doctor(root, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "repaired" in repaired.stdout and "config.json" in repaired.stdout
    assert load_config(root) == before


def test_a_config_naming_another_workspace_is_not_overwritten(tmp_path: Path) -> None:
    root = indexed(tmp_path)
    text = json.dumps({"workspace_id": "someone-elses", "dim": "broken"})
    config_file(root).write_text(text)

    result = run_doctor(root, "--repair")
    assert result.returncode == 1
    assert "someone-elses" in result.stdout and "Traceback" not in result.stderr
    assert config_file(root).read_text() == text  # left as it was


def test_without_the_key_file_the_config_is_not_rebuilt(tmp_path: Path) -> None:
    root = indexed(tmp_path)
    key_path(load_config(root).workspace_id).unlink()
    config_file(root).write_text("{")

    result = run_doctor(root, "--repair")
    assert result.returncode == 1
    assert "no workspace of the store has a matching key" in result.stdout
    assert "codeveil key import" in result.stdout
    assert config_file(root).read_text() == "{"
