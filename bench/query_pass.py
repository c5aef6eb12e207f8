"""A query's pass through the model: int8 and fp32 graphs, by graph optimisation level.

    python bench/query_pass.py [--rounds 30] [--out query_pass]

One process, the default embedder's one-thread session as a search uses it for a query
(`OnnxEmbedder.embed_batch` of one short text: tokenise, run, pool, normalise), with
the graph of each precision loaded at each optimisation level onnxruntime has. The
configurations take turns query by query, so the machine's load falls on each alike;
every query is a text of its own. Per configuration: the session's load seconds, the
median wall and CPU milliseconds of a query (CPU: this thread's, where a one-thread
session runs), and how far its vectors are from those of the session a search uses now
(int8, `ORT_ENABLE_EXTENDED`): the largest absolute difference of a component and the
smallest cosine. Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import table, write_json
from bench.search_before_after import QUERIES
from bench.search_latency import QUESTIONS
from indexer.onnx_embedder import OnnxEmbedder, Precision, load_graph

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
#: What a search's query goes through today: the reference the vectors are compared to.
CURRENT = "int8 ORT_ENABLE_EXTENDED"


def _embedder(precision: Precision, level: str) -> tuple[OnnxEmbedder, float]:
    """An embedder whose one-thread session runs at `level`; its load seconds."""
    import onnxruntime as ort

    model = OnnxEmbedder(precision, threads=2)  # >1: one text goes to the one-thread session
    data = load_graph(precision)
    options = ort.SessionOptions()
    # As `OnnxEmbedder._load` makes its latency session, but for the level.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    start = time.perf_counter()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - start
    model._latency_session = session
    model._input_names = [i.name for i in session.get_inputs()]
    return model, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default="query_pass")
    args = ap.parse_args()
    configs: dict[str, OnnxEmbedder] = {}
    load_s: dict[str, float] = {}
    for precision in ("int8", "fp32"):
        for level in LEVELS:
            name = f"{precision} {level}"
            configs[name], load_s[name] = _embedder(precision, level)
    texts = [*QUERIES, *QUESTIONS]
    for model in configs.values():  # warm: first runs allocate
        for t in texts[:4]:
            model.embed_batch([t])
    wall: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    vectors: dict[str, list[np.ndarray]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for t in texts:
            query = t + " " * (r % 4) + ("?" * (r // 4))  # a text of its own each time
            for c, model in configs.items():
                w, p = time.perf_counter(), time.thread_time()
                v = model.embed_batch([query])
                cpu[c].append((time.thread_time() - p) * 1000)
                wall[c].append((time.perf_counter() - w) * 1000)
                if r == 0:
                    vectors[c].append(v[0])
    ref = np.stack(vectors[CURRENT])
    rows = {}
    for c in configs:
        got = np.stack(vectors[c])
        rows[c] = {"load_s": round(load_s[c], 3),
                   "wall_p50_ms": round(statistics.median(wall[c]), 3),
                   "cpu_p50_ms": round(statistics.median(cpu[c]), 3),
                   "max_abs_diff": float(np.abs(got - ref).max()),
                   "min_cosine": float((got * ref).sum(axis=1).min())}
    print(table(["graph, level", "load s", "wall p50 ms", "CPU p50 ms", "max |diff|",
                 "min cosine"],
                [[c, r["load_s"], r["wall_p50_ms"], r["cpu_p50_ms"], f"{r['max_abs_diff']:.2g}",
                  f"{r['min_cosine']:.6f}"] for c, r in rows.items()]))
    write_json(args.out, {"reference": CURRENT, "texts": len(texts), "rounds": args.rounds,
                          "rows": rows, "wall_ms": wall, "cpu_ms": cpu})


if __name__ == "__main__":
    main()
