"""The client's vector index: exact ranking, kept in step with the chunk table, on disk."""

from __future__ import annotations

import logging
import sqlite3
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.location import ChunkLocation
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.local_vectors import DELTA_FILE, LocalVectorStore
from retrieval.indexes.local_vectors import spill as spill_module

MODEL = "test-model"
DIM = 16


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@dataclass
class Repo:
    """A real state database and embedding cache, and what the test put in them."""

    root: Path
    db: sqlite3.Connection
    chunks: LocalChunks
    cache: EmbeddingCache
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(7))
    # path -> its chunks with their vectors (None: the cache lacks it), and pending paths
    files: dict[str, list[tuple[Chunk, np.ndarray | None]]] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    headers: dict[str, np.ndarray] = field(default_factory=dict)  # header -> its vector

    @property
    def folder(self) -> Path:
        return self.root / ".codeveil" / "vectors"

    def write(self, path: str, n: int, version: str = "v1", *, pending: bool = False,
              without_vector: int | None = None,
              without_header: int | None = None) -> list[Chunk]:
        chunks = [Chunk(path, 1 + 3 * i, 3 + 3 * i, "python" if path.endswith(".py") else "text",
                        f"f{i}", f"def f{i}_{version}():  # {path}\n    return {i}\n\n")
                  for i in range(n)]
        rows = [(c, None if i == without_vector else _unit(self.rng))
                for i, c in enumerate(chunks)]
        self.cache.put_many([(cache_key(MODEL, c.embed_text), v) for c, v in rows
                             if v is not None])
        for i, c in enumerate(chunks):
            if i != without_header:
                self.put_header(c)
        self.chunks.replace_files([(path, f"{path}:{version}".encode(), chunks)],
                                  pending=pending)
        self.files[path] = rows
        (self.pending.add if pending else self.pending.discard)(path)
        return chunks

    def put_header(self, c: Chunk) -> np.ndarray:
        """The header vector of `c` (one per distinct header), put in the cache."""
        if c.header not in self.headers:
            self.headers[c.header] = _unit(self.rng)
            self.cache.put_many([(cache_key(MODEL, c.header), self.headers[c.header])])
        return self.headers[c.header]

    def remove(self, path: str) -> None:
        self.chunks.remove_files([path])
        del self.files[path]
        self.pending.discard(path)

    def store(self) -> LocalVectorStore:
        return LocalVectorStore(self.folder)

    def current(self, store: LocalVectorStore):
        return store.current(self.db, self.cache, MODEL, DIM)

    def brute(self, q: np.ndarray, n: int, keep=None) -> list[tuple[tuple[str, int, int], float]]:
        """The exact answer, computed from what the test wrote."""
        rows = [(ChunkLocation(c.path, c.start_line, c.end_line, c.symbol, c.language,
                               c.chunk_hash), float(v @ q))
                for p, rs in self.files.items() if p not in self.pending
                for c, v in rs if v is not None]
        rows = [r for r in rows if keep is None or keep(r[0])]
        rows.sort(key=lambda r: -r[1])
        return [(d.key, s) for d, s in rows[:n]]

    def query(self) -> np.ndarray:
        return _unit(self.rng)


@pytest.fixture(params=["in memory", "mapped"], autouse=True)
def spill(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: bases built in memory (small ones, as here) and written into a
    file-backed map (large ones, forced here by a threshold of 0 bytes)."""
    if request.param == "mapped":
        monkeypatch.setattr(spill_module, "SPILL_MIN_BYTES", 0)
    return str(request.param)


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repo]:
    (tmp_path / ".codeveil").mkdir()
    db = open_state_db(tmp_path / ".codeveil" / "state.sqlite")
    cache = EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite")
    yield Repo(tmp_path, db, LocalChunks(db), cache)
    cache.close()
    db.close()


def _fill(repo: Repo, files: int = 30, per_file: int = 5) -> None:
    for i in range(files):
        repo.write(f"pkg/mod{i}.py", per_file)


def _keys(hits: list[tuple[ChunkLocation, float]]) -> list[tuple[str, int, int]]:
    return [d.key for d, _ in hits]


def _assert_exact(repo: Repo, index, n: int, queries: int = 5, keep=None) -> None:
    for _ in range(queries):
        q = repo.query()
        got = index.nearest(q, n, keep=keep)
        want = repo.brute(q, n, keep)
        assert _keys(got) == [k for k, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5,
                                   atol=1e-6)


def test_nearest_is_the_exact_top_n(repo: Repo) -> None:
    _fill(repo)
    store = repo.store()
    index = repo.current(store)
    assert index.count == 150 and index.missing == 0
    assert store.last_refresh["mode"] == "rebuild"
    for n in (1, 10, 150, 500):
        _assert_exact(repo, index, n)
    assert len(index.nearest(repo.query(), 500)) == 150
    assert index.nearest(repo.query(), 0) == []


def test_hits_carry_the_chunk_tables_hash_and_lines(repo: Repo) -> None:
    _fill(repo, files=3)
    index = repo.current(repo.store())
    rows = {(c.path, c.start_line, c.end_line): c for c in
            (c for p in repo.files for c in repo.chunks.for_file(p))}
    for doc, _ in index.nearest(repo.query(), 15):
        chunk = rows[doc.key]
        assert doc.chunk_hash == chunk.chunk_hash
        assert (doc.symbol, doc.language) == (chunk.symbol, chunk.language)


def test_query_of_the_wrong_size_is_a_clear_error(repo: Repo) -> None:
    _fill(repo, files=2)
    index = repo.current(repo.store())
    with pytest.raises(ValueError, match="16-dim"):
        index.nearest(np.ones(DIM + 1, dtype=np.float32), 3)
    with pytest.raises(ValueError, match="zero"):
        index.nearest(np.zeros(DIM, dtype=np.float32), 3)


def test_nothing_changed_returns_the_same_index(repo: Repo) -> None:
    _fill(repo, files=5)
    store = repo.store()
    index = repo.current(store)
    store.last_refresh = {}
    assert repo.current(store) is index
    assert store.last_refresh == {}


def test_an_edited_file_loses_its_old_chunks_and_gains_its_new_ones(repo: Repo) -> None:
    _fill(repo)
    store = repo.store()
    repo.current(store)
    old = repo.files["pkg/mod3.py"]
    new = repo.write("pkg/mod3.py", 2, "v2")
    index = repo.current(store)
    assert store.last_refresh["mode"] == "update" and store.last_refresh["read"] == 2
    assert index.count == 147
    old_hashes = {c.chunk_hash for c, _ in old}
    everything = index.nearest(repo.query(), 1000)
    assert not old_hashes & {d.chunk_hash for d, _ in everything}
    for (chunk, vec) in repo.files["pkg/mod3.py"]:
        assert vec is not None
        top = index.nearest(vec, 1)[0][0]
        assert top.chunk_hash == chunk.chunk_hash
    for _, vec in old:
        assert vec is not None
        assert index.nearest(vec, 1)[0][0].key not in {(c.path, c.start_line, c.end_line)
                                                      for c, _ in old[len(new):]}
    _assert_exact(repo, index, 20)


def test_a_deleted_file_never_comes_back(repo: Repo) -> None:
    _fill(repo)
    store = repo.store()
    repo.current(store)
    gone = repo.files["pkg/mod4.py"]
    repo.remove("pkg/mod4.py")
    index = repo.current(store)
    assert index.count == 145
    for _, vec in gone:
        assert all(d.path != "pkg/mod4.py" for d, _ in index.nearest(vec, 1000))
    _assert_exact(repo, index, 20)
    # Nor after a reload from disk.
    again = repo.current(repo.store())
    assert all(d.path != "pkg/mod4.py" for d, _ in again.nearest(repo.query(), 1000))


def test_a_pending_file_enters_once_marked_stored(repo: Repo) -> None:
    _fill(repo, files=10)
    store = repo.store()
    repo.current(store)
    repo.write("late/new.py", 3, pending=True)
    index = repo.current(store)
    assert index.count == 50
    assert all(d.path != "late/new.py" for d, _ in index.nearest(repo.query(), 100))
    repo.chunks.mark_stored(["late/new.py"])  # same digest: only the pending list changed
    repo.pending.discard("late/new.py")
    index = repo.current(store)
    assert index.count == 53
    assert store.last_refresh["read"] == 3
    _assert_exact(repo, index, 53)
    # A stored file made pending again (being re-indexed) leaves until stored again.
    repo.write("late/new.py", 3, "v2", pending=True)
    assert repo.current(store).count == 50


def test_a_chunk_without_a_vector_is_counted_and_left_out(repo: Repo) -> None:
    _fill(repo, files=10)
    store = repo.store()
    repo.current(store)
    chunks = repo.write("pkg/holey.py", 4, without_vector=2)
    index = repo.current(store)
    assert index.count == 53 and index.missing == 1
    assert chunks[2].chunk_hash not in {d.chunk_hash for d, _ in index.nearest(repo.query(),
                                                                                100)}
    _assert_exact(repo, index, 60)
    # The count survives a reload, and once the cache has the vector, the next change
    # of the chunk table reads the file again.
    assert repo.current(repo.store()).missing == 1
    vec = _unit(repo.rng)
    repo.cache.put_many([(cache_key(MODEL, chunks[2].embed_text), vec)])
    repo.files["pkg/holey.py"][2] = (chunks[2], vec)
    repo.write("pkg/mod0.py", 5, "v2")
    index = repo.current(store)
    assert index.count == 54 and index.missing == 0
    assert index.nearest(vec, 1)[0][0].chunk_hash == chunks[2].chunk_hash


def test_header_vectors_are_ranked_on_their_own(repo: Repo) -> None:
    _fill(repo, files=20, per_file=4)
    index = repo.current(repo.store())
    assert index.header_count == index.count == 80
    for _ in range(5):
        q = repo.query()
        want = sorted(((c.path, c.start_line, c.end_line), float(repo.headers[c.header] @ q))
                      for rs in repo.files.values() for c, _ in rs)
        want.sort(key=lambda r: -r[1])
        got = index.nearest(q, 10, header=True)
        assert _keys(got) == [k for k, _ in want[:10]]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want[:10]],
                                   rtol=1e-5, atol=1e-6)
    # A chunk's header vector is its header's, not its body's: the two rankings differ.
    q = repo.query()
    assert _keys(index.nearest(q, 10)) != _keys(index.nearest(q, 10, header=True))


def test_nearest_each_is_nearest_of_each_query(repo: Repo) -> None:
    _fill(repo, files=20, per_file=4)
    store = repo.store()
    repo.current(store)
    repo.write("pkg/late.py", 3, without_header=0)  # a delta, one row without a header
    repo.remove("pkg/mod3.py")  # masked base rows
    index = repo.current(store)
    assert index.delta.shape[1] and index.deleted.any()
    queries = np.stack([repo.query() for _ in range(4)])
    for header in (False, True):
        each = index.nearest_each(queries, 12, header=header)
        assert [_keys(hits) for hits in each] == [_keys(index.nearest(q, 12, header=header))
                                                  for q in queries]
    with pytest.raises(ValueError, match="dim"):
        index.nearest_each(np.ones((2, DIM + 1), dtype=np.float32), 3)


def test_a_chunk_without_a_header_vector_is_ranked_by_its_body_only(repo: Repo) -> None:
    _fill(repo, files=10)
    store = repo.store()
    repo.current(store)
    chunks = repo.write("pkg/headless.py", 3, without_header=1)
    index = repo.current(store)
    assert index.count == 53 and index.header_count == 52 and index.missing == 0
    lacking = chunks[1].chunk_hash
    assert lacking in {d.chunk_hash for d, _ in index.nearest(repo.query(), 53)}
    assert lacking not in {d.chunk_hash for d, _ in index.nearest(repo.query(), 53,
                                                                      header=True)}
    # Later changes do not re-read it while the sync has not recorded that the cache
    # holds every header: an index made before chunks had header vectors would be
    # re-read on every refresh.
    repo.write("pkg/mod0.py", 5, "v2")
    repo.current(store)
    assert store.last_refresh["read"] == 5
    # Once it has (the header embedded, the sync's mark), the next refresh reads it.
    vec = repo.put_header(chunks[1])
    repo.chunks.mark_headers_embedded(MODEL)
    index = repo.current(store)
    assert store.last_refresh["mode"] != "rebuild" and store.last_refresh["read"] == 3
    assert index.header_count == 53
    assert index.nearest(vec, 1, header=True)[0][0].chunk_hash == lacking
    # And it is saved with its header vector.
    assert repo.current(repo.store()).header_count == 53


def test_keep_still_returns_n_when_it_filters_most_hits(repo: Repo) -> None:
    _fill(repo, files=60)
    repo.write("docs/guide.md", 8)
    index = repo.current(repo.store())

    def only_docs(d: ChunkLocation) -> bool:
        return d.path.startswith("docs/")

    def not_docs(d: ChunkLocation) -> bool:
        return d.language == "python"

    hits = index.nearest(repo.query(), 5, keep=only_docs)
    assert len(hits) == 5 and all(d.path == "docs/guide.md" for d, _ in hits)
    assert len(index.nearest(repo.query(), 50, keep=only_docs)) == 8
    _assert_exact(repo, index, 5, keep=only_docs)
    _assert_exact(repo, index, 100, keep=not_docs)


def test_a_saved_index_reloads_with_the_same_answers(repo: Repo) -> None:
    _fill(repo)
    store = repo.store()
    repo.current(store)
    repo.write("pkg/mod1.py", 3, "v2")  # so that a delta and a mask are saved too
    index = repo.current(store)
    queries = [repo.query() for _ in range(5)]
    other = repo.store()  # another process
    again = repo.current(other)
    assert other.last_refresh == {}  # loaded, not rebuilt
    assert again.count == index.count
    for q in queries:
        assert index.nearest(q, 40) == again.nearest(q, 40)


def test_saved_files_are_private(repo: Repo) -> None:
    _fill(repo, files=3)
    repo.current(repo.store())
    assert stat.S_IMODE(repo.folder.stat().st_mode) == 0o700
    for f in repo.folder.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f.name


def _base_vectors(folder: Path) -> Path:
    (base,) = folder.glob("base-*.npy")
    return base


def test_a_one_file_change_does_not_rewrite_the_base(repo: Repo) -> None:
    _fill(repo, files=40)
    store = repo.store()
    repo.current(store)
    base = _base_vectors(repo.folder)
    before = base.stat()
    delta_before = (repo.folder / DELTA_FILE).stat()
    repo.write("pkg/mod5.py", 5, "v2")
    repo.current(store)
    assert store.last_refresh["mode"] == "update"
    after = _base_vectors(repo.folder).stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino, before.st_mtime_ns, before.st_size)
    assert (repo.folder / DELTA_FILE).stat().st_ino != delta_before.st_ino


def test_a_large_delta_is_merged_into_a_new_base(repo: Repo) -> None:
    _fill(repo, files=20)
    store = repo.store()
    repo.current(store)
    old_base = _base_vectors(repo.folder)
    for i in range(4):  # a fifth of the chunks: past the merge share
        repo.write(f"pkg/mod{i}.py", 6, "v2")
    index = repo.current(store)
    assert store.last_refresh["mode"] == "merge"
    assert index.delta.shape[1] == 0 and not index.deleted.any()
    assert not old_base.exists() and _base_vectors(repo.folder) != old_base
    _assert_exact(repo, index, 30)
    _assert_exact(repo, repo.current(repo.store()), 30)


@pytest.mark.parametrize("damage", ["truncate delta", "garble delta", "truncate vectors",
                                    "garble vectors", "garble metadata", "lose the base"])
def test_a_damaged_saved_file_is_rebuilt(repo: Repo, damage: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    _fill(repo, files=10)
    repo.current(repo.store())
    vectors = _base_vectors(repo.folder)
    target = {"delta": repo.folder / DELTA_FILE, "vectors": vectors,
              "metadata": vectors.with_suffix(".npz"), "base": vectors}[damage.split()[-1]]
    data = target.read_bytes()
    if damage.startswith("truncate"):
        target.write_bytes(data[: len(data) // 2])
    elif damage.startswith("garble"):
        at = len(data) - 200  # past the headers: a flip only a checksum sees
        target.write_bytes(data[:at] + bytes(b ^ 0x5A for b in data[at : at + 50])
                           + data[at + 50 :])
    else:
        target.unlink()
    store = repo.store()
    with caplog.at_level(logging.WARNING, logger="retrieval.indexes.local_vectors"):
        index = repo.current(store)
    assert store.last_refresh["mode"] == "rebuild"
    if damage != "lose the base":
        assert "damaged" in caplog.text
    _assert_exact(repo, index, 50)
    other = repo.store()
    repo.current(other)
    assert other.last_refresh == {}  # the rebuilt index was saved


def test_another_format_version_is_rebuilt(repo: Repo) -> None:
    _fill(repo, files=5)
    repo.current(repo.store())
    delta = repo.folder / DELTA_FILE
    with np.load(delta) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["version"] = np.array([arrays["version"][0] + 1])
    with open(delta, "wb") as f:
        np.savez(f, **arrays)
    store = repo.store()
    _assert_exact(repo, repo.current(store), 25)
    assert store.last_refresh["mode"] == "rebuild"


def test_a_recreated_database_is_noticed(repo: Repo) -> None:
    _fill(repo, files=5)
    store = repo.store()
    repo.current(store)
    repo.db.close()
    for suffix in ("", "-wal", "-shm"):
        (repo.root / ".codeveil" / f"state.sqlite{suffix}").unlink(missing_ok=True)
    repo.db = open_state_db(repo.root / ".codeveil" / "state.sqlite")
    repo.chunks = LocalChunks(repo.db)
    repo.files.clear()
    repo.write("other.py", 2)
    for s in (repo.store(), store):  # a new process, then the one that had it
        index = repo.current(s)
        assert s.last_refresh["mode"] == "rebuild"
        assert {d.path for d, _ in index.nearest(repo.query(), 10)} == {"other.py"}


def test_another_model_gets_its_own_index(repo: Repo) -> None:
    _fill(repo, files=3)
    store = repo.store()
    assert repo.current(store).count == 15
    other = store.current(repo.db, repo.cache, "another-model", DIM)
    assert other.count == 0 and other.missing == 15
    assert repo.current(store).count == 15


def test_an_index_that_cannot_be_saved_still_answers(repo: Repo) -> None:
    _fill(repo, files=3)
    repo.folder.write_bytes(b"")  # a file where the folder should be: every save fails
    store = repo.store()
    _assert_exact(repo, repo.current(store), 5)
    assert store.last_refresh["mode"] == "rebuild"


@pytest.mark.parametrize("flt", [
    HitFilter(path="docs/*"),                 # 8 of 308 chunks: gathered rows
    HitFilter(language="python"),             # nearly all: one pass, then the rows
    HitFilter(path="pkg/mod1*.py", language="python"),
    HitFilter(path="nothing/*"),
], ids=["narrow", "wide", "both", "none"])
def test_a_filter_is_a_mask_with_the_exact_answer(repo: Repo, flt: HitFilter) -> None:
    _fill(repo, files=60)
    repo.write("docs/guide.md", 8)
    store = repo.store()
    repo.current(store)
    # A delta and deleted base rows: the mask covers both halves of the index.
    repo.write("pkg/mod3.py", 5, "v2")
    repo.remove("pkg/mod4.py")
    repo.write("docs/extra.md", 2)
    index = repo.current(store)
    assert len(index.delta_docs) and index.deleted.any()
    for n in (1, 5, 400):
        _assert_exact(repo, index, n, keep=flt)
    q = np.stack([repo.query(), repo.query()])
    each = index.nearest_each(q, 5, keep=flt)
    assert [_keys(h) for h in each] == [[k for k, _ in repo.brute(v, 5, flt)] for v in q]
    rows = index.rows_kept(flt)
    assert index.rows_kept(flt) is rows  # kept for the next query with this filter


def test_a_masked_header_search_skips_rows_without_a_header(repo: Repo) -> None:
    for i in range(40):
        repo.write(f"pkg/mod{i}.py", 3)
    lacking = repo.write("pkg/odd.py", 3, without_header=1)
    index = repo.current(repo.store())
    hits = index.nearest(repo.query(), 10, keep=HitFilter(path="pkg/odd.py"), header=True)
    assert sorted(d.start_line for d, _ in hits) == [lacking[0].start_line,
                                                     lacking[2].start_line]


def test_a_large_base_is_built_and_merged_in_a_map_and_saved_in_slices(
        repo: Repo, spill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if spill != "mapped":
        pytest.skip("about the mapped build")
    monkeypatch.setattr(spill_module, "SLICE_ROWS", 7)  # many slices of a small base
    _fill(repo, files=20)
    store = repo.store()
    index = repo.current(store)
    # Written into an unlinked file beside the index: mapped, and no file left behind.
    assert isinstance(index.base, np.memmap) or getattr(index.base, "_mmap", None) is not None
    assert not [p for p in repo.folder.iterdir() if p.name.startswith(spill_module.TEMP_PREFIX)]
    saved = np.load(_base_vectors(repo.folder), mmap_mode="r")
    np.testing.assert_array_equal(saved, index.base)
    for i in range(5):  # past the merge share: the merge copies into a map too
        repo.write(f"pkg/mod{i}.py", 6, "v2")
    merged = repo.current(store)
    assert store.last_refresh["mode"] == "merge"
    assert getattr(merged.base, "_mmap", None) is not None
    _assert_exact(repo, merged, 30)
    # The slices' checksum is the whole array's: a fresh process loads the base.
    _assert_exact(repo, repo.current(repo.store()), 30)


def test_save_planes_writes_the_npy_and_checksum_of_the_whole_array(tmp_path: Path) -> None:
    import io

    import xxhash

    planes = np.random.default_rng(3).standard_normal((2, 50, 8)).astype(np.float32)
    view = np.concatenate([planes, planes[:, :10]], axis=1)[:, :50]  # not contiguous
    buf = io.BytesIO()
    checksum = spill_module.save_planes(buf, view)
    buf.seek(0)
    np.testing.assert_array_equal(np.load(buf), planes)
    assert checksum == xxhash.xxh3_64_intdigest(planes.tobytes())
