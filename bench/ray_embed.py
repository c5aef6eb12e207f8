"""Embedding on a Ray actor pool against the local embedder, on this machine.

    python bench/ray_embed.py [--repo PATH] [--limit 400]

One run: the same chunk texts embedded by the local default embedder, then by a pool of
1 and of 2 actors on a local Ray cluster (`ray.init(num_cpus=2)` on 127.0.0.1), each
warmed first; chunks/s. The overhead per batch is the round trip of a batch of 64 texts
to an actor running the trivial hashing embedder, minus the same batch embedded by
it locally. Writes bench/results/ray_embed.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import isolate, table, write_json
from bench.device_embed import chunk_texts
from indexer.embedder import HashingEmbedder
from indexer.embedder_registry import DEFAULT_MINILM, EMBEDDERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=400)
    args = parser.parse_args()
    import importlib.util

    import ray

    from indexer.ray_embedder import RayEmbedder

    cache = os.environ.get("CODEVEIL_CACHE_DIR") or str(isolate() / "cache")
    os.environ["CODEVEIL_CACHE_DIR"] = cache
    spec = importlib.util.find_spec("requests")
    repo = args.repo or Path(spec.origin).parent  # type: ignore[union-attr, arg-type]
    texts = chunk_texts(repo, args.limit)
    local = EMBEDDERS[DEFAULT_MINILM]()
    local.embed(["warm up"] * 64)
    t0 = time.perf_counter()
    local.embed(texts)
    rates = {"local": len(texts) / (time.perf_counter() - t0)}

    root = str(Path(__file__).resolve().parent.parent)
    ray.init(num_cpus=2, address="local", include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"CODEVEIL_CACHE_DIR": cache, "PYTHONPATH": root}})
    try:
        for n in (1, 2):
            pool = RayEmbedder(actors=n, model=DEFAULT_MINILM)
            pool.embed(["warm up"] * 64 * n)
            t0 = time.perf_counter()
            pool.embed(texts)
            rates[f"ray, {n} actor{'s' * (n > 1)}"] = len(texts) / (time.perf_counter() - t0)
            pool.close()
        batch = texts[:64]
        hashing = HashingEmbedder()
        pool = RayEmbedder(actors=1, model="hashing")
        pool.embed(batch)
        trips, here = [], []
        for _ in range(20):
            t0 = time.perf_counter()
            pool.embed_batch(batch)
            trips.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hashing.embed_batch(batch)
            here.append(time.perf_counter() - t0)
        pool.close()
    finally:
        ray.shutdown()
    overhead_ms = (statistics.median(trips) - statistics.median(here)) * 1000
    rows = [[name, len(texts), rate, rate / rates["local"]] for name, rate in rates.items()]
    print(f"{len(texts)} chunks of {repo}, model {local.model_id}")
    print(table(["embedder", "chunks", "chunks/s", "x local"], rows))
    print(f"overhead per batch of 64 (Ray round trip): {overhead_ms:.1f} ms")
    path = write_json("ray_embed", {"repo": str(repo), "chunks": len(texts),
                                    "model": local.model_id, "chunks_per_s": rates,
                                    "overhead_per_batch_ms": overhead_ms})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
