"""The store's search index: exact below a threshold, IVF above it, kept in step with
applies, snapshotted to disk and reused, caught up or rebuilt when the snapshot is old.

Vectors are clustered unit vectors encrypted with the real `VectorCipher`, so the index
sees what it sees in production: a large secret scale and the DCPE perturbation. Small
thresholds (via `IndexPolicy`) keep every test to a few thousand rows."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sync.crypto.ciphers import VectorCipher
from sync.crypto.keys import WorkspaceKey
from sync.records import ChunkRecord, FileUpdate
from sync.store import SNAPSHOT, IndexPolicy, Store, StoreOptions, WorkspaceStore
from sync.store.embedded.vector_index import (
    RowTable,
    VectorIndex,
    chunk_id_array,
    pack,
    read_snapshot_info,
)
from sync.store.local_client import LocalClient
from tests.server_fixtures import ServerProcess
from tests.test_store import Killed, kill_at

DIM = 32
PER_FILE = 10
# Few probes, so that IVF answers are really approximate here.
POLICY = IndexPolicy(exact_max_rows=1000, probe_scale=2.0, min_probes=4)
CIPHER = VectorCipher(WorkspaceKey(bytes(range(32))), DIM)


def key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()[:16]


def clustered(n: int, seed: int, clusters: int = 40) -> np.ndarray:
    """Unit vectors around `clusters` centres, as embeddings of related code are."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, DIM))
    points = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, DIM))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


class Workspace:
    """A workspace of files of PER_FILE encrypted chunks, and what it should hold."""

    def __init__(self, data_dir: Path, policy: IndexPolicy = POLICY, **store_args: Any):
        self.data_dir = data_dir
        self.policy = policy
        self.store_args = store_args
        self.store = Store(data_dir, options=StoreOptions(index_policy=policy, **store_args))
        self.client = LocalClient.create_workspace(
            self.store, "ws", dim=DIM, model_id="m", key_check=b"check"
        )
        self.rows: dict[bytes, np.ndarray] = {}  # chunk id -> encrypted vector
        self.files: dict[str, list[bytes]] = {}
        self._matrix: tuple[list[bytes], np.ndarray] | None = None

    @property
    def ws(self) -> WorkspaceStore:
        return self.store.workspace("ws")

    def put(self, names: list[str], seed: int, batch: int = 100) -> None:
        plain = clustered(len(names) * PER_FILE, seed)
        for start in range(0, len(names), batch):
            updates = []
            for i, name in enumerate(names[start : start + batch], start):
                ids = [key(f"{name}#{j}@{seed}") for j in range(PER_FILE)]
                vectors = CIPHER.encrypt(plain[i * PER_FILE : (i + 1) * PER_FILE], ids)
                for old in self.files.pop(name, []):
                    del self.rows[old]
                self.files[name] = ids
                self.rows.update(zip(ids, vectors, strict=True))
                updates.append(FileUpdate(
                    key(name), (key(""),), key(f"v:{name}@{seed}"),
                    tuple(ChunkRecord(c, v, b"meta:" + c) for c, v in zip(ids, vectors,
                                                                           strict=True)),
                ))
            self.client.apply(updates, [])

    def delete(self, names: list[str]) -> None:
        for name in names:
            for old in self.files.pop(name):
                del self.rows[old]
        self.client.apply([], [key(n) for n in names])

    def reopen(self, **store_args: Any) -> None:
        self.store.close()
        args = {**self.store_args, **store_args}
        self.store = Store(self.data_dir,
                           options=StoreOptions(index_policy=self.policy, **args))
        self.client = LocalClient(self.store, "ws")

    def exact(self, query: np.ndarray, k: int) -> list[bytes]:
        ids = list(self.rows)
        if self._matrix is None or len(self._matrix[0]) != len(ids) or self._matrix[0] != ids:
            self._matrix = (ids, np.stack([self.rows[c] for c in ids]))
        order = np.argsort(((self._matrix[1] - query) ** 2).sum(axis=1), kind="stable")[:k]
        return [ids[i] for i in order]

    def queries(self, n: int, seed: int) -> np.ndarray:
        # Encrypted like stored rows (noise fixed by an id) rather than with a query's
        # fresh noise, so that a recall threshold is checked on the same queries each run.
        ids = [f"query {seed} {i}".encode() for i in range(n)]
        return CIPHER.encrypt(clustered(n, seed), ids)

    def recall(self, k: int = 10, n: int = 40, seed: int = 99) -> float:
        found = 0
        for q in self.queries(n, seed):
            hits = {h.chunk_id for h in self.client.search(q, k)}
            found += len(hits & set(self.exact(q, k)))
        return found / (n * k)

    def kind(self) -> str:
        self.client.search(np.zeros(DIM, np.float32), 1)
        return self.client.info().extra["index"]["kind"]


def names(first: int, count: int) -> list[str]:
    return [f"src/f{i:05d}.py" for i in range(first, first + count)]


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    w = Workspace(tmp_path / "store")
    yield w
    w.store.close()


# -- index kind and quality ---------------------------------------------------------------


def test_kind_follows_the_row_count(workspace: Workspace) -> None:
    workspace.put(names(0, 90), seed=1)  # 900 rows
    assert workspace.kind() == "exact"
    workspace.put(names(90, 20), seed=2)  # 1100
    assert workspace.kind() == "ivf"
    assert workspace.ws.index_events["rebuilt"] == 1
    info = workspace.client.info().extra["index"]
    assert info["trained_rows"] == 1100 and info["nlist"] == POLICY.nlist(1100)
    # Hysteresis: back to exact only well below the threshold.
    workspace.delete(names(0, 40))  # 700
    assert workspace.kind() == "ivf"
    workspace.delete(names(40, 30))  # 400
    assert workspace.kind() == "exact"
    assert workspace.recall() == 1.0


def test_ivf_recall_against_exact(workspace: Workspace) -> None:
    workspace.put(names(0, 400), seed=3, batch=400)  # 4000 rows, one apply
    assert workspace.kind() == "ivf"
    assert workspace.recall(k=10) >= 0.95


def test_ivf_is_retrained_as_the_workspace_grows(workspace: Workspace) -> None:
    workspace.put(names(0, 110), seed=1, batch=110)
    assert workspace.client.info().extra["index"]["trained_rows"] == 1100
    workspace.put(names(110, 300), seed=2, batch=300)  # 4100 rows: under 4x, no retrain
    assert workspace.client.info().extra["index"]["trained_rows"] == 1100
    workspace.put(names(410, 40), seed=3)  # 4500 >= 4 x 1100
    index = workspace.client.info().extra["index"]
    assert index["trained_rows"] == 4500 and index["nlist"] == POLICY.nlist(4500)
    assert workspace.ws.index_events["rebuilt"] == 2
    assert workspace.recall() >= 0.95


def test_ivf_reflects_removes_and_adds(workspace: Workspace) -> None:
    workspace.put(names(0, 200), seed=4, batch=200)
    assert workspace.kind() == "ivf"
    gone = {c for n in names(0, 50) for c in workspace.files[n]}
    gone_vectors = [workspace.rows[c] for c in gone]
    workspace.delete(names(0, 50))
    workspace.put(names(60, 30), seed=5)  # replaced files: their old chunks go too
    for q in gone_vectors[:50]:
        hits = workspace.client.search(q, 50)
        assert not {h.chunk_id for h in hits} & gone
    replaced = {c for n in names(60, 30) for c in workspace.files[n]}
    for c in list(replaced)[:30]:  # every new row is found, at distance ~0 (its own noise)
        assert workspace.client.search(workspace.rows[c], 1)[0].chunk_id == c
    assert workspace.client.info().chunks == len(workspace.rows) == 1500
    # Never a deleted row, whatever k: the largest k returns exactly the live rows.
    everything = workspace.client.search(np.zeros(DIM, np.float32), 1000)
    assert len(everything) == 1000 and {h.chunk_id for h in everything} <= set(workspace.rows)
    assert workspace.recall() >= 0.95


# -- snapshots ------------------------------------------------------------------------------


def test_reopen_uses_the_snapshot(workspace: Workspace) -> None:
    workspace.put(names(0, 150), seed=6, batch=150)
    queries = workspace.queries(10, seed=7)
    before = [workspace.client.search(q, 20) for q in queries]
    generation = workspace.ws.files.generation()
    workspace.reopen()
    assert read_snapshot_info(workspace.ws.path / SNAPSHOT)["generation"] == generation
    after = [workspace.client.search(q, 20) for q in queries]
    assert after == before
    events = workspace.ws.index_events
    assert events["loaded"] == 1 and not events["built"] and not events["caught_up"]
    assert workspace.client.info().extra["index"]["kind"] == "ivf"
    # The loaded index is kept in step as before.
    workspace.delete(names(0, 10))
    workspace.put(names(200, 10), seed=8)
    assert workspace.client.info().chunks == len(workspace.rows)
    assert workspace.recall() >= 0.95


def test_stale_snapshot_is_caught_up_not_rebuilt(workspace: Workspace, tmp_path: Path) -> None:
    workspace.put(names(0, 150), seed=9, batch=150)
    workspace.reopen()  # snapshot of this state
    snapshot = workspace.ws.path / SNAPSHOT
    old = tmp_path / "old.index"
    shutil.copy(snapshot, old)
    workspace.delete(names(0, 20))
    workspace.put(names(300, 25), seed=10)
    workspace.store.close()
    shutil.copy(old, snapshot)  # as if the last saves never happened

    workspace.reopen()
    for q in workspace.queries(10, seed=11):
        hits = [h.chunk_id for h in workspace.client.search(q, 10)]
        assert set(hits) <= set(workspace.rows)
    events = workspace.ws.index_events
    assert (events["loaded"], events["caught_up"], events["built"]) == (1, 1, 0)
    assert workspace.client.info().chunks == len(workspace.rows) == 1550
    assert workspace.recall() >= 0.95


def test_snapshot_that_does_not_fit_is_rebuilt(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    workspace.put(names(0, 120), seed=12, batch=120)
    workspace.store.close()
    path = workspace.data_dir / "workspaces" / "ws" / SNAPSHOT
    path.write_bytes(path.read_bytes()[:-100])  # damaged

    with caplog.at_level(logging.WARNING, logger="sync.store"):
        workspace.reopen()
        assert workspace.recall() >= 0.95
    assert "ignoring the index snapshot" in caplog.text
    events = workspace.ws.index_events
    assert (events["loaded"], events["built"]) == (0, 1)


def test_crash_after_step_two_is_caught_up(tmp_path: Path) -> None:
    """A writer that dies after step 2 leaves LanceDB ahead of the snapshot's generation:
    the next open catches up and finds the rows it added."""
    w = Workspace(tmp_path / "store")
    w.put(names(0, 120), seed=13, batch=120)
    w.store.close()
    dying = StoreOptions(index_policy=POLICY, index_save_interval=1e9,
                         crash_hook=kill_at("rows"))
    store = Store(w.data_dir, options=dying)
    plain = clustered(PER_FILE, 14)
    ids = [key(f"crash#{j}") for j in range(PER_FILE)]
    vectors = CIPHER.encrypt(plain, ids)
    update = FileUpdate(key("crash.py"), (key(""),), key("v"),
                        tuple(ChunkRecord(c, v, b"m") for c, v in zip(ids, vectors, strict=True)))
    with pytest.raises(Killed):
        LocalClient(store, "ws").apply([update], [])
    # Died after step 2: nothing more is written, not even the snapshot a close saves
    # (the dead store is left unclosed; its writer lock went with the apply).
    dead = store

    store = Store(w.data_dir, options=StoreOptions(index_policy=POLICY))
    client = LocalClient(store, "ws")
    assert client.search(vectors[0], 1)[0].chunk_id == ids[0]
    assert store.workspace("ws").index_events["caught_up"] == 1
    store.close()
    assert dead.workspace("ws").root() is not None  # kept open until here


def test_another_process_change_is_caught_up(tmp_path: Path) -> None:
    w = Workspace(tmp_path / "store")
    w.put(names(0, 150), seed=15, batch=150)
    assert w.kind() == "ivf"
    other = Store(w.data_dir, options=StoreOptions(index_policy=POLICY))  # the CLI, by the daemon
    other_client = LocalClient(other, "ws")
    assert other_client.search(np.zeros(DIM, np.float32), 5)
    assert other.workspace("ws").index_events["loaded"] + other.workspace(
        "ws").index_events["built"] == 1
    w.delete(names(0, 10))
    w.put(names(500, 10), seed=16)
    assert other_client.info().chunks == len(w.rows)  # counted without the index
    for c in w.files[names(500, 1)[0]][:5]:
        assert other_client.search(w.rows[c], 1)[0].chunk_id == c
    events = other.workspace("ws").index_events
    assert events["caught_up"] >= 1 and events["built"] <= 1
    other.close()
    w.store.close()


def test_snapshot_survives_a_server_restart(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    from sync.transport.http_client import HttpClient

    server = server_factory(tmp_path / "data")
    token = HttpClient.create_workspace(server.url, "ws", dim=DIM, model_id="m",
                                        key_check=b"check")
    client = HttpClient(server.url, "ws", token)
    vectors = CIPHER.encrypt(clustered(60, 17), [key(f"c{i}") for i in range(60)])
    for name, part in (("a.py", slice(0, 30)), ("b.py", slice(30, 60))):
        client.apply([FileUpdate(key(name), (key(""),), key("v"), tuple(
            ChunkRecord(key(f"c{i}"), vectors[i], b"m") for i in range(60)[part]))], [])
    before = client.search(vectors[3], 5)
    snapshot = tmp_path / "data" / "workspaces" / "ws" / SNAPSHOT
    assert read_snapshot_info(snapshot)["generation"] == 2  # the first apply's; then idle
    server.stop()  # SIGTERM: the store closes and saves what changed since
    assert read_snapshot_info(snapshot)["generation"] == 4
    server.start()
    assert client.search(vectors[3], 5) == before
    log_text = server.log_text()
    assert "search index (exact, 60 rows, generation 4) loaded" in log_text
    assert log_text.count("built from") == 1  # the first start only
    client.close()


# -- the row table ----------------------------------------------------------------------------


def test_row_table() -> None:
    table = RowTable()

    def add(first: int, fid: int, n: int) -> None:
        rids = np.arange(first, first + n)
        ids = [bytes([r % 256]) * 16 for r in rids]
        table.append(rids, np.full(n, fid), chunk_id_array(ids), *pack([b"m%d" % r for r in rids]))

    add(1, 7, 3)
    add(4, 8, 2)
    add(6, 7, 1)  # a fid collision: two runs for one fid
    assert len(table) == 6 and table.has_file(7)
    assert table.lookup([5, 1]) == [(bytes([5]) * 16, b"m5"), (bytes([1]) * 16, b"m1")]
    assert table.remove_files([7, 99]).tolist() == [1, 2, 3, 6]
    assert table.rids().tolist() == [4, 5] and not table.has_file(7)
    with pytest.raises(KeyError):
        table.lookup([1])
    for i in range(10):  # enough removals to compact
        add(100 + 1000 * i, 100 + i, 1000)
        table.remove_files([100 + i])
    assert len(table) == 2 and table._n < 4096
    add(50_000, 9, 2)
    table.remove_rids(np.array([4]))
    again = RowTable.from_columns(**table.columns())
    assert again.rids().tolist() == [5, 50_000, 50_001]
    assert again.lookup([50_001]) == [(bytes([50_001 % 256]) * 16, b"m50001")]
    assert again.remove_files([9]).tolist() == [50_000, 50_001]


def test_vector_index_batches_cover_every_row() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, DIM)).astype(np.float32)
    rids = np.arange(10, 3010)
    policy = IndexPolicy(exact_max_rows=2000)

    def source() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield rids, vectors

    index = VectorIndex.build(DIM, 3000, source, policy)
    assert index.kind == "ivf" and index.ntotal == 3000
    seen = np.concatenate([r for r, _ in index.batches()])
    assert sorted(seen.tolist()) == rids.tolist()
    exact = index.rebuilt(1500)  # below half the threshold: exact again
    assert exact.kind == "exact" and exact.ntotal == 3000
    _dist, found = exact.search(vectors[:3], 1)
    assert found[:, 0].tolist() == rids[:3].tolist()


def test_a_reopened_store_answers_from_its_snapshot_without_lancedb(tmp_path: Path) -> None:
    # Importing lancedb takes seconds; a CLI search of an unchanged workspace must not.
    w = Workspace(tmp_path / "data")
    w.put([f"f{i}" for i in range(30)], seed=1)
    query = w.queries(1, seed=5)[0]
    expected = [h.chunk_id.hex() for h in w.client.search(query, 5)]
    w.store.close()
    script = f"""
import sys
import numpy as np
from sync.store.local_client import LocalClient
from sync.store import IndexPolicy, Store, StoreOptions
options = StoreOptions(index_policy=IndexPolicy(exact_max_rows=1000))
store = Store({str(tmp_path / "data")!r}, options=options)
client = LocalClient(store, "ws")
info = client.info()
query = np.array({query.tolist()!r}, dtype=np.float32)
print(info.chunks, [h.chunk_id.hex() for h in client.search(query, 5)] == {expected!r},
      "lancedb" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, check=True)
    assert out.stdout.split() == [str(30 * PER_FILE), "True", "False"], out.stderr
