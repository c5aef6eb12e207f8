"""The machinery the local indexes share (retrieval.indexes.derived): chunk columns packed one
way, and the one refresh the lexical, vector and grep indexes run, on a real chunk
table in SQLite."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.location import ChunkLocation
from retrieval.indexes.derived.columns import ChunkColumns
from retrieval.indexes.derived.store import DerivedStore
from retrieval.indexes.lexical import LexicalStore
from retrieval.indexes.local_vectors import LocalVectorStore
from retrieval.indexes.trigram_index import TrigramStore


def _chunk(path: str, i: int) -> Chunk:
    return Chunk(path, 1 + 3 * i, 2 + 3 * i, "python", f"def f{i}",
                 f"def f{i}_{path.replace('/', '_')[:-3]}(x):\n    return x + {i}\n")


def _write(lc: LocalChunks, path: str, version: int, n: int = 3) -> None:
    lc.replace_files([(path, f"{path}:{version}".encode().ljust(16, b"\0")[:16],
                       [_chunk(path, i) for i in range(n)])])


@pytest.fixture
def table(tmp_path: Path) -> tuple[sqlite3.Connection, LocalChunks]:
    db = open_state_db(tmp_path / "state.sqlite")
    return db, LocalChunks(db)


def test_each_local_index_refreshes_through_the_one_machinery() -> None:
    for store in (LexicalStore, LocalVectorStore, TrigramStore):
        assert issubclass(store, DerivedStore), store
        # What differs is supplied, not copied: none of them runs its own refresh.
        assert "_refresh" not in vars(store) and "_current" not in vars(store), store


def test_chunk_columns_round_trip_and_join_naming_only_used_paths() -> None:
    docs = [ChunkLocation("a.py", 1, 3, "Session > send", "python", b"h" * 16),
            ChunkLocation("b.go", 4, 9, "", "go", b"g" * 16),
            ChunkLocation("a.py", 10, 12, "caf\u00e9", "python", b"k" * 16)]
    cols = ChunkColumns.of(docs)
    again = ChunkColumns.load(cols.arrays("x_"), "x_")
    assert [again.doc(i) for i in range(3)] == docs
    assert again.docs(np.array([2, 0])) == [docs[2], docs[0]]
    joined = ChunkColumns.concat([(cols, np.array([0, 2])), (again, np.array([2]))])
    assert [joined.doc(i) for i in range(3)] == [docs[0], docs[2], docs[2]]
    assert joined.paths == ["a.py"] and joined.languages == ["python"]  # b.go not named


def test_damaged_columns_are_refused_not_read_out_of_range() -> None:
    arrays = ChunkColumns.of([ChunkLocation("a.py", 1, 2, "s", "python", b"h" * 16)]).arrays()
    arrays["path_id"] = np.array([5], dtype=np.int32)  # names a path that is not there
    with pytest.raises(ValueError, match="inconsistent"):
        ChunkColumns.load(arrays)


def test_a_lexical_merge_forgets_the_paths_of_deleted_files(table) -> None:
    db, lc = table
    for i in range(12):
        _write(lc, f"pkg/m{i}.py", 1)
    store = LexicalStore(Path(db.execute("PRAGMA database_list").fetchone()[2]).parent / "lx")
    assert "pkg/m0.py" in store.current(db).base.paths
    lc.remove_files(["pkg/m0.py", "pkg/m1.py"])
    idx = store.current(db)
    assert store.last_refresh["merged"] == 1  # 6 of 36 chunks gone: past a tenth
    assert "pkg/m0.py" not in idx.base.paths and "pkg/m1.py" not in idx.base.paths
    assert len(idx) == 30 and len(idx.paths()) == 10


def test_the_grep_index_leaves_a_base_another_process_just_wrote(table, tmp_path) -> None:
    db, lc = table
    for i in range(8):
        _write(lc, f"pkg/m{i}.py", 1)
    folder = tmp_path / "trigrams"
    store = TrigramStore(folder)
    store.current(db)
    first = sorted(folder.glob("base-*.npy"))
    # A base a concurrent refresh has written and is about to point its state at.
    theirs = [folder / f"base-00112233445566ff.{part}.npy" for part in ("codes", "files")]
    for f in theirs:
        np.save(f, np.zeros(0, np.uint32))
    crashed = folder / "base-aabbccddeeff0011.codes.npy"  # an hour-old orphan of a crash
    np.save(crashed, np.zeros(0, np.uint32))
    old = time.time() - 7200
    os.utime(crashed, (old, old))
    for i in range(8):
        _write(lc, f"pkg/m{i}.py", 2)  # every file: a rebuild, a new base
    store.current(db)
    assert store.last_refresh["mode"] == "rebuild"
    assert all(f.exists() for f in theirs)
    assert not crashed.exists() and not any(f.exists() for f in first)
    assert TrigramStore(folder).current(db).postings == store.current(db).postings


def test_symbols_are_gathered_the_same_a_few_slices_at_a_time(monkeypatch) -> None:
    from retrieval.indexes.derived import columns as columns_module

    docs = [ChunkLocation(f"p{i % 3}.py", i, i + 1, "s" * (i % 5) + f"{i}", "python",
                          bytes([i]) * 16) for i in range(23)]
    cols = ChunkColumns.of(docs)
    rows = np.array([22, 0, 5, 5, 17, 3, 9])
    want = ChunkColumns.concat([(cols, rows), (cols, rows[::-1])])
    monkeypatch.setattr(columns_module, "GATHER_SLICES", 2)  # 7 rows: 4 passes each
    got = ChunkColumns.concat([(cols, rows), (cols, rows[::-1])])
    assert [got.doc(i) for i in range(14)] == [want.doc(i) for i in range(14)]
    assert [got.doc(i) for i in range(7)] == [docs[r] for r in rows]


def test_a_grep_index_whose_first_save_failed_is_saved_whole_by_the_next(table,
                                                                          tmp_path) -> None:
    db, lc = table
    for i in range(8):
        _write(lc, f"pkg/m{i}.py", 1)
    folder = tmp_path / "trigrams"
    folder.write_text("in the way")  # the save fails (a full disk would do the same)
    store = TrigramStore(folder)
    built = store.current(db)
    folder.unlink()
    _write(lc, "pkg/m0.py", 2)  # an update of the base it never saved
    store.current(db)
    assert store.last_refresh["mode"] == "update"
    again = TrigramStore(folder)
    assert again.problem() is None
    assert again.current(db).postings == store.current(db).postings >= built.postings - 10
