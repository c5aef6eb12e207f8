"""The client's files that hold code or vectors are its owner's alone, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from indexer.paths import cache_dir
from indexer.private_files import private_file
from retrieval import Index

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_an_index_leaves_nothing_readable_by_others(sample_repo: Path, loose_umask) -> None:
    Index(sample_repo, embedder=HashingEmbedder()).index()
    folder = sample_repo / ".codeveil"
    assert _mode(folder) == 0o700
    state = folder / "state.sqlite"
    cache = cache_dir() / "embeddings.sqlite"
    for db in (state, cache):
        assert _mode(db) == 0o600, db
        for side in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            if side.exists():
                assert _mode(side) & 0o077 == 0, side


def test_an_older_loose_database_is_tightened(tmp_path: Path, loose_umask) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    db_path = folder / "old.sqlite"
    db_path.write_bytes(b"")
    db_path.chmod(0o644)
    private_file(db_path)
    assert _mode(db_path) == 0o600
    assert _mode(folder) == 0o700
