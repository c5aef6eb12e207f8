"""A ref names one checkout: two clones of one user on one host (or two CI containers
with the same user and host name) never sync one tree and revert each other's files;
a copied `.codeveil/` gets an id of its own; an existing checkout keeps its server state
across the change of names; and `status --server` and `doctor` name a tree that is not
this checkout's, never "ok". A real server on loopback; the hashing embedder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_config
from sync.checkout.refs import ref_name
from tests.cli_in_process import run_in_process
from tests.server_fixtures import ServerProcess
from tests.test_sibling_chunks import git
from tests.test_sync import many_files


def _clone(repo: Path, to: Path, url: str) -> Index:
    """A second clone of `repo` by the same user (same key and token), joined to its
    workspace."""
    shutil.copytree(repo, to, ignore=shutil.ignore_patterns(".codeveil"))
    idx = Index(to, embedder=HashingEmbedder())
    idx.init(server=url, workspace_id=load_config(repo).workspace_id)
    return idx


def _two_clones(tmp_path: Path, url: str) -> tuple[Path, Index, Index]:
    """A repo of 30 files indexed on the server at `url`, and a second clone of it by the
    same user, indexed too: (the first's folder, the first, the second)."""
    a_repo = many_files(tmp_path / "a", 30)
    a = Index(a_repo, embedder=HashingEmbedder())
    a.init(server=url)
    a.index(wait=True)
    b = _clone(a_repo, tmp_path / "b", url)
    b.index(wait=True)
    return a_repo, a, b


def _in_step(idx: Index) -> bool:
    """Whether the server's tree of the checkout's ref is the one it synced."""
    tree = idx.status(server=True).server_tree
    assert tree is not None
    return bool(tree["in_step"])


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\ndef edited_in_one_clone():\n    return 42\n")


def test_two_clones_of_one_user_sync_trees_of_their_own(
        tmp_path: Path, live_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEVEIL_REF", raising=False)
    a_repo, a, b = _two_clones(tmp_path, live_server.url)

    _edit(sorted(a_repo.glob("pkg*/*.py"))[0])
    assert a.index(wait=True).files_changed == 1
    b_again = b.index(wait=True)  # b, unchanged, must not put its old version back on a's tree
    assert b_again.files_changed == 0
    again = a.index(wait=True)
    assert (again.files_changed, again.bytes_sent) == (0, 0)
    assert _in_step(a) and _in_step(b)
    assert a.status().ref != b.status().ref
    a.close()
    b.close()


def test_a_copied_codeveil_folder_gets_its_own_id_and_a_moved_one_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sync.checkout.refs import legacy_ref_name

    monkeypatch.delenv("CODEVEIL_REF", raising=False)
    repo = tmp_path / "repo"
    (repo / ".codeveil").mkdir(parents=True)
    name = ref_name(repo)
    assert name == ref_name(repo) and name.startswith(legacy_ref_name(repo) + "/")
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy)
    assert ref_name(copy) != name
    moved = tmp_path / "moved"
    repo.rename(moved)
    assert ref_name(moved) == name
    monkeypatch.setenv("CODEVEIL_REF", "ci:shared")
    assert ref_name(moved) == ref_name(copy) == "ci:shared"  # said explicitly: shared


def test_an_existing_checkout_keeps_its_server_state(
        tmp_path: Path, live_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout that synced its ref under the name of before (`user@host`) moves to its
    own ref by links: no chunk embedded, no row sent."""
    from sync.checkout.refs import legacy_ref_name

    repo = many_files(tmp_path / "repo", 60)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    (repo / ".codeveil").mkdir()
    monkeypatch.setenv("CODEVEIL_REF", legacy_ref_name(repo))
    assert legacy_ref_name(repo).endswith(":main")
    idx = Index(repo, embedder=HashingEmbedder())
    idx.init(server=live_server.url)
    first = idx.index(wait=True)
    rows = idx.workspace.open().client.info().chunks
    idx.close()
    monkeypatch.delenv("CODEVEIL_REF")
    idx = Index(repo, embedder=HashingEmbedder())
    moved = idx.index(wait=True)
    assert moved.chunks_embedded == 0 and idx.workspace.open().client.info().chunks == rows
    assert moved.bytes_sent < first.bytes_sent / 4, (moved.bytes_sent, first.bytes_sent)
    assert (idx.index(wait=True).files_changed, _in_step(idx)) == (0, True)
    idx.close()
    # `codeveil refs` names both: this checkout's, current, and the one of before.
    listed = run_in_process(["refs"], repo).stdout.splitlines()
    assert any(line.startswith(f"* {ref_name(repo)} ") for line in listed), listed
    assert any(f"{legacy_ref_name(repo)} (before checkout ids)" in line
               for line in listed), listed


def test_a_tree_another_checkout_rewrote_is_named_by_status_and_doctor(
        tmp_path: Path, live_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two checkouts told to share one ref (CODEVEIL_REF) revert each other's files: the
    one whose file was put back hears it from `status --server` and `doctor`."""
    monkeypatch.setenv("CODEVEIL_REF", "ci:shared")
    a_repo, a, b = _two_clones(tmp_path, live_server.url)
    target = sorted(a_repo.glob("pkg*/*.py"))[0]
    _edit(target)
    a.index(wait=True)
    b.index(wait=True)  # b's old version replaces a's on the shared tree
    a.close()
    b.close()
    rel = target.relative_to(a_repo).as_posix()

    status = run_in_process(["status", "--server", "--json"], a_repo)
    assert status.returncode == 1, status.stdout
    tree = json.loads(status.stdout)["server_tree"]
    assert tree["in_step"] is False and rel in tree["files_differing"]
    doctor = run_in_process(["doctor"], a_repo)
    assert doctor.returncode == 1 and rel in doctor.stdout, doctor.stdout
