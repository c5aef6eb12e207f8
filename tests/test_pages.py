"""Sealed rows in pages (sync.crypto.pages): on a real server on loopback, a file's leaf holds
no rows, every row travels in a page of PAGE_ROWS rows, an edit writes a page or two,
compaction keeps the store small and loses nothing, a teammate reads every page and
embeds nothing, and an interrupted sync converges. The hashing embedder: what is tested
is where rows are, not what the vectors mean."""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from sync.checkout.config import load_config, load_token, state_path
from sync.crypto.ciphers import node_key, node_value
from sync.crypto.keys import export_key, import_key, load_key
from sync.crypto.pages import PAGE_ROWS
from sync.syncer.paged_sync import PagedSync
from sync.syncer.progress import Progress
from sync.workspace.workspace import Workspace
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess
from tests.server_rows import leaf_rows, opened_rows
from tests.test_teammate_pull import two_machines


def _body(i: int, version: int = 0, functions: int = 3) -> str:
    return "\n\n".join(f"def f_{i}_{j}_{version}(x):\n"
                       + "".join(f"    x = x * {j} + {k}\n" for k in range(25))
                       + f"    return x + {i}\n" for j in range(functions)) + "\n"


def _files(n: int = 24) -> dict[str, str]:
    files = {f"pkg/mod_{i}.py": _body(i, functions=1 + i % 5) for i in range(n)}
    files["pkg/empty.py"] = ""
    files["README.md"] = "# Tool\n\nWhat it does.\n"
    return files


def _index(repo: Path) -> Index:
    return Index(repo, embedder=HashingEmbedder())


def _live_rows(server: ServerProcess, repo: Path) -> Counter[str]:
    """path -> the chunks of its current version the server holds a row of (opened
    with the key; a row copied into another page counts once)."""
    workspace_id = load_config(repo).workspace_id
    key = load_key(workspace_id)
    db = open_state_db(state_path(repo))
    try:
        digests = LocalChunks(db).file_digests()
    finally:
        db.close()
    return Counter(path for path, *_ in {
        (row.meta.path, row.meta.start_line, row.meta.end_line, row.meta.chunk_hash)
        for _, _, row in opened_rows(server.data_dir, workspace_id, HashingEmbedder().dim)
        if row.meta.path in digests  # a deleted file's rows wait, dead, in their page
        and row.value == node_value(key, row.meta.path, digests[row.meta.path])})


def _vectors_kept(repo: Path) -> int:
    """How many rows of this machine's page index still hold a vector (the embedding
    cache holds every one that reached it)."""
    db = open_state_db(state_path(repo))
    try:
        return db.execute("SELECT COUNT(*) FROM page_rows WHERE vector IS NOT NULL"
                          ).fetchone()[0]
    finally:
        db.close()


def _chunk_counts(repo: Path) -> dict[str, int]:
    """path -> its chunks, as this machine's chunk table has them (empty files left out)."""
    db = open_state_db(state_path(repo))
    try:
        local = LocalChunks(db)
        counts = {p: len(local.for_file(p)) for p in local.file_digests()}
    finally:
        db.close()
    return {p: n for p, n in counts.items() if n}


def test_leaves_hold_no_rows_and_pages_hold_them_all(
        tmp_path: Path, server_factory) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files()
    repo = write_repo(tmp_path / "repo", files)
    idx = _index(repo)
    idx.init(server=server.url)
    report = idx.index(wait=True)
    chunks = report.chunks_total
    idx.close()

    workspace_id = load_config(repo).workspace_id
    key = load_key(workspace_id)
    counts = leaf_rows(server.data_dir)
    file_keys = {node_key(key, p) for p in files}
    assert file_keys <= counts.keys()
    assert all(counts[k] == 0 for k in file_keys)  # the server sees no row of any file
    pages = {k: n for k, n in counts.items() if k not in file_keys}
    assert set(pages.values()) == {PAGE_ROWS}  # every page alike
    assert len(pages) == -(-chunks // PAGE_ROWS)  # packed: one partial page at most
    # Every chunk has a row; slots padding would take hold copies of other pages' rows.
    per_file = _live_rows(server, repo)
    assert sum(per_file.values()) == chunks
    assert set(per_file) == set(files) - {"pkg/empty.py"}


class _Interrupted(BaseException):
    """Stands for a kill: the sync stops where it is."""


class _StopAfterFirstBatch(Progress):
    def files_done(self, n: int) -> None:
        raise _Interrupted


def test_an_edit_writes_one_page_and_compaction_keeps_the_store_small(
        tmp_path: Path, server_factory) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files(40)
    repo = write_repo(tmp_path / "repo", files)
    idx = _index(repo)
    idx.init(server=server.url)
    idx.index(wait=True)
    rng = random.Random(7)
    versions = dict.fromkeys(range(40), 0)
    for step in range(30):
        i = rng.randrange(40)
        versions[i] += 1
        (repo / f"pkg/mod_{i}.py").write_text(_body(i, versions[i], functions=1 + i % 5))
        before = set(leaf_rows(server.data_dir))
        report = idx.index(wait=True)
        after = leaf_rows(server.data_dir)
        new_pages = [k for k in after.keys() - before if after[k]]
        # One file's edit: one page (its rows and the emptiest pages' live ones), one
        # apply, the requests a file's own rows took: the root, the children of the
        # root and of two levels of buckets, the apply, the directories; and the list
        # of refs, asked before a new version is embedded (sync.syncer.ref_watch: here this
        # checkout's alone).
        assert len(new_pages) == 1, step
        assert report.requests <= 7, (step, report.requests)
        assert idx.index(wait=True).requests == 1  # nothing changed: the root matches
        chunks = sum(_live_rows(server, repo).values())
        pages = sum(1 for n in after.values() if n)
        # Storage: within 1.5x of the rows packed tight.
        assert pages * PAGE_ROWS <= 1.5 * chunks + PAGE_ROWS, (step, pages, chunks)
    idx.close()
    # Nothing lost: each chunk of each file's current version has exactly one row.
    assert _live_rows(server, repo) == _chunk_counts(repo)
    # The rows moved were sealed again from the embedding cache: the index keeps no copy.
    assert _vectors_kept(repo) == 0


def test_a_teammate_reads_every_page_and_follows_an_edit(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files()
    alice, bob, alice_repo, bob_repo = two_machines(tmp_path, monkeypatch, files)
    with alice.active():
        a = _index(alice_repo)
        config = a.init(server=server.url)
        a.index(wait=True)
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
    with bob.active():
        import_key(config.workspace_id, key_text)
        b = _index(bob_repo)
        b.init(server=server.url, workspace_id=config.workspace_id, token=token)
        joined = b.index(wait=True)
        assert joined.chunks_embedded == 0
        assert joined.chunks_pulled == joined.chunks_total > 0
        assert _vectors_kept(bob_repo) == 0  # read into the cache, not kept twice
    edited = _body(3, 1, functions=4)
    for repo in (alice_repo, bob_repo):
        (repo / "pkg/mod_3.py").write_text(edited)
    with alice.active():
        sent = a.index(wait=True)
        assert sent.chunks_embedded > 0
        a.close()
    with bob.active():
        followed = b.index(wait=True)
        # Bob reads Alice's new page: the edited file's vectors, not the model's.
        assert followed.chunks_embedded == 0
        assert followed.chunks_pulled == 4
        assert b.index(wait=True).requests == 1
        b.close()


def test_an_interrupted_first_index_converges(tmp_path: Path, server_factory) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files(60)
    repo = write_repo(tmp_path / "repo", files)
    idx = _index(repo)
    idx.init(server=server.url)
    with pytest.raises(_Interrupted):
        idx.index(wait=True, progress=_StopAfterFirstBatch())
    idx.close()
    again = _index(repo)
    done = again.index(wait=True)
    assert again.index(wait=True).requests == 1
    again.close()
    assert _live_rows(server, repo) == _chunk_counts(repo)
    assert done.chunks_total == sum(_chunk_counts(repo).values())


def test_a_join_chunks_the_tree_while_it_reads_the_pages(
        tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = {f"pkg/mod_{i}.py": _body(i) for i in range(300)}
    alice, bob, alice_repo, bob_repo = two_machines(tmp_path, monkeypatch, files)
    with alice.active():
        a = _index(alice_repo)
        config = a.init(server=server.url)
        first = a.index(wait=True)
        a.close()
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
    assert first.files_parsed == len(files)
    with bob.active():
        import_key(config.workspace_id, key_text)
        b = _index(bob_repo)
        b.init(server=server.url, workspace_id=config.workspace_id, token=token)
        # Whether the words are being chunked when the diff (which reads the pages)
        # starts: observed beside the real diff, which runs unchanged.
        chunking: list[bool] = []
        real_diff = PagedSync.diff

        def diff(self: PagedSync, *args: object, **kwargs: object) -> object:
            chunking.append(any(t.name == "codeveil-words" and t.is_alive()
                                for t in threading.enumerate()))
            return real_diff(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(PagedSync, "diff", diff)
        joined = b.index(wait=True)
        b.close()
    assert chunking == [True]
    # Each file parsed once: the sync reads the words thread's chunks, not the parser's.
    assert joined.files_parsed == len(files)
    assert joined.chunks_embedded == 0 and joined.chunks_pulled == joined.chunks_total


def test_the_sync_after_the_words_pass_parses_nothing_again(tmp_path: Path) -> None:
    """What the builder does after `codeveil index`: it reads the chunks the words pass
    wrote instead of parsing every file again."""
    repo = write_repo(tmp_path / "repo", _files())
    ws = Workspace(repo, embedder=HashingEmbedder())
    try:
        words = ws.index_words()
        assert words.files_parsed == len(_files())
        synced = ws.sync()
        # Every chunk got its vector (embedded, or from a cache an earlier test filled).
        assert synced.chunks_embedded + synced.chunks_from_cache == words.chunks_total > 0
        assert synced.files_parsed == 0
        (repo / "pkg/mod_1.py").write_text(_body(1, 1))
        assert ws.sync().files_parsed == 1  # an edit is parsed
    finally:
        ws.close()


def test_on_postgresql_no_file_holds_a_row_and_every_page_32(
        tmp_path: Path, pg_live_server: ServerProcess) -> None:
    import psycopg

    from sync.store.core.rows import fid_of
    from sync.store.postgres.schema import SCHEMA

    files = _files()
    repo = write_repo(tmp_path / "repo", files)
    with _index(repo) as idx:
        idx.init(server=pg_live_server.url)
        report = idx.index(wait=True)
    workspace_id = load_config(repo).workspace_id
    key = load_key(workspace_id)
    assert pg_live_server.store is not None
    with psycopg.connect(pg_live_server.store) as conn:
        per_fid = dict(conn.execute(
            f"SELECT fid, COUNT(*) FROM {SCHEMA}.rows WHERE workspace = %s GROUP BY fid",
            (workspace_id,)).fetchall())
    assert not {fid_of(node_key(key, p)) for p in files} & per_fid.keys()
    assert set(per_fid.values()) == {PAGE_ROWS}
    assert len(per_fid) * PAGE_ROWS >= report.chunks_total > (len(per_fid) - 1) * PAGE_ROWS


def test_deleting_files_compacts_their_pages(tmp_path: Path, server_factory) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    files = _files(60)
    repo = write_repo(tmp_path / "repo", files)
    with _index(repo) as idx:
        idx.init(server=server.url)
        idx.index(wait=True)
        for i in range(60):  # two thirds of the files, spread over every page
            if i % 3:
                (repo / f"pkg/mod_{i}.py").unlink()
        idx.index(wait=True)
        assert idx.index(wait=True).requests == 1
    counts = leaf_rows(server.data_dir)
    pages = sum(1 for n in counts.values() if n)
    live = _live_rows(server, repo)
    assert live == _chunk_counts(repo)  # nothing lost, nothing of a deleted file counted
    # The rows of the deleted files did not stay: the pages are within 1.5x of the rows.
    assert pages * PAGE_ROWS <= 1.5 * sum(live.values()) + PAGE_ROWS
