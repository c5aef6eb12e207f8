"""Every database records its format; a reader refuses a format it does not know."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from indexer.embed_cache import CACHE_FORMAT, EmbeddingCache
from indexer.embedder import HashingEmbedder
from indexer.formats import FormatError, check_sqlite_format
from indexer.local_chunks import STATE_FORMAT, open_state_db
from indexer.paths import cache_dir
from retrieval import Index
from tests.test_cli import assert_one_line_error, run


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def _stamp(path: Path, version: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {version}")


@pytest.fixture
def indexed(sample_repo: Path) -> Path:
    Index(sample_repo, embedder=HashingEmbedder()).index(wait=True)
    return sample_repo


def test_new_files_record_their_format(indexed: Path) -> None:
    assert _version(indexed / ".codeveil" / "state.sqlite") == STATE_FORMAT
    assert _version(cache_dir() / "embeddings.sqlite") == CACHE_FORMAT


def test_a_newer_client_state_is_refused_naming_the_file(indexed: Path) -> None:
    state = indexed / ".codeveil" / "state.sqlite"
    _stamp(state, STATE_FORMAT + 1)
    with pytest.raises(FormatError, match="upgrade codeveil") as info:
        Index(indexed, embedder=HashingEmbedder()).search("retry failed uploads")
    assert str(state) in str(info.value)
    assert _version(state) == STATE_FORMAT + 1  # refused, not overwritten


def test_the_cli_reports_a_newer_format_in_one_line(indexed: Path) -> None:
    _stamp(indexed / ".codeveil" / "state.sqlite", 99)
    proc = run(["search", "retry failed uploads"], cwd=indexed)
    assert_one_line_error(proc, "format 99, newer than this codeveil reads")


def test_a_newer_embedding_cache_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    EmbeddingCache(path)._db.close()
    _stamp(path, CACHE_FORMAT + 5)
    with pytest.raises(FormatError, match="the embedding cache") as info:
        EmbeddingCache(path)
    assert "delete it" in str(info.value)


def test_a_file_from_before_versions_is_read_as_format_one(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:  # the layout of a state file that has no version
        db.execute("CREATE TABLE chunk_files (path TEXT PRIMARY KEY, digest BLOB NOT NULL)")
        db.execute("INSERT INTO chunk_files VALUES ('a.py', x'00')")
    open_state_db(path).close()
    assert _version(path) == STATE_FORMAT
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT path FROM chunk_files").fetchall() == [("a.py",)]


def test_older_formats_are_migrated_step_by_step_or_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "x.sqlite")
    db.execute("CREATE TABLE t (a INTEGER)")
    db.execute("PRAGMA user_version = 1")
    ran: list[int] = []

    def step(n: int):
        def migrate(conn: sqlite3.Connection) -> None:
            ran.append(n)
            conn.execute(f"ALTER TABLE t ADD COLUMN c{n} INTEGER")
        return migrate

    check_sqlite_format(db, tmp_path / "x.sqlite", what="x", version=3, remedy="r",
                        migrations={1: step(1), 2: step(2)})
    assert ran == [1, 2]
    assert int(db.execute("PRAGMA user_version").fetchone()[0]) == 3
    with pytest.raises(FormatError, match="no longer reads: rebuild"):
        check_sqlite_format(db, tmp_path / "x.sqlite", what="x", version=5, remedy="rebuild",
                            migrations={4: step(4)})
    assert int(db.execute("PRAGMA user_version").fetchone()[0]) == 3


def test_a_store_written_by_a_newer_codeveil_is_refused(tmp_path: Path) -> None:
    from sync.store import STORE_FORMAT, Store
    from sync.store.local_client import LocalClient
    from sync.wire import StoreCorrupt

    data = tmp_path / "data"
    LocalClient.create_workspace(data, "ws1", dim=8, model_id="m", key_check=b"k" * 16).close()
    tree = data / "workspaces" / "ws1" / "tree.sqlite"
    registry = data / "registry.sqlite"
    assert _version(tree) == STORE_FORMAT and _version(registry) == STORE_FORMAT

    newer = STORE_FORMAT + 1
    _stamp(tree, newer)
    with pytest.raises(StoreCorrupt, match=f"Merkle tree in format {newer}, newer") as info:
        LocalClient.open(data, "ws1")
    assert str(tree) in str(info.value)

    _stamp(registry, newer)
    with pytest.raises(StoreCorrupt, match=f"workspace registry in format {newer}, newer"):
        Store(data)
    assert _version(registry) == STORE_FORMAT + 1
