"""The approximate vector index over a large base: it answers as exact search does, sees
edits without a rebuild, applies filters as masks, survives a restart and a damaged file,
and is built by a process of its own that outlives the one that asked for it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.chunk import Chunk
from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval.indexes.filters import HitFilter
from retrieval.indexes.local_vectors.approx import ApproxPlanes
from retrieval.indexes.local_vectors.approx_build import TRAINED_FILE, approx_path, build, building
from retrieval.indexes.local_vectors.store import LocalVectorStore
from tests.test_local_vectors import MODEL, Repo, _keys

DIM = 16  # as the exact index's tests: the store is keyed by (MODEL, DIM)


class ClusteredRepo(Repo):
    """Chunks whose vectors sit around a few centroids, as real embeddings do."""

    centroids: np.ndarray

    def clustered(self, path: str, n: int, version: str = "v1") -> None:
        chunks = [Chunk(path, 1 + 3 * i, 3 + 3 * i, "python" if path.endswith(".py") else "text",
                        f"f{i}", f"def f{i}_{version}():  # {path}\n    return {i}\n\n")
                  for i in range(n)]
        picks = self.rng.integers(0, len(self.centroids), n)
        vs = self.centroids[picks] + 0.35 * self.rng.standard_normal((n, DIM))
        vs = (vs / np.linalg.norm(vs, axis=1, keepdims=True)).astype(np.float32)
        self.cache.put_many([(cache_key(MODEL, c.embed_text), v) for c, v
                             in zip(chunks, vs, strict=True)])
        for c in chunks:
            self.put_header(c)
        self.chunks.replace_files([(path, f"{path}:{version}".encode(), chunks)])
        self.files[path] = list(zip(chunks, vs, strict=True))

    def clustered_query(self) -> np.ndarray:
        q = self.centroids[self.rng.integers(len(self.centroids))] \
            + 0.35 * self.rng.standard_normal(DIM)
        return (q / np.linalg.norm(q)).astype(np.float32)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusteredRepo]:
    monkeypatch.setenv("CODEVEIL_APPROX_MIN_CHUNKS", "1000")  # a small base qualifies
    (tmp_path / ".codeveil").mkdir()
    db = open_state_db(tmp_path / ".codeveil" / "state.sqlite")
    cache = EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite")
    r = ClusteredRepo(tmp_path, db, LocalChunks(db), cache)
    r.centroids = r.rng.standard_normal((24, DIM)).astype(np.float32)
    for i in range(60):
        r.clustered(f"pkg/mod{i}.py", 40)  # 2,400 chunks
    yield r
    cache.close()
    db.close()


def _ready(repo: ClusteredRepo, store: LocalVectorStore):
    index = repo.current(store)
    assert store.wait_approx(120)
    index = repo.current(store)
    assert index.approx is not None
    return index


def _recall(repo: ClusteredRepo, index, n: int = 10, queries: int = 20,
            keep: HitFilter | None = None) -> float:
    found = 0
    for _ in range(queries):
        q = repo.clustered_query()
        got = index.nearest(q, n, keep=keep)
        want = [k for k, _ in repo.brute(q, n, keep)]
        # Scores are the exact cosines, best first, whatever the candidates were.
        exact = {k: s for k, s in repo.brute(q, 10_000, keep)}
        np.testing.assert_allclose([s for _, s in got], [exact[k] for k in _keys(got)],
                                   rtol=1e-5, atol=1e-6)
        found += len(set(_keys(got)) & set(want))
    return found / (n * queries)


def test_the_approximate_index_finds_the_exact_top_hits(repo: ClusteredRepo) -> None:
    store = repo.store()
    first = repo.current(store)
    assert first.approx is None  # exact answers while the build runs
    index = _ready(repo, store)
    assert store.approx_builds == 1
    assert _recall(repo, index) >= 0.95
    q = np.stack([repo.clustered_query(), repo.clustered_query()])
    each = index.nearest_each(q, 10)
    assert [_keys(h) for h in each] == [_keys(index.nearest(v, 10)) for v in q]


def test_below_the_threshold_search_stays_exact(repo: ClusteredRepo,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_APPROX_MIN_CHUNKS", "1000000")
    store = repo.store()
    repo.current(store)
    assert store.wait_approx(60) and repo.current(store).approx is None
    assert store.approx_builds == 0


def test_an_edit_is_seen_without_a_rebuild(repo: ClusteredRepo) -> None:
    store = repo.store()
    _ready(repo, store)
    repo.clustered("pkg/mod3.py", 40, "v2")  # new vectors for one file
    repo.remove("pkg/mod4.py")
    index = repo.current(store)
    assert index.approx is not None and len(index.delta_docs) == 40
    assert _recall(repo, index) >= 0.95
    # The new chunks are found by their own vectors; the removed file never comes back.
    for c, v in repo.files["pkg/mod3.py"][:5]:
        assert _keys(index.nearest(v, 1)) == [(c.path, c.start_line, c.end_line)]
    hits = [d.path for d, _ in index.nearest(repo.clustered_query(), 300)]
    assert "pkg/mod4.py" not in hits
    assert store.wait_approx(60)
    assert store.approx_builds == 1  # no rebuild for the edit


@pytest.mark.parametrize("flt", [HitFilter(path="pkg/mod1*.py"), HitFilter(language="python")],
                         ids=["narrow", "wide"])
def test_filters_apply_to_the_approximate_index(repo: ClusteredRepo, flt: HitFilter,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import retrieval.indexes.local_vectors.index as index_module

    # The wide filter goes through the IVF with a mask, not the exact path over its rows.
    monkeypatch.setattr(index_module, "EXACT_FILTER_ROWS", 500)
    store = repo.store()
    index = _ready(repo, store)
    assert _recall(repo, index, keep=flt) >= 0.95
    for _ in range(5):
        assert all(flt(d) for d, _ in index.nearest(repo.clustered_query(), 20, keep=flt))


def test_a_restart_reopens_the_saved_approximate_index(repo: ClusteredRepo) -> None:
    store = repo.store()
    index = _ready(repo, store)
    q = repo.clustered_query()
    before = index.nearest(q, 10)
    again = LocalVectorStore(repo.folder)
    reopened = repo.current(again)
    assert reopened.approx is not None  # read from disk at once, not built
    assert again.approx_builds == 0
    assert _keys(reopened.nearest(q, 10)) == _keys(before)


def test_a_damaged_approximate_file_is_rebuilt_with_a_warning(
        repo: ClusteredRepo, caplog: pytest.LogCaptureFixture) -> None:
    store = repo.store()
    _ready(repo, store)
    [saved] = repo.folder.glob("approx-" + "?" * 16 + ".npy")
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    again = LocalVectorStore(repo.folder)
    with caplog.at_level(logging.WARNING, logger="retrieval.indexes.local_vectors"):
        assert repo.current(again).approx is None  # exact meanwhile
    assert any("approximate vector index" in r.getMessage() and "damaged" in r.getMessage()
               for r in caplog.records)
    index = _ready(repo, again)
    assert again.approx_builds == 1
    assert _recall(repo, index) >= 0.95


def _base_id(store: LocalVectorStore) -> bytes:
    assert store._saved is not None
    return store._saved.base_id


def test_the_build_runs_in_its_own_process_and_outlives_a_one_shot_caller(
        repo: ClusteredRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_APPROX_MIN_CHUNKS", "1000000")
    store = repo.store()
    repo.current(store)  # saves the base, too small here for a build
    assert store.approx_builds == 0
    monkeypatch.setenv("CODEVEIL_APPROX_MIN_CHUNKS", "1000")
    base_id = _base_id(store)
    # A one-shot process (as `codeveil search`) asks for the index and exits at once.
    script = (
        "import sys; from pathlib import Path\n"
        "from indexer.embed_cache import EmbeddingCache\n"
        "from indexer.local_chunks import open_state_db\n"
        "from retrieval.indexes.local_vectors.store import LocalVectorStore\n"
        "from tests.test_approx_vectors import DIM\n"
        "from tests.test_local_vectors import MODEL\n"
        "root = Path(sys.argv[1])\n"
        "store = LocalVectorStore(root / '.codeveil' / 'vectors')\n"
        "index = store.current(open_state_db(root / '.codeveil' / 'state.sqlite'),\n"
        "    EmbeddingCache(root / 'cache' / 'embeddings.sqlite'), MODEL, DIM)\n"
        "assert index.approx is None and store.approx_builds == 1\n"
        "print(store._builder.pid)\n")
    root = repo.folder.parents[1]
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    builder = int(done.stdout.split()[-1])
    assert builder != os.getpid()
    deadline = time.monotonic() + 120
    # The builder writes its index, then clears its marker: wait for both.
    while not approx_path(repo.folder, base_id).exists() or building(repo.folder, base_id):
        assert time.monotonic() < deadline, "the build did not finish after its caller exited"
        time.sleep(0.1)
    again = LocalVectorStore(repo.folder)
    assert repo.current(again).approx is not None
    assert again.approx_builds == 0


def test_one_builder_per_base_whichever_process_asks(repo: ClusteredRepo) -> None:
    first = repo.store()
    repo.current(first)
    assert first.approx_builds == 1 and building(repo.folder, _base_id(first))
    second = LocalVectorStore(repo.folder)  # another process's store, asking meanwhile
    repo.current(second)
    assert second.approx_builds == 0  # the first's build serves both
    assert second.wait_approx(120) and first.wait_approx(120)
    assert repo.current(second).approx is not None


def test_a_dead_builder_is_replaced_and_one_that_keeps_dying_is_given_up(
        repo: ClusteredRepo, caplog: pytest.LogCaptureFixture) -> None:
    store = repo.store()
    _ready(repo, store)
    base_id = _base_id(store)
    approx_path(repo.folder, base_id).unlink()
    gone = 2**22 + 7  # above Linux's largest pid: no such process
    marker = repo.folder / f"approx-{base_id.hex()}.building"
    marker.write_text(f"{gone} 1\n")  # a builder killed mid-way
    again = LocalVectorStore(repo.folder)
    assert repo.current(again).approx is None
    assert again.approx_builds == 1  # started afresh
    assert _ready(repo, again).approx is not None
    approx_path(repo.folder, base_id).unlink()
    marker.write_text(f"{gone} 3\n")  # the third attempt died too
    last = LocalVectorStore(repo.folder)
    with caplog.at_level(logging.WARNING, logger="retrieval.indexes.local_vectors"):
        assert repo.current(last).approx is None
        assert repo.current(last).approx is None
    assert last.approx_builds == 0
    told = [r.getMessage() for r in caplog.records if "could not be built" in r.getMessage()]
    assert len(told) == 1 and "died 3 times" in told[0]  # said once, not per search
    assert last.wait_approx(5)


def test_the_next_base_reuses_the_trained_quantizers(repo: ClusteredRepo) -> None:
    store = repo.store()
    first = _ready(repo, store).approx
    assert first is not None
    trained = ApproxPlanes.load(repo.folder / TRAINED_FILE, 0, DIM)
    assert trained.trained_rows == first.trained_rows
    assert all(p.ntotal == 0 for p in trained.planes)  # type: ignore[attr-defined]
    base_id = _base_id(store)
    approx_path(repo.folder, base_id).unlink()
    (repo.folder / TRAINED_FILE).write_bytes(b"")  # no quantizers to reuse: trained again
    assert build(repo.folder, base_id)
    retrained = ApproxPlanes.load(approx_path(repo.folder, base_id), first.planes[0].ntotal,  # type: ignore[attr-defined]
                                  DIM)
    assert retrained.trained_rows == first.trained_rows
    assert ApproxPlanes.load(repo.folder / TRAINED_FILE, 0, DIM).planes  # written again
