"""`codeveil doctor`: every file the client and the embedded store own is damaged in turn
(real files, real SQLite and LanceDB); the doctor must name the file, `--repair` must
bring back the same search results, and `codeveil index` must not report success over a
store it cannot read. The repo is sealed (its rows in the store's tree.sqlite) but for
the damages of a LanceDB table, which only a server-search workspace has."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from indexer.embed_cache import cache_key
from indexer.embedder import HashingEmbedder
from retrieval import Index
from retrieval.faces.doctor import doctor
from sync.checkout.config import load_config, store_path
from sync.records import MODE_SEALED, MODE_SERVER_SEARCH
from sync.wire import StoreCorrupt
from tests.conftest import write_repo

QUERIES = ["retry failed uploads", "password hash", "shopping cart total", "distance"]


def results(repo: Path) -> list[tuple[tuple[str, int, str], frozenset]]:
    """Each query's best hit and its set of hits (with their text). The order below the
    best varies from run to run: each query is encrypted with a fresh perturbation."""
    with Index(repo, embedder=HashingEmbedder()) as idx:
        out = []
        for q in QUERIES:
            hits = idx.search(q, k=5)
            assert not any(h.stale for h in hits)
            keys = [(h.path, h.start_line, h.text) for h in hits]
            out.append((keys[0], frozenset(keys)))
        return out


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
         ) -> Path:
    """An indexed repo, sealed unless the test asks for a mode (indirect parameter)."""
    # A cache of its own: some tests damage it.
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    root = write_repo(tmp_path / "repo")
    with Index(root, embedder=HashingEmbedder()) as idx:
        if getattr(request, "param", MODE_SEALED) == MODE_SERVER_SEARCH:
            idx.init(server_search=True)
        idx.index(wait=True)
    return root


def garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))


def workspace_dir(repo: Path) -> Path:
    return store_path(repo) / "workspaces" / load_config(repo).workspace_id


def lance_files(repo: Path, folder: str) -> list[Path]:
    """The files of a server-search workspace's LanceDB table."""
    return sorted((workspace_dir(repo) / "chunks.lance" / folder).iterdir())


def _drop_wal(path: Path) -> None:
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def damage_state(repo: Path) -> Path:
    path = repo / ".codeveil/state.sqlite"
    path.write_bytes(b"not a database" * 500)
    _drop_wal(path)
    return path


def delete_state(repo: Path) -> Path:
    path = repo / ".codeveil/state.sqlite"
    path.unlink()
    _drop_wal(path)
    return path


def garble_cache(repo: Path) -> Path:
    path = Path(os.environ["CODEVEIL_CACHE_DIR"]) / "embeddings.sqlite"
    path.write_bytes(b"garbage!" * 4096)
    _drop_wal(path)
    return path


def empty_cache(repo: Path) -> Path:
    path = Path(os.environ["CODEVEIL_CACHE_DIR"]) / "embeddings.sqlite"
    db = sqlite3.connect(path)
    db.execute("DELETE FROM embeddings")
    db.commit()
    db.close()
    return path


def lose_header_vectors(repo: Path) -> Path:
    """The cache keeps the chunks' vectors but loses their headers' (the second vector
    a sealed workspace's search ranks)."""
    path = Path(os.environ["CODEVEIL_CACHE_DIR"]) / "embeddings.sqlite"
    state = sqlite3.connect(repo / ".codeveil/state.sqlite")
    headers = {f"{p} > {s}" if s else p
               for p, s in state.execute("SELECT DISTINCT path, symbol FROM chunks")}
    state.close()
    model = HashingEmbedder().model_id
    db = sqlite3.connect(path)
    with db:
        gone = db.executemany("DELETE FROM embeddings WHERE key = ?",
                              [(cache_key(model, h),) for h in headers]).rowcount
    db.close()
    assert gone == len(headers)
    return path


def truncate_lexical(repo: Path) -> Path:
    path = repo / ".codeveil/lexical/base.npz"
    path.write_bytes(path.read_bytes()[:100])
    return path.parent


def _largest_vector_file(repo: Path) -> Path:
    folder = repo / ".codeveil/vectors"
    return max((p for p in folder.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)


def truncate_vectors(repo: Path) -> Path:
    path = _largest_vector_file(repo)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path.parent


def garble_vectors(repo: Path) -> Path:
    path = _largest_vector_file(repo)
    garble(path)
    return path.parent


def delete_vector_base(repo: Path) -> Path:  # the delta names a base that is gone
    folder = repo / ".codeveil/vectors"
    for base in folder.glob("base-*"):
        base.unlink()
    return folder


def _tree_sql(repo: Path, sql: str) -> Path:
    db = sqlite3.connect(workspace_dir(repo) / "tree.sqlite")
    db.executescript(sql)
    db.close()
    return workspace_dir(repo)


def lose_rows(repo: Path) -> Path:  # the tree claims files whose rows are gone
    # Every row, not some: a page's free slots hold copies of rows of other pages, so a
    # file whose deleted rows all have a copy left loses nothing, and a test deleting
    # half the rows passed or failed by chance.
    return _tree_sql(repo, "DELETE FROM rows")


def drop_rows(repo: Path) -> Path:
    return _tree_sql(repo, "DROP TABLE rows")


def garble_rows(repo: Path) -> Path:  # intact pages, altered envelopes
    return _tree_sql(repo, "UPDATE rows SET meta = randomblob(length(meta)) WHERE rid % 3 = 0")


def orphan_rows(repo: Path) -> Path:  # rows of a file the tree does not have
    return _tree_sql(repo, "INSERT INTO rows (fid, chunk_id, meta)"
                           " SELECT fid + 1, chunk_id, meta FROM rows LIMIT 2")


def delete_lance_data(repo: Path) -> Path:
    for f in lance_files(repo, "data"):
        f.unlink()
    return workspace_dir(repo)


def truncate_lance_data(repo: Path) -> Path:
    for f in lance_files(repo, "data"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return workspace_dir(repo)


def delete_manifests(repo: Path) -> Path:
    for f in lance_files(repo, "_versions"):
        f.unlink()
    return workspace_dir(repo)


def garble_manifests(repo: Path) -> Path:
    for f in lance_files(repo, "_versions"):
        garble(f)
    return workspace_dir(repo)


def garble_tree(repo: Path) -> Path:
    path = workspace_dir(repo) / "tree.sqlite"
    path.write_bytes(b"garbage!" * 4096)
    _drop_wal(path)
    return workspace_dir(repo)


def garble_registry(repo: Path) -> Path:
    path = store_path(repo) / "registry.sqlite"
    path.write_bytes(b"garbage!" * 4096)
    _drop_wal(path)
    return path


def _stamp_newer(path: Path) -> Path:
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")  # as a newer codeveil would leave it
    db.commit()
    db.close()
    return path


def newer_state(repo: Path) -> Path:
    return _stamp_newer(repo / ".codeveil/state.sqlite")


def newer_cache(repo: Path) -> Path:
    return _stamp_newer(Path(os.environ["CODEVEIL_CACHE_DIR"]) / "embeddings.sqlite")


DAMAGES: list[Callable[[Path], Path]] = [
    damage_state, delete_state, garble_cache, empty_cache, lose_header_vectors,
    truncate_lexical, truncate_vectors, garble_vectors, delete_vector_base,
    lose_rows, drop_rows, garble_rows, orphan_rows,
    garble_tree, garble_registry, newer_state, newer_cache,
]
LANCE_DAMAGES: list[Callable[[Path], Path]] = [
    delete_lance_data, truncate_lance_data, delete_manifests, garble_manifests,
]
CASES = ([(MODE_SEALED, d) for d in DAMAGES]
         + [(MODE_SERVER_SEARCH, d) for d in LANCE_DAMAGES])


@pytest.mark.parametrize(("repo", "damage"), CASES, indirect=["repo"],
                         ids=[d.__name__ for _, d in CASES])
def test_doctor_names_the_damaged_file_and_repair_restores_search(
    repo: Path, damage: Callable[[Path], Path]
) -> None:
    before = results(repo)
    assert any(before)
    target = damage(repo)

    found = doctor(repo, embedder=HashingEmbedder())
    problems = [f for f in found.findings if f.problem is not None]
    assert [f.path for f in problems] == [str(target)], found.lines()
    # A cache lacking vectors is a note (a teammate's is so too); the rest is wrong.
    advisory = damage in (empty_cache, lose_header_vectors)
    assert found.healthy == advisory == problems[0].advisory

    fixed = doctor(repo, repair=True, embedder=HashingEmbedder())
    assert fixed.healthy, fixed.lines()
    again = doctor(repo, embedder=HashingEmbedder())
    assert not [f for f in again.findings if f.problem], again.lines()  # not even a note
    assert results(repo) == before
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.index(wait=True).files_changed == 0  # the repaired store agrees with the tree


@pytest.mark.parametrize(
    ("repo", "damage", "named"),
    [(MODE_SEALED, drop_rows, r"tree\.sqlite"),
     (MODE_SERVER_SEARCH, delete_lance_data, r"chunks\.lance"),
     (MODE_SERVER_SEARCH, delete_manifests, r"chunks\.lance")],
    indirect=["repo"], ids=["drop_rows", "delete_lance_data", "delete_manifests"],
)
def test_index_does_not_report_success_over_a_store_it_cannot_read(
    repo: Path, damage: Callable[[Path], Path], named: str
) -> None:
    damage(repo)
    with Index(repo, embedder=HashingEmbedder()) as idx, pytest.raises(
        StoreCorrupt, match=f"{named}.*codeveil doctor --repair"
    ):
        idx.index(wait=True)


def test_a_lost_state_is_refused_by_search_not_silently_used(repo: Path) -> None:
    delete_state(repo)
    with Index(repo, embedder=HashingEmbedder()) as idx, pytest.raises(
        Exception, match=r"state\.sqlite is missing or empty.*codeveil index"
    ):
        idx.search("retry failed uploads")


def test_doctor_command_prints_findings_and_exit_status(repo: Path) -> None:
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "retrieval", "doctor", *args],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=120)

    healthy = run()
    assert healthy.returncode == 0, healthy.stderr
    assert "ok        " in healthy.stdout and "PROBLEM" not in healthy.stdout
    garble_tree(repo)
    sick = run()
    assert sick.returncode == 1
    assert "PROBLEM" in sick.stdout and "tree.sqlite" in sick.stdout
    assert "codeveil doctor --repair" in sick.stderr and "Traceback" not in sick.stderr
    repaired = run("--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "repaired" in repaired.stdout
    assert list(store_path(repo).parent.glob("store.damaged-*"))  # kept, not deleted


def test_doctor_checks_a_server_data_dir(tmp_path: Path) -> None:
    from retrieval.faces.doctor import check_data_dir
    from sync.records import ChunkRecord, FileUpdate
    from sync.store.local_client import LocalClient

    data = tmp_path / "data"
    for name, mode in (("good", MODE_SERVER_SEARCH), ("bad", MODE_SERVER_SEARCH),
                       ("sealed", MODE_SEALED), ("sealed-bad", MODE_SEALED)):
        vector = np.ones(4, np.float32) if mode == MODE_SERVER_SEARCH else None
        with LocalClient.create_workspace(data, name, dim=4, model_id="m",
                                          key_check=b"k", mode=mode) as client:
            client.apply([FileUpdate(b"f" * 16, (b"r" * 16,), b"v" * 16,
                                     (ChunkRecord(b"c" * 16, vector, b"m"),))],
                         [])
    assert check_data_dir(data).healthy
    for f in (data / "workspaces" / "bad" / "chunks.lance" / "data").iterdir():
        f.unlink()
    db = sqlite3.connect(data / "workspaces" / "sealed-bad" / "tree.sqlite")
    db.execute("UPDATE rows SET fid = fid + 1")  # rows no file of the tree owns
    db.commit()
    db.close()
    report = check_data_dir(data)
    problems = {f.path: f.problem for f in report.findings if f.problem}
    assert list(problems) == [str(data / "workspaces" / n) for n in ("bad", "sealed-bad")]
    assert "chunks.lance" in problems[str(data / "workspaces" / "bad")]
    assert "tree.sqlite holds 1 rows of files the tree does not have" in problems[
        str(data / "workspaces" / "sealed-bad")]


def test_a_clean_index_with_repeated_chunks_gives_a_clean_doctor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks with the same path, symbol and text (repeated records of a JSON file, the
    # same definition under two branches) share one vector: the doctor counted each copy
    # as a missing one.
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    entry = "".join(f"    {{\"name\": \"item\", \"weight\": {i}, \"tags\": [\"a\", \"b\"]}},\n"
                    for i in range(40))
    root = write_repo(tmp_path / "repo", {
        "runs.json": "{\"runs\": [\n" + "".join(f"  [\n{entry}  ],\n" for _ in range(6))
                     + "  []\n]}\n",
        "other.py": "def other():\n    return 2\n",
    })
    with Index(root, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
    from indexer.local_chunks import LocalChunks, open_state_db
    from sync.checkout.config import state_path

    db = open_state_db(state_path(root))
    try:
        texts = [c.embed_text for _rowid, c in LocalChunks(db).iter_all()]
    finally:
        db.close()
    assert len(texts) > len(set(texts))  # the repo does hold repeated chunks
    report = doctor(root, embedder=HashingEmbedder())
    assert report.healthy, report.lines()
    assert not [f for f in report.findings if f.problem], report.lines()


def test_a_failed_approximate_build_is_noted_and_repair_lets_it_run_again(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from retrieval.indexes.local_vectors.approx_build import approx_path, building

    before = results(repo)  # saves the vector index; too small for an approximate one
    folder = repo / ".codeveil" / "vectors"
    with np.load(folder / "delta.npz") as z:
        base_id = z["base_id"].tobytes()
    assert not list(folder.glob("approx-*"))
    monkeypatch.setenv("CODEVEIL_APPROX_MIN_CHUNKS", "1")  # now it qualifies
    # Every attempt died (killed, say): the next search records the failure instead of
    # starting a fourth.
    (folder / f"approx-{base_id.hex()}.building").write_text(f"{2**22 + 7} 3\n")
    assert results(repo) == before
    noted = doctor(repo)
    assert noted.healthy  # search works, exactly: a note, not a failed check
    [finding] = [f for f in noted.findings if f.path.endswith(".failed")]
    assert finding.advisory and "died 3 times" in (finding.problem or "")
    assert any(line.startswith("note") and "search is exact" in line for line in noted.lines())
    repaired = doctor(repo, repair=True)
    assert repaired.healthy and not list(folder.glob("*.failed"))
    assert results(repo) == before  # this search starts the build again
    deadline = time.monotonic() + 120
    while building(folder, base_id) or not approx_path(folder, base_id).exists():
        assert time.monotonic() < deadline, "no build after the repair"
        time.sleep(0.1)
