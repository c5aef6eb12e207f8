"""Embedding on a CUDA device: chunks/s in fp32 and fp16 beside the CPU, and cosines.

    python bench/device_embed.py [--repo PATH] [--limit 2000]

Chunks of `--repo` (default: the installed `requests` package), embedded by the CPU's
ONNX int8 and fp32 and, where a CUDA device is found, by the device in fp32 and fp16;
chunks/s and the mean and lowest cosine of each to CPU fp32 (which decides whether a
backend may share fp32's model id). Without a device it says so and measures the CPU
only. Writes bench/results/device_embed.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import table, write_json
from indexer.chunker import chunk_file
from indexer.cuda_embedder import CudaOnnxEmbedder, cuda_unavailable_reason
from indexer.onnx_embedder import OnnxEmbedder


def chunk_texts(repo: Path, limit: int) -> list[str]:
    texts = []
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo).as_posix()
        texts += [c.embed_text for c in chunk_file(rel, path.read_text(errors="replace"))]
    return texts[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=2000)
    args = parser.parse_args()
    spec = importlib.util.find_spec("requests")
    repo = args.repo or Path(spec.origin).parent  # type: ignore[union-attr, arg-type]
    texts = chunk_texts(repo, args.limit)
    reason = cuda_unavailable_reason()
    models = {"cpu onnx int8": OnnxEmbedder("int8"), "cpu onnx fp32": OnnxEmbedder("fp32")}
    if reason is None:
        models["cuda fp32"] = CudaOnnxEmbedder("fp32")
        models["cuda fp16"] = CudaOnnxEmbedder("fp16")
    vectors: dict[str, np.ndarray] = {}
    rates: dict[str, float] = {}
    for name, model in models.items():
        model.embed(["warm up the model"] * 64)  # load time is not embedding time
        t0 = time.perf_counter()
        vectors[name] = model.embed(texts)
        rates[name] = len(texts) / (time.perf_counter() - t0)
    ref = vectors["cpu onnx fp32"]
    rows = []
    for name in models:
        cos = (vectors[name] * ref).sum(axis=1)
        rows.append([name, models[name].model_id.rsplit(":", 1)[1], rates[name],
                     float(cos.mean()), float(cos.min())])
    print(f"{len(texts)} chunks of {repo}; device: {reason or 'CUDA'}")
    print(table(["backend", "model id", "chunks/s", "mean cos to cpu fp32",
                 "min cos"], rows))
    path = write_json("device_embed", {
        "repo": str(repo), "chunks": len(texts), "device": reason or "cuda",
        "rows": [dict(zip(["backend", "model_id", "chunks_per_s", "mean_cos", "min_cos"],
                          r, strict=True)) for r in rows],
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
