"""Embedding backends side by side: torch fp32, ONNX fp32, ONNX int8 on the same chunks.

    python bench/embed_backends.py [--repo PATH] [--chunks 400] [--rounds 4] [--threads N]
                                   [--cosqa] [--cosqa-cache FILE] [--backends a,b,c]

1. Speed: real chunks (codeveil's chunker over a source tree, default the installed
   `rich` package), embedded by every backend through `Embedder.embed`. The chunks are
   cut into `--rounds` slices and each slice is run by every backend in turn, the order
   rotating, so a noisy machine slows all backends alike. Reports chunks/s (wall and per
   CPU second), the ratios to torch fp32, and the cosine of each backend's vectors to
   torch fp32's (mean, min).
2. With --cosqa: retrieval quality on CoSQA dev (500 queries against 6,267 functions,
   /work/shared/bench/cosqa): MRR and Recall@1/5/10 per backend. Vectors go through the
   embedding cache in --cosqa-cache, so an interrupted run resumes where it stopped.
   The recommended default is the fastest backend whose MRR is within one point of
   torch fp32's.

Prints tables and writes bench/results/embed_backends.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench._common import table, write_json
from indexer.chunker import chunk_file
from indexer.embed_cache import CachedEmbedder, EmbeddingCache
from indexer.embedder import Embedder, SentenceTransformerEmbedder
from indexer.onnx_embedder import OnnxEmbedder, models_dir

COSQA = Path("/work/shared/bench/cosqa")
REFERENCE = "torch-fp32"
MRR_TOLERANCE = 1.0  # points of MRR x 100 a faster backend may lose and still be default

BACKENDS: dict[str, Callable[[Path, int | None], Embedder]] = {
    "torch-fp32": lambda _models, threads: SentenceTransformerEmbedder(threads=threads),
    "onnx-fp32": lambda models, threads: OnnxEmbedder(
        "fp32", models_directory=models, threads=threads
    ),
    "onnx-int8": lambda models, threads: OnnxEmbedder(
        "int8", models_directory=models, threads=threads
    ),
}
# CODEVEIL_EMBEDDER name of each backend, for the recommendation.
SETTING = {
    "torch-fp32": "minilm-torch",
    "onnx-fp32": "minilm-onnx",
    "onnx-int8": "minilm-onnx-int8",
}


def default_repo() -> Path:
    spec = importlib.util.find_spec("rich")
    assert spec and spec.origin
    return Path(spec.origin).parent


def sample_chunks(repo: Path, count: int) -> list[str]:
    """`count` chunk texts of the Python files under `repo`, a fixed random sample."""
    texts: list[str] = []
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo).as_posix()
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.extend(c.embed_text for c in chunk_file(rel, source))
    random.Random(0).shuffle(texts)
    return texts[:count]


def measure_speed(
    backends: dict[str, Embedder], texts: list[str], rounds: int
) -> tuple[dict[str, float], dict[str, float], dict[str, np.ndarray]]:
    """Wall and CPU seconds per backend over all of `texts`, interleaved by rounds; and
    the vectors. CPU time is the steadier measure on a shared machine: other processes
    stretch wall time but not the cycles a backend itself spends."""
    seconds = dict.fromkeys(backends, 0.0)
    cpu = dict.fromkeys(backends, 0.0)
    vectors = {name: np.zeros((len(texts), 384), dtype=np.float32) for name in backends}
    names = list(backends)
    bounds = np.linspace(0, len(texts), rounds + 1).astype(int)
    for r in range(rounds):
        part = texts[bounds[r] : bounds[r + 1]]
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            vecs = backends[name].embed(part)
            seconds[name] += time.perf_counter() - start
            cpu[name] += time.process_time() - start_cpu
            vectors[name][bounds[r] : bounds[r + 1]] = vecs
    return seconds, cpu, vectors


def cosqa_quality(backends: dict[str, Embedder], cache_path: Path) -> dict[str, dict]:
    """MRR x 100 and Recall@k x 100 on CoSQA dev, per backend."""
    corpus = [json.loads(line) for line in (COSQA / "corpus.jsonl").open()]
    queries = [json.loads(line) for line in (COSQA / "dev.jsonl").open()]
    row_of = {doc["doc_id"]: i for i, doc in enumerate(corpus)}
    gold = np.array([row_of[q["gold_doc_id"]] for q in queries])
    cache = EmbeddingCache(cache_path)
    results = {}
    for name, model in backends.items():
        cached = CachedEmbedder(model, cache)
        start = time.perf_counter()
        done = [0]

        def progress(embedded: int, cached: int, name: str = name, done: list[int] = done) -> None:
            done[0] += embedded + cached
            logging.info("cosqa %s: %d/%d functions", name, done[0], len(corpus))

        docs = cached.embed([d["code"] for d in corpus], progress=progress).vectors
        qs = cached.embed([q["query"] for q in queries]).vectors
        scores = qs @ docs.T
        # Rank of the gold function: 1 + how many score strictly higher.
        ranks = 1 + (scores > scores[np.arange(len(gold)), gold][:, None]).sum(axis=1)
        results[name] = {
            "mrr": float(np.mean(1.0 / ranks) * 100),
            **{f"recall@{k}": float(np.mean(ranks <= k) * 100) for k in (1, 5, 10)},
            "seconds": time.perf_counter() - start,
        }
        logging.info("cosqa %s: MRR %.2f", name, results[name]["mrr"])
    cache.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--chunks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per backend (default: all cores)")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="where ONNX exports are cached (default: codeveil's cache)")
    parser.add_argument("--no-speed", action="store_true", help="only the CoSQA measure")
    parser.add_argument("--cosqa", action="store_true", help="also measure CoSQA MRR")
    parser.add_argument("--cosqa-cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "codeveil-bench-cosqa.sqlite")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # The quantiser logs every tensor on the root logger at INFO.
    logging.getLogger("root").setLevel(logging.INFO)

    names = [n for n in args.backends.split(",") if n]
    unknown = set(names) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; use {sorted(BACKENDS)}")
    models = args.models_dir or models_dir()
    backends = {name: BACKENDS[name](models, args.threads) for name in names}
    # First use loads the model (and exports the ONNX graph once): not indexing time.
    first_use = {}
    for name, model in backends.items():
        start = time.perf_counter()
        model.embed(["warm up the model"])
        first_use[name] = time.perf_counter() - start

    payload: dict = {"backends": {n: backends[n].model_id for n in names},
                     "first_use_s": first_use, "threads": args.threads or os.cpu_count(),
                     "load_average": os.getloadavg()}
    if not args.no_speed:
        repo = args.repo or default_repo()
        texts = sample_chunks(repo, args.chunks)
        seconds, cpu, vectors = measure_speed(backends, texts, args.rounds)
        ref = vectors.get(REFERENCE)
        rows, speed = [], {}
        for name in names:
            rate = len(texts) / seconds[name]
            entry: dict = {"seconds": seconds[name], "chunks_per_s": rate,
                           "cpu_seconds": cpu[name], "chunks_per_cpu_s": len(texts) / cpu[name]}
            if REFERENCE in seconds:
                entry["speedup"] = seconds[REFERENCE] / seconds[name]
                entry["cpu_speedup"] = cpu[REFERENCE] / cpu[name]
            if ref is not None:
                cos = (vectors[name] * ref).sum(axis=1)
                entry.update(cos_mean=float(cos.mean()), cos_min=float(cos.min()),
                             cos_p01=float(np.percentile(cos, 1)))
            speed[name] = entry
            rows.append([name, rate, entry.get("speedup", ""), entry["chunks_per_cpu_s"],
                         entry.get("cpu_speedup", ""), entry.get("cos_mean", ""),
                         entry.get("cos_min", "")])
        print(f"{len(texts)} chunks of {repo}, {args.rounds} interleaved rounds,"
              f" {args.threads or os.cpu_count()} threads, load average"
              f" {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(table(["backend", "chunks/s", "x torch", "chunks/cpu-s", "x torch (cpu)",
                     "cos mean", "cos min"],
                    [[r[0], r[1], f"{r[2]:.2f}", r[3], f"{r[4]:.2f}",
                      *(f"{v:.4f}" if isinstance(v, float) else v for v in r[5:])]
                     for r in rows]))
        payload.update(repo=str(repo), chunks=len(texts), rounds=args.rounds, speed=speed)

    if args.cosqa:
        quality = cosqa_quality(backends, args.cosqa_cache)
        print(table(["backend", "MRR", "R@1", "R@5", "R@10"],
                    [[n, q["mrr"], q["recall@1"], q["recall@5"], q["recall@10"]]
                     for n, q in quality.items()]))
        payload["cosqa"] = quality
        if REFERENCE in quality and "speed" in payload:
            floor = quality[REFERENCE]["mrr"] - MRR_TOLERANCE
            fit = [n for n in names if quality[n]["mrr"] >= floor]
            best = max(fit, key=lambda n: payload["speed"][n]["chunks_per_s"])
            payload["recommended_default"] = SETTING[best]
            print(f"default: {SETTING[best]} (fastest with CoSQA MRR >= {floor:.2f})")

    print(f"wrote {write_json('embed_backends', payload)}")


if __name__ == "__main__":
    main()
