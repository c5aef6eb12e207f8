"""The client's files that hold code or vectors are its owner's alone, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

import pytest

from indexer.embedder import HashingEmbedder
from indexer.paths import cache_dir
from indexer.private_files import private_file, write_atomic
from indexer.sqlite_files import connect
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
    Index(sample_repo, embedder=HashingEmbedder()).index(wait=True)
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


def test_making_an_open_database_private_keeps_its_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a SQLite file drops the process's POSIX locks on it, so
    `private_file` must not open a file a connection may hold: another process must
    still find the database locked."""
    import subprocess
    import sys

    path = tmp_path / "db.sqlite"
    private_file(path)
    conn = connect(path, "advice", isolation_level=None)
    conn.execute("CREATE TABLE t (a)")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    private_file(path)
    probe = ("import sqlite3, sys\n"
             "c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n"
             "try:\n    c.execute('BEGIN IMMEDIATE')\n    print('got the lock')\n"
             "except sqlite3.OperationalError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "database is locked"
    conn.execute("COMMIT")
    conn.close()


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    write_atomic(path, "old\n")
    assert path.read_text() == "old\n"
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def half_then_fail(f: IO[bytes]) -> None:
        f.write(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temp file left
    write_atomic(path, b"new\n", durable=False)
    assert path.read_bytes() == b"new\n"
