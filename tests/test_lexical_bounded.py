"""The lexical index built and merged in bounded memory: segments merged a term range at
a time score exactly as one built at once; large postings live in spill files and in
the saved file, mapped, never read whole; a garbled saved member is caught."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval.indexes.derived import npz as npz_module
from retrieval.indexes.derived.npz import read_npz, write_npz
from retrieval.indexes.lexical import LexicalIndex, LexicalStore
from retrieval.indexes.lexical import combine as combine_module
from retrieval.indexes.lexical.store import BASE_FILE


def _chunks(files: int, per_file: int = 4, version: int = 0) -> dict[str, list[Chunk]]:
    out = {}
    for i in range(files):
        path = f"src/part{i % 7}/mod_{i}.py"
        out[path] = [
            Chunk(path, 1 + 4 * j, 3 + 4 * j, "python", f"handler_{i}_{j}",
                  f"def handler_{i}_{j}(request, retries={j + version}):\n"
                  f"    \"\"\"Route {i} step {j}: parse, retry and log.\"\"\"\n"
                  f"    return dispatch(request, shard_{i % 13}, attempt_{j})\n")
            for j in range(per_file)]
    return out


QUERIES = ("handler_3_1", "retry and log the request", "shard_5 dispatch", "parse route 12",
           "attempt_2 retries")


def _ranked(idx: LexicalIndex, q: str) -> list[tuple[str, int, float]]:
    return sorted((idx.doc(i).path, idx.doc(i).start_line, round(s, 5))
                  for i, s in idx.top(q, 1000))


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny build batches, tiers and merge parts, so a few hundred docs cross every
    boundary the bounded build has; spill files from the first byte."""
    monkeypatch.setattr(combine_module, "BUILD_DOCS", 37)
    monkeypatch.setattr(combine_module, "TIER_ENTRIES", 900)
    monkeypatch.setattr(combine_module, "PART_ENTRIES", 251)
    monkeypatch.setattr(combine_module, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(npz_module, "MAP_MIN_BYTES", 0)


def test_a_build_in_parts_scores_as_one_built_at_once(small_parts, tmp_path: Path) -> None:
    chunks = [c for cs in _chunks(90).values() for c in cs]
    parts = LexicalIndex.from_chunks(chunks)  # batches of 37 docs, tiers, parts of 251
    combine_module.BUILD_DOCS = 10**6
    combine_module.PART_ENTRIES = 10**9
    whole = LexicalIndex.from_chunks(chunks)  # one batch, one part
    assert len(parts) == len(whole) == 360
    np.testing.assert_array_equal(parts.base.terms, whole.base.terms)
    np.testing.assert_array_equal(parts.base.col_docs, whole.base.col_docs)
    np.testing.assert_array_equal(parts.base.col_w, whole.base.col_w)
    for q in QUERIES:
        assert _ranked(parts, q) == _ranked(whole, q)


def _write(lc: LocalChunks, files: dict[str, list[Chunk]], tag: bytes) -> None:
    lc.replace_files([(p, (p.encode() + tag)[-16:].ljust(16, b"\0"), cs)
                      for p, cs in files.items()])


def _table(tmp_path: Path) -> tuple[sqlite3.Connection, LocalChunks]:
    db = open_state_db(tmp_path / "state.sqlite")
    return db, LocalChunks(db)


def test_store_in_spill_files_and_mapped_matches_a_fresh_build(small_parts,
                                                               tmp_path: Path) -> None:
    db, lc = _table(tmp_path)
    files = _chunks(120)
    _write(lc, files, b"")
    folder = tmp_path / "lexical"
    store = LexicalStore(folder)
    idx = store.current(db)
    assert store.last_refresh["mode"] == "rebuild" and len(idx) == 480
    # The base's postings are read from the saved file, mapped: not a second copy.
    assert isinstance(idx.base.col_docs, np.memmap)
    assert Path(idx.base.col_docs.filename) == folder / BASE_FILE
    # Edits: a delta (merged in parts with the base's statistics), then a merge.
    merges = []
    for round_, every in ((1, 60), (2, 60), (3, 4)):  # two files, two more, a quarter
        changed = {p: cs for p, cs in _chunks(120, version=round_).items()
                   if int(p.rsplit("_", 1)[1][:-3]) % every == round_}
        _write(lc, changed, bytes([round_]))
        lc.remove_files([f"src/part{round_}/mod_{round_ + 7 * 10}.py"])
        idx = store.current(db)
        merges.append(store.last_refresh["merged"])
    assert merges == [0, 0, 1], merges
    fresh = LexicalIndex.from_chunks([c for _, c in LocalChunks(db).iter_all()])
    assert idx.live == len(fresh)
    for q in QUERIES:
        got, want = _ranked(idx, q), _ranked(fresh, q)
        assert [g[:2] for g in got] == [w[:2] for w in want]
        np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], rtol=0.05)
    # Another process maps the saved index and answers the same.
    again = LexicalStore(folder).current(db)
    assert isinstance(again.base.col_w, np.memmap)
    for q in QUERIES:
        np.testing.assert_allclose(again.scores(q), idx.scores(q), rtol=1e-6)
    # Spill files are unlinked the moment they are mapped: none is left in the folder.
    assert not [p for p in folder.iterdir() if p.name.startswith(combine_module.TEMP_PREFIX)]


def test_a_garbled_mapped_member_is_rebuilt(small_parts, tmp_path: Path) -> None:
    db, lc = _table(tmp_path)
    _write(lc, _chunks(30), b"")
    folder = tmp_path / "lexical"
    want = LexicalStore(folder).current(db).scores("handler retry")
    base = folder / BASE_FILE
    with np.load(base) as z:  # flip one byte inside the postings' data, past the headers
        offset = base.read_bytes().find(z["col_w"].tobytes()[:64])
    assert offset > 0
    data = bytearray(base.read_bytes())
    data[offset + 10] ^= 0x40
    base.write_bytes(bytes(data))
    store = LexicalStore(folder)
    idx = store.current(db)
    assert store.last_refresh["mode"] == "rebuild"
    np.testing.assert_allclose(idx.scores("handler retry"), want)


def test_npz_round_trip_maps_large_members_aligned(tmp_path: Path) -> None:
    arrays = {"ints": np.arange(300_000, dtype=np.int32),
              "pairs": np.arange(200_000, dtype=np.int64).reshape(-1, 2),
              "small": np.array([1.5, -2.0]), "empty": np.zeros(0, dtype=np.uint8),
              "a_longer_member_name": np.arange(50_000, dtype=np.uint64)}
    path = tmp_path / "x.npz"
    with path.open("wb") as f:
        write_npz(f, arrays)
    with np.load(path) as z:  # numpy reads it as its own
        for k, v in arrays.items():
            np.testing.assert_array_equal(z[k], v)
    got = read_npz(path, map_min_bytes=100_000)
    assert set(got) == set(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
    assert isinstance(got["ints"], np.memmap) and isinstance(got["pairs"], np.memmap)
    assert not isinstance(got["small"], np.memmap)
    assert got["ints"].ctypes.data % 64 == 0 and got["a_longer_member_name"].flags.aligned
    path.write_bytes(path.read_bytes()[:700_000])  # cut inside the second member
    with pytest.raises((ValueError, OSError, __import__("zipfile").BadZipFile)):
        read_npz(path, map_min_bytes=100_000)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_merge_into_a_spill_file_leaves_its_pages_handed_back(small_parts,
                                                               tmp_path: Path) -> None:
    chunks = [c for cs in _chunks(200).values() for c in cs]
    combine_module.PART_ENTRIES = 2_000
    idx = LexicalIndex.from_chunks(chunks)
    idx.spill_dir = tmp_path
    merged = idx.merged()
    out = merged.base.col_docs
    assert isinstance(out, np.memmap) and out.nbytes > 16_000

    def resident_kb() -> int:
        total, ours = 0, False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                ours = "(deleted)" in line and combine_module.TEMP_PREFIX in line
            elif ours and line.startswith("Rss:"):
                total += int(head[1])
        return total

    assert resident_kb() <= 16  # every part's pages handed back after it
    np.testing.assert_array_equal(np.asarray(merged.base.col_docs), idx.base.col_docs)
    assert resident_kb() > 0  # the check sees the map: reading it brought pages in


def test_grep_postings_in_runs_and_parts_answer_as_one_sort(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    from indexer.trigrams import literal_trigrams
    from retrieval.indexes import trigram_postings
    from retrieval.indexes.trigram_index import TrigramStore

    db, lc = _table(tmp_path)
    _write(lc, _chunks(150), b"")
    lc.replace_files([("src/blank.py", b"blank".ljust(16, b"\0"), [])])  # a file, no chunk
    # Runs of 500 postings, parts of 300, everything spilled: every boundary crossed.
    monkeypatch.setattr(trigram_postings, "RUN_POSTINGS", 500)
    monkeypatch.setattr(trigram_postings, "PART_POSTINGS", 300)
    monkeypatch.setattr(trigram_postings, "SPILL_MIN_BYTES", 0)
    small = TrigramStore(tmp_path / "small")
    idx = small.current(db)
    assert isinstance(idx.base_codes, np.memmap)
    assert Path(idx.base_codes.filename).parent == tmp_path / "small"  # the saved file

    def answers(index) -> dict[str, list[str]]:
        out = {}
        for word in ("dispatch", "shard_1", "handler_7_", "attempt_3", "ROUTE 14"):
            files: set[int] | None = None
            for code in literal_trigrams(word):
                got = set(index.files_with(code).tolist())
                files = got if files is None else files & got
            out[word] = sorted(index.paths[i] for i in files or ())
        return out

    modes = []
    for round_ in (1, 2, 3, 4):  # deltas, then merges, of the runs and parts above
        _write(lc, {p: cs for p, cs in _chunks(150, version=round_).items()
                    if int(p.rsplit("_", 1)[1][:-3]) % 5 == round_}, bytes([round_]))
        lc.remove_files([f"src/part{round_}/mod_{round_ + 7 * round_}.py"])
        idx = small.current(db)
        modes.append(small.last_refresh["mode"])
    assert "update" in modes and "merge" in modes, modes
    monkeypatch.setattr(trigram_postings, "RUN_POSTINGS", 10**9)
    monkeypatch.setattr(trigram_postings, "PART_POSTINGS", 10**9)
    fresh = TrigramStore(tmp_path / "fresh").current(db)  # one run, one sort
    assert answers(idx) == answers(fresh)
    assert answers(fresh)["dispatch"] and len(answers(fresh)["handler_7_"]) == 1
    assert sorted(idx.live_paths()) == sorted(fresh.live_paths())
    assert "src/blank.py" in idx.live_paths()
    assert not [p for p in (tmp_path / "small").iterdir()
                if p.name.startswith(trigram_postings.TEMP_PREFIX)]


def test_grep_index_of_files_with_no_chunk_and_a_file_emptied(tmp_path: Path) -> None:
    from retrieval.indexes.trigram_index import TrigramStore

    db, lc = _table(tmp_path)
    for name in ("a.py", "b.py"):  # blank files: files of the index, no trigram
        lc.replace_files([(name, name.encode().ljust(16, b"\0"), [])])
    store = TrigramStore(tmp_path / "grep")
    idx = store.current(db)
    assert sorted(idx.live_paths()) == ["a.py", "b.py"] and idx.postings == 0
    _write(lc, _chunks(3), b"")
    idx = store.current(db)
    assert len(idx.files_with(int.from_bytes(b"dis", "big"))) == 3
    path = sorted(_chunks(3))[0]
    lc.replace_files([(path, b"emptied".ljust(16, b"\0"), [])])  # an update of no trigram
    idx = store.current(db)
    assert store.last_refresh["mode"] in ("update", "merge")
    assert len(idx.files_with(int.from_bytes(b"dis", "big"))) == 2
    assert path in idx.live_paths()
