"""A second worktree of an indexed repository takes its files' chunks from the first's
chunk table (same path, same content, same chunker) instead of parsing them again."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
from pathlib import Path

import pytest

from indexer.chunker_stamp import chunker_stamp
from indexer.embedder import HashingEmbedder
from indexer.local_chunks import MIXED_CHUNKERS, LocalChunks, open_state_db
from indexer.sibling_chunks import SiblingChunks, other_worktrees
from sync.workspace.workspace import Workspace
from tests.conftest import SAMPLE_FILES, write_repo


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), "-c", "user.email=t@example.com",
                    "-c", "user.name=t", *args], check=True, capture_output=True)


def indexed_repo_and_worktree(tmp_path: Path) -> tuple[Path, Path]:
    repo = write_repo(tmp_path / "repo")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    ws = Workspace(repo, embedder=HashingEmbedder())
    ws.sync()
    ws.close()
    second = tmp_path / "second"
    git(repo, "worktree", "add", "-q", "--detach", str(second))
    return repo, second


def table(root: Path) -> dict[str, tuple[list, list]]:
    with contextlib.closing(open_state_db(root / ".codeveil" / "state.sqlite")) as db:
        local = LocalChunks(db)
        chunks = {p: local.for_file(p) for p in local.file_digests()}
        defined = {p: db.execute("SELECT names, kind, start_line, end_line, signature"
                                 " FROM definitions WHERE path = ? ORDER BY ordinal",
                                 (p,)).fetchall() for p in chunks}
    return {p: (chunks[p], defined[p]) for p in chunks}


def test_a_second_worktree_reuses_the_first_ones_chunks(tmp_path: Path) -> None:
    repo, second = indexed_repo_and_worktree(tmp_path)
    assert [p.resolve() for p in other_worktrees(second)] == [repo.resolve()]
    (second / "net" / "upload.py").write_text("def changed_here():\n    return 1\n")
    ws = Workspace(second, embedder=HashingEmbedder())
    report = ws.sync()
    ws.close()
    assert report.files_changed == len(SAMPLE_FILES)
    assert report.files_reused == len(SAMPLE_FILES) - 1  # the edited file is parsed
    first, mine = table(repo), table(second)
    assert set(mine) == set(first)
    for path in first:
        if path != "net/upload.py":
            assert mine[path] == first[path], path  # chunks and definitions, as parsed
    assert [c.symbol for c in mine["net/upload.py"][0]] == ["changed_here"]
    assert mine["net/upload.py"][1][0][0] == "changed_here"


def test_nothing_is_reused_from_a_table_another_chunker_wrote(tmp_path: Path) -> None:
    repo, second = indexed_repo_and_worktree(tmp_path)
    state = repo / ".codeveil" / "state.sqlite"
    with contextlib.closing(sqlite3.connect(state)) as db, db:
        assert bytes(db.execute("SELECT value FROM state_meta").fetchone()[0]) == chunker_stamp()
        db.execute("UPDATE state_meta SET value = ?", (b"an older chunker",))
    ws = Workspace(second, embedder=HashingEmbedder())
    assert ws.sync().files_reused == 0
    ws.close()
    assert not SiblingChunks([state])


def test_a_table_from_before_stamps_is_marked_mixed_on_its_next_write(tmp_path: Path) -> None:
    repo, _second = indexed_repo_and_worktree(tmp_path)
    state = repo / ".codeveil" / "state.sqlite"
    with contextlib.closing(sqlite3.connect(state)) as db, db:
        db.execute("DROP TABLE state_meta")  # what a codeveil without stamps leaves
    (repo / "net" / "upload.py").write_text("def edited():\n    return 2\n")
    ws = Workspace(repo, embedder=HashingEmbedder())
    assert ws.sync().files_changed == 1
    ws.close()
    # Its other files were chunked by an unknown chunker: the whole table is not ours.
    with contextlib.closing(sqlite3.connect(state)) as db:
        assert bytes(db.execute("SELECT value FROM state_meta").fetchone()[0]) == MIXED_CHUNKERS
    assert not SiblingChunks([state])


def test_outside_git_there_are_no_siblings(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "plain")
    assert other_worktrees(repo) == []
    assert not SiblingChunks.for_root(repo)


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_an_unreadable_sibling_is_skipped(tmp_path: Path, damage: str) -> None:
    state = tmp_path / "state.sqlite"
    if damage == "garbage":
        state.write_bytes(b"not a database" * 100)
    assert not SiblingChunks([state])
