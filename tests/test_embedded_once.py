"""A chunk is embedded once per team: an edit a teammate synced that reaches this
checkout through git is pulled from the teammate's pages, not embedded and sent again,
whether this checkout looked at those pages before the edit arrived or not. A page that
does not open under the key is skipped with a warning and never used. Two machines
(config dir and cache of their own), each on a ref of its own, a real server on
loopback, the hashing embedder (what is measured is the sync)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_config, load_token
from sync.crypto.keys import export_key, import_key, load_key
from sync.store.core.rows import fid_of
from tests.server_fixtures import ServerProcess
from tests.server_rows import leaf_rows
from tests.test_sync import many_files
from tests.test_teammate_pull import Machine


def _team(tmp: Path, server: ServerProcess, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[Machine, Machine, Index, Index, Path, Path]:
    """Alice indexed 40 files; Bob, on a clone, joined and pulled them."""
    alice, bob = Machine(tmp, "alice", monkeypatch), Machine(tmp, "bob", monkeypatch)
    a_repo, b_repo = many_files(tmp / "alice", 40), many_files(tmp / "bob", 40)
    with alice.active():
        monkeypatch.setenv("CODEVEIL_REF", "alice@laptop:main")
        a = Index(a_repo, embedder=HashingEmbedder())
        config = a.init(server=server.url)
        a.index(wait=True)
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
    with bob.active():
        monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:main")
        import_key(config.workspace_id, key_text)
        b = Index(b_repo, embedder=HashingEmbedder())
        b.init(server=server.url, workspace_id=config.workspace_id, token=token)
        joined = b.index(wait=True)
        assert joined.chunks_embedded == 0 and joined.chunks_pulled == joined.chunks_total
    return alice, bob, a, b, a_repo, b_repo


def _rows(idx: Index) -> int:
    return idx.workspace.open().client.info().chunks


def _edit(repo: Path, name: str, body: str) -> None:
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)


def test_an_edit_a_teammate_synced_is_pulled_not_embedded_again(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_factory(tmp_path / "data")
    alice, bob, a, b, a_repo, b_repo = _team(tmp_path, server, monkeypatch)
    one = "def retry_with_jitter(attempts):\n    return [2 ** n for n in range(attempts)]\n"
    merged = {f"merged/m_{i}.py": f"def merged_helper_{i}(x):\n    return x * {i + 3}\n"
              for i in range(3)}
    steps = [{"pkg1/mod_1.py": one}, merged]
    for files in steps:
        with alice.active():
            monkeypatch.setenv("CODEVEIL_REF", "alice@laptop:main")
            for name, body in files.items():
                _edit(a_repo, name, body)
            sent = a.index(wait=True)
            assert sent.chunks_embedded == len(files)
        with bob.active():  # the same files reach bob's tree through git
            monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:main")
            for name, body in files.items():
                _edit(b_repo, name, body)
            rows = _rows(b)
            got = b.index(wait=True)
            assert (got.chunks_embedded, got.chunks_pulled) == (0, len(files)), got
            assert _rows(b) == rows  # no row sent again: bob's ref links alice's page
            assert got.files_linked == got.files_changed == len(files)
    with bob.active():
        monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:main")
        assert b.search("retry_with_jitter", k=1)[0].path == "pkg1/mod_1.py"
    a.close()
    b.close()


def test_a_page_read_before_the_edit_arrived_is_read_again_for_it(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob syncs an edit of his own after alice's: his sync reads her new page, which
    then holds nothing of his files; when her edit reaches him, it is read again."""
    server = server_factory(tmp_path / "data")
    alice, bob, a, b, a_repo, b_repo = _team(tmp_path, server, monkeypatch)
    hers = "def alice_edit(x):\n    return x - 1\n"
    with alice.active():
        monkeypatch.setenv("CODEVEIL_REF", "alice@laptop:main")
        _edit(a_repo, "pkg2/mod_2.py", hers)
        assert a.index(wait=True).chunks_embedded == 1
    with bob.active():
        monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:main")
        _edit(b_repo, "pkg3/mod_3.py", "def bob_edit(x):\n    return x + 1\n")
        assert b.index(wait=True).chunks_embedded == 1
        _edit(b_repo, "pkg2/mod_2.py", hers)
        got = b.index(wait=True)
        assert (got.chunks_embedded, got.chunks_pulled) == (0, 1), got
    a.close()
    b.close()


def _spoil_new_pages(data_dir: Path, before: set[bytes]) -> int:
    """Flip a byte of every row of the pages written since `before`: what a member with
    write access, or the server, could do. Returns the rows spoiled."""
    (db_path,) = (data_dir / "workspaces").glob("*/tree.sqlite")
    new = [k for k, n in leaf_rows(data_dir).items() if k not in before and n]
    spoiled = 0
    with sqlite3.connect(db_path) as db:
        for leaf in new:
            for rid, meta in db.execute("SELECT rid, meta FROM rows WHERE fid = ?",
                                        (fid_of(leaf),)).fetchall():
                blob = bytearray(meta)
                blob[len(blob) // 2] ^= 0x01
                db.execute("UPDATE rows SET meta = ? WHERE rid = ?", (bytes(blob), rid))
                spoiled += 1
    return spoiled


def test_a_page_that_does_not_open_is_skipped_and_never_used(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    server = server_factory(tmp_path / "data")
    alice, bob, a, b, a_repo, b_repo = _team(tmp_path, server, monkeypatch)
    body = "def spoiled_on_the_server(x):\n    return x * 7\n"
    before = set(leaf_rows(server.data_dir))
    with alice.active():
        monkeypatch.setenv("CODEVEIL_REF", "alice@laptop:main")
        _edit(a_repo, "pkg4/mod_4.py", body)
        a.index(wait=True)
    assert _spoil_new_pages(server.data_dir, before) > 0
    with bob.active(), caplog.at_level(logging.WARNING, logger="sync.syncer.paged_sync"):
        monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:main")
        _edit(b_repo, "pkg4/mod_4.py", body)
        got = b.index(wait=True)
        assert got.chunks_embedded == 1 and got.chunks_pulled == 0, got
        assert any("ignoring a page" in r.getMessage() for r in caplog.records)
        assert b.search("spoiled_on_the_server", k=1)[0].path == "pkg4/mod_4.py"
        assert b.status(server=True).server_tree["in_step"] is True
    assert load_config(b_repo).sealed
    a.close()
    b.close()


def test_a_switch_onto_a_teammates_branch_embeds_nothing(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice's feature branch (its own ref) changed 10 files; bob checks it out: his new
    ref links her pages, and nothing is embedded or sent again."""
    server = server_factory(tmp_path / "data")
    alice, bob, a, b, a_repo, b_repo = _team(tmp_path, server, monkeypatch)
    feature = {f"pkg{i % 7}/feature_{i}.py": f"def feature_step_{i}(x):\n    return x ** {i}\n"
               for i in range(10)}
    with alice.active():
        monkeypatch.setenv("CODEVEIL_REF", "alice@laptop:feature")
        for name, body in feature.items():
            _edit(a_repo, name, body)
        assert a.index(wait=True).chunks_embedded == len(feature)
    with bob.active():
        monkeypatch.setenv("CODEVEIL_REF", "bob@desktop:feature")  # his checkout's branch
        for name, body in feature.items():
            _edit(b_repo, name, body)
        rows = _rows(b)
        got = b.index(wait=True)
        assert (got.chunks_embedded, got.chunks_pulled) == (0, len(feature)), got
        assert got.files_linked == got.files_changed and _rows(b) == rows
    a.close()
    b.close()
