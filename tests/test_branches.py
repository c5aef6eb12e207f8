"""Teammates on two branches of one sealed workspace, on a real server on loopback (on a
data dir and on PostgreSQL): each
syncs its own ref's tree, files the pool holds are linked (no rows sent) and pulled by
content (not embedded), and alternating syncs leave each other's trees alone. The
hashing embedder stands in for the model: what is measured is the sync."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_config, load_token
from sync.checkout.refs import git_branch, ref_name
from sync.crypto.keys import export_key, import_key, load_key
from sync.crypto.pages import PAGE_ROWS
from sync.transport.http_client import HttpClient
from sync.workspace.workspace import Workspace
from tests.conftest import SAMPLE_FILES, write_repo
from tests.test_sibling_chunks import git
from tests.test_sync import SERVERS, Backend, _server, many_files


def test_the_ref_name_follows_the_checkout(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CODEVEIL_REF", raising=False)
    assert git_branch(tmp_path) is None and ":" not in ref_name(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/feature/x\n")
    assert git_branch(tmp_path) == "feature/x" and ref_name(tmp_path).endswith(":feature/x")
    tree = tmp_path / "wt"
    tree.mkdir()
    (tmp_path / "wt-git").mkdir()
    (tmp_path / "wt-git" / "HEAD").write_text("0123abcd\n")
    (tree / ".git").write_text(f"gitdir: {tmp_path / 'wt-git'}\n")
    assert git_branch(tree) == "HEAD"
    monkeypatch.setenv("CODEVEIL_REF", "bench:main")
    assert ref_name(tmp_path) == "bench:main"


@pytest.mark.parametrize("kind", SERVERS)
def test_two_branches_share_the_pool(tmp_path: Path, kind: str, request: pytest.FixtureRequest,
                                     monkeypatch) -> None:  # type: ignore[no-untyped-def]
    served = Backend(kind, _server(request, kind))
    assert served.server is not None
    monkeypatch.setenv("CODEVEIL_REF", "alice:main")
    repo = many_files(tmp_path / "repo", 60)
    idx = served.open_index(repo)
    first = idx.index(wait=True)
    ws = load_config(repo).workspace_id
    shared_key, token = export_key(load_key(ws)), load_token(ws)
    alice_config = os.environ.get("CODEVEIL_CONFIG_DIR")

    # Bob, on another branch: the same files but three.
    mate = tmp_path / "mate"
    shutil.copytree(repo, mate, ignore=shutil.ignore_patterns(".codeveil"))
    for i in range(3):
        (mate / f"pkg{i}/mod_{i}.py").write_text(f"def branch_change_{i}():\n    return {i}\n")
    monkeypatch.setenv("CODEVEIL_CONFIG_DIR", str(tmp_path / "mate-config"))
    monkeypatch.setenv("CODEVEIL_REF", "bob:feature")
    import_key(ws, shared_key)
    mate_idx = Index(mate, embedder=HashingEmbedder())
    mate_idx.init(server=served.server.url, workspace_id=ws, token=token)
    joined = mate_idx.index(wait=True)
    n = first.files_changed
    # Every file alice sent is linked but the three bob changed; his own are sent.
    assert joined.files_linked == joined.files_changed - 3 and joined.files_changed >= n
    assert joined.chunks_embedded <= 6  # only what no ref holds
    # One page of rows (the 3 files' chunks: sync.crypto.pages), 62 leaves and the links to
    # alice's pages (keys only), against her 60 files' rows
    assert joined.bytes_sent < PAGE_ROWS * 1_500 + 62 * 300 < first.bytes_sent
    assert mate_idx.search("branch_change_1", k=1)[0].path == "pkg1/mod_1.py"

    # Alternate syncs: neither flips the other's tree, so nothing is sent again.
    (mate / "pkg0/mod_0.py").write_text("def branch_change_0():\n    return 'again'\n")
    assert mate_idx.index(wait=True).files_changed == 1
    monkeypatch.setenv("CODEVEIL_REF", "alice:main")
    if alice_config is None:
        monkeypatch.delenv("CODEVEIL_CONFIG_DIR")
    else:
        monkeypatch.setenv("CODEVEIL_CONFIG_DIR", alice_config)
    back = idx.index(wait=True)
    assert (back.files_changed, back.chunks_embedded, back.requests) == (0, 0, 1)
    with HttpClient(served.server.url, ws, token) as client:
        refs = client.refs()
    assert len(refs) == 2 and min(r.files for r in refs) >= n
    mate_idx.close()
    idx.close()


def test_a_workspace_held_open_follows_a_checkout_to_its_branchs_tree(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the daemon does: one Workspace, open across `git checkout`s. Each sync goes to
    the branch checked out at that moment, and leaves the other branch's tree alone."""
    monkeypatch.delenv("CODEVEIL_REF", raising=False)
    repo = write_repo(tmp_path / "repo")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    ws = Workspace(repo, embedder=HashingEmbedder())
    try:
        ws.sync()
        assert ws.status().ref == ref_name(repo) and ws.status().ref.endswith(":main")
        git(repo, "checkout", "-q", "-b", "feature")
        (repo / "feature_only.py").write_text("def feature_only_helper():\n    return 7\n")
        # Status names the branch checked out now, the one the next sync goes to.
        assert ws.status().ref is not None and ws.status().ref.endswith(":feature")
        on_feature = ws.sync()
        assert on_feature.files_changed >= 1 and on_feature.chunks_embedded <= 2
        refs = ws.open().client.refs()
        assert len(refs) == 2
        # Leaves, as the store counts them: the files and the pages of their rows.
        low, high = sorted(r.files for r in refs)
        assert low > len(SAMPLE_FILES) and high == low + 1

        # Back on main: its tree was never rewritten with the feature branch's files.
        git(repo, "add", "feature_only.py")
        git(repo, "commit", "-q", "-m", "feature")
        git(repo, "checkout", "-q", "main")
        assert not (repo / "feature_only.py").exists()
        back = ws.sync()
        assert (back.files_changed, back.chunks_embedded, back.bytes_sent) == (0, 0, 0)
        assert ws.status().ref.endswith(":main")
    finally:
        ws.close()
