"""Embedding on a real local Ray cluster (`ray.init(num_cpus=2)` on 127.0.0.1): vectors
equal the local model's, an actor killed mid-index costs a retry and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from indexer.embedder import HashingEmbedder
from indexer.errors import EmbedderError
from indexer.ray_embedder import RayEmbedder, parse_embed_on
from retrieval.faces.api import Index
from sync.syncer.progress import Progress

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'codeveil[ray]')")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One local cluster for the module; its workers get the test run's cache dir (so
    no test touches the real home) and this checkout on their path."""
    from tests.conftest import _shared_cache

    env = {
        "CODEVEIL_CACHE_DIR": str(_shared_cache(tmp_path_factory)),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                      if p),
    }
    ray.init(num_cpus=2, address="local", include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_parse_embed_on() -> None:
    assert parse_embed_on("ray://10.0.0.5:10001") == ("ray://10.0.0.5:10001", None)
    assert parse_embed_on("ray://h:1?actors=4") == ("ray://h:1", 4)
    assert parse_embed_on("ray:local") == ("local", None)
    for bad in ("http://h:1", "ray:/h", "ray://h:1?actors=0", "ray://h:1?cpus=2"):
        with pytest.raises(EmbedderError):
            parse_embed_on(bad)


def test_pool_matches_local_model_and_retries_a_dead_actor(ray_cluster) -> None:
    texts = [f"def handler_{i}(request):\n    return respond({i})" for i in range(40)]
    want = HashingEmbedder().embed(texts)
    pool = RayEmbedder(model="hashing", actors=2, batch_size=4)
    try:
        assert pool.model_id == HashingEmbedder().model_id
        np.testing.assert_allclose(pool.embed(texts), want, atol=1e-6)
        assert pool.batches_done == 10 and pool.retries == 0
        pids = set(ray.get([a.pid.remote() for a in pool.actors()]))
        assert len(pids) == 2 and os.getpid() not in pids  # two worker processes

        ray.kill(pool.actors()[0])
        np.testing.assert_allclose(pool.embed(texts), want, atol=1e-6)
        assert pool.retries >= 1  # the dead actor's batches went again
        assert pool.batches_done == 20  # ... and each came back once
        assert ray.get(pool.actors()[0].pid.remote()) not in pids  # a fresh actor
    finally:
        pool.close()


class _KillAfterFirstBatch(Progress):
    def __init__(self, pool: RayEmbedder) -> None:
        self.pool = pool
        self.killed: int | None = None

    def chunks_done(self, embedded: int, cached: int) -> None:
        if embedded and self.killed is None:
            actor = self.pool.actors()[0]
            self.killed = ray.get(actor.pid.remote())
            ray.kill(actor)


def test_index_survives_an_actor_dying_mid_index(ray_cluster, sample_repo: Path,
                                                 real_embedder, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The real model in the actors; a cache of its own so that every chunk is embedded.
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    pool = RayEmbedder(model="minilm-torch", actors=2, batch_size=2)
    progress = _KillAfterFirstBatch(pool)
    with Index(sample_repo, embedder=pool) as idx:
        report = idx.index(wait=True, progress=progress)
        status = idx.status()
        hits = idx.search("hash a password with a salt", k=3)
    pool.close()
    assert progress.killed is not None and pool.retries >= 1
    # Nothing lost, nothing twice: the store holds exactly the client's chunks.
    assert report.chunks_embedded > 4
    assert status["server_chunks"] == status["chunks"] == report.chunks_total
    assert hits[0].path == "auth/password.py"
    # The vectors the cluster made are the local model's.
    from indexer.embed_cache import EmbeddingCache, cache_key
    from indexer.local_chunks import LocalChunks, open_state_db
    from sync.checkout.config import state_path

    db = open_state_db(state_path(sample_repo))
    texts = sorted({c.embed_text for _, c in LocalChunks(db).iter_all()})
    db.close()
    cache = EmbeddingCache()
    got = cache.get_many([cache_key(real_embedder.model_id, t) for t in texts], 384)
    cache.close()
    assert len(got) == len(texts)
    local = real_embedder.embed(texts)
    cos = [float(got[cache_key(real_embedder.model_id, t)] @ local[i])
           for i, t in enumerate(texts)]
    assert min(cos) > 0.999


def test_cli_embed_on_a_cluster_it_starts(sample_repo: Path, tmp_path: Path) -> None:
    # `ray:local` makes the command start (and stop) a cluster of its own.
    # A cache of its own, so the chunks are embedded (on the cluster) and not looked up.
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing", PYTHONPATH=str(ROOT),
               CODEVEIL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "retrieval", "index", "--wait", ".", "--json",
         "--embed-on", "ray:local?actors=1"],
        cwd=sample_repo, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["files_changed"] == 5 and summary["chunks_embedded"] > 0
    assert summary["embedded_on"] == "local"
    bad = subprocess.run(
        [sys.executable, "-m", "retrieval", "index", "--wait", ".", "--embed-on", "tcp://x:1"],
        cwd=sample_repo, env=env, capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 1 and "ray://HOST:PORT" in bad.stderr
