"""A sealed workspace on a shared server receives its rows batch by batch, as they are
embedded, so a teammate pulls what the first machine has sent while it still embeds;
the order files arrive in says nothing about their category. Real server on loopback,
two machines with their own config dirs and caches; the hashing embedder (the order and
the pull are what is tested, not the vectors' meaning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.priority import category
from retrieval import Index
from sync.checkout.config import load_config, load_token
from sync.crypto.keys import export_key, import_key, load_key
from sync.syncer.progress import Progress
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess
from tests.server_rows import opened_rows
from tests.test_teammate_pull import two_machines


class _Interrupted(BaseException):
    """Stands for a kill: the sync stops where it is."""


class _StopAfterFirstBatch(Progress):
    """Interrupts the sync once its first batch of files is done (embedded and, streamed,
    sent): the first batch holds about 64 chunks, a fraction of the tree's."""

    def files_done(self, n: int) -> None:
        raise _Interrupted


def _files() -> dict[str, str]:
    files = {}
    for i in range(20):
        # Functions long enough to be chunks of their own: a first batch (64 chunks)
        # holds a handful of files.
        body = "\n\n".join(f"def source_{i}_{j}(x):\n"
                           + "".join(f"    x = x * {j} + {k}\n" for k in range(30))
                           + f"    return x + {i}\n" for j in range(6))
        files[f"lib/mod_{i}.py"] = body + "\n"
        files[f"tests/test_mod_{i}.py"] = f"def test_{i}():\n    assert source_{i}_0(1)\n"
        files[f"docs/page_{i}.md"] = f"# Page {i}\n\nHow to call source_{i}_0.\n"
    return files


def _first_rows(data_dir: Path, workspace_id: str, files: dict[str, str]) -> list[str]:
    """The files whose rows the server's data dir holds, in the order their first row
    was stored (rows opened with the key: the pages they travel in name no file)."""
    first: dict[str, int] = {}
    for rid, _, row in opened_rows(data_dir, workspace_id, HashingEmbedder().dim):
        if row.meta.path in files:
            first.setdefault(row.meta.path, rid)
    return sorted(first, key=first.__getitem__)


def _by_mean_row(data_dir: Path, workspace_id: str, files: dict[str, str]) -> list[str]:
    """The files whose rows the server's data dir holds, by the mean place of their rows.
    Not by their first row: a file of six rows, shuffled among the others, has its first
    one early far more often than a file of one row, so that order favours source files
    even when the rows arrive at random."""
    places: dict[str, list[int]] = {}
    rows = opened_rows(data_dir, workspace_id, HashingEmbedder().dim)
    for place, (_, _, row) in enumerate(rows):
        if row.meta.path in files:
            places.setdefault(row.meta.path, []).append(place)
    return sorted(places, key=lambda p: sum(places[p]) / len(places[p]))


def test_a_teammate_pulls_the_rows_sent_while_the_first_machine_still_embeds(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files()
    alice, bob, alice_repo, bob_repo = two_machines(tmp_path, monkeypatch, files)
    with alice.active():
        idx = Index(alice_repo, embedder=HashingEmbedder())
        config = idx.init(server=server.url)
        assert config.sealed
        with pytest.raises(_Interrupted):  # stopped after its first batch
            idx.index(wait=True, progress=_StopAfterFirstBatch())
        idx.close()
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
        sent = _first_rows(server.data_dir, config.workspace_id, files)
    # Rows reached the server before the last file was embedded ...
    assert 0 < len(sent) < len(files)
    # ... and in a random order: in priority order they would all be source files.
    assert sum(1 for p in sent if category(p) == category("lib/mod_0.py")) < len(sent)

    with bob.active():
        import_key(config.workspace_id, key_text)
        b = Index(bob_repo, embedder=HashingEmbedder())
        b.init(server=server.url, workspace_id=config.workspace_id, token=token)
        report = b.index(wait=True)
        b.close()
    # Bob pulled what Alice had sent and embedded only the rest.
    sent_chunks = report.chunks_total - report.chunks_embedded
    assert report.chunks_pulled > 0 and report.chunks_pulled == sent_chunks
    assert report.chunks_embedded > 0

    with alice.active():  # Alice's next index pulls Bob's rows and embeds nothing more
        again = Index(alice_repo, embedder=HashingEmbedder())
        done = again.index(wait=True)
        again.close()
    assert done.chunks_embedded == 0
    # Her ref links the pages of bob's that hold the rest: no row is sent again.
    assert done.files_linked == done.files_changed


def test_the_server_sees_files_in_a_random_order_not_by_category(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files()
    repo = write_repo(tmp_path / "repo", files)
    idx = Index(repo, embedder=HashingEmbedder())
    idx.init(server=server.url)
    idx.index(wait=True)
    idx.close()
    order = [category(p) for p in _by_mean_row(server.data_dir,
                                               load_config(repo).workspace_id, files)]
    assert len(order) == len(files)
    # In priority order the 20 source files would take the first 20 places; shuffled,
    # about 8 of them do (12 at most in 20,000 simulated runs).
    assert sum(1 for c in order[:20] if c == category("lib/mod_0.py")) < 15
