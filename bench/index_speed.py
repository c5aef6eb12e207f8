"""Indexing speed: codeveil's cold index against the raw model on the same chunks.

    python bench/index_speed.py [--repo PATH] [--files 10000] [--rounds 2]

1. Cold index of a real source tree (default: the installed `httpx` package) with the
   default embedder, end to end (walk, chunk, embed, encrypt, store); then, on exactly
   the same chunk texts, each backend's raw encode: torch fp32 through
   sentence-transformers' own `encode` (the reference: what a plain integration gets),
   ONNX fp32 and ONNX int8 through `embed_batch` in length-sorted batches of 64. The
   backends' encodes alternate over `--rounds` slices of the texts so that a noisy
   machine slows them alike. Chunks/s and ratios to the torch fp32 encode (targets:
   codeveil >= 0.9x the raw encode of its own backend; end to end >= 3x torch fp32).
2. Warm re-index with nothing changed, and after one edited file.
3. A synthetic repo of `--files` small files: warm re-index with nothing changed
   (target: 10,000 files under 1 s).
Prints a table and writes bench/results/index_speed.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Timer, copy_tree, isolate, table, write_json
from indexer.embedder import HashingEmbedder
from indexer.embedder_registry import EMBEDDERS, default_embedder
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from sync.checkout.config import state_path


def default_repo() -> Path:
    spec = importlib.util.find_spec("httpx")
    assert spec and spec.origin
    return Path(spec.origin).parent


def raw_encodes(texts: list[str], rounds: int) -> dict[str, dict[str, object]]:
    """Each backend's plain encode of `texts`, the backends taking turns slice by slice
    (the order rotating), so that load on a shared machine falls on all of them."""
    models = {}
    for name in ("minilm-torch", "minilm-onnx", "minilm-onnx-int8"):
        m = EMBEDDERS[name]()
        m.embed(["warm up the model"])
        models[name] = m
    seconds = dict.fromkeys(models, 0.0)
    per = -(-len(texts) // rounds)
    for r in range(rounds):
        part = texts[r * per : (r + 1) * per]
        names = list(models)
        for name in names[r % len(names):] + names[: r % len(names)]:
            m = models[name]
            with Timer() as t:
                if name == "minilm-torch":
                    m._load().encode(part, batch_size=64, normalize_embeddings=True)
                else:
                    ordered = sorted(part, key=len)
                    for start in range(0, len(ordered), 64):
                        m.embed_batch(ordered[start : start + 64])
            seconds[name] += t.seconds
    return {name: {"model_id": models[name].model_id, "seconds": seconds[name],
                   "chunks_per_s": len(texts) / seconds[name]} for name in models}


def make_synthetic(root: Path, files: int) -> None:
    for i in range(files):
        d = root / f"pkg{i % 50:02d}" / f"mod{(i // 50) % 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:06d}.py").write_text(
            f"def function_{i}(x):\n    '''Synthetic function {i}.'''\n    return x * {i}\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = isolate()
    src = args.repo or default_repo()
    repo = copy_tree(src, work / "repo")

    model = default_embedder()
    model.embed(["warm up the model"])  # load time is not indexing time

    idx = Index(repo, embedder=model)
    with Timer() as cold:
        report = idx.index(wait=True)
    db = open_state_db(state_path(repo))
    texts = [c.embed_text for _, c in LocalChunks(db).iter_all()]
    db.close()
    raw = raw_encodes(texts, args.rounds)

    with Timer() as warm:
        warm_report = idx.index(wait=True)
    victim = sorted(repo.rglob("*.py"))[len(texts) % 7]
    victim.write_text(victim.read_text() + "\n\ndef added_for_bench():\n    return 42\n")
    with Timer() as one:
        one_report = idx.index(wait=True)
    idx.close()

    syn = work / "synthetic"
    make_synthetic(syn, args.files)
    syn_idx = Index(syn, embedder=HashingEmbedder())
    with Timer() as syn_cold:
        syn_idx.index(wait=True)
    with Timer() as syn_warm:
        syn_report = syn_idx.index(wait=True)
    syn_idx.close()

    cold_rate = report.chunks_embedded / cold.seconds
    torch_rate = raw["minilm-torch"]["chunks_per_s"]
    own = model.model_id.rsplit(":", 1)[-1]
    own_rate = next((r["chunks_per_s"] for r in raw.values() if r["model_id"] == model.model_id),
                    torch_rate)
    rows = [
        [f"cold index, codeveil end to end ({own})", report.chunks_embedded, cold.seconds,
         cold_rate, cold_rate / torch_rate],
        *[[f"raw encode {name}, same chunks", len(texts), r["seconds"], r["chunks_per_s"],
           r["chunks_per_s"] / torch_rate] for name, r in raw.items()],
        [f"ratio codeveil / raw {own}", "", "", "", cold_rate / own_rate],
        ["warm re-index, nothing changed", warm_report.files_scanned, warm.seconds, "", ""],
        ["re-index, one file edited", one_report.chunks_embedded, one.seconds, "", ""],
        [f"synthetic {args.files} files: cold (hashing embedder)", args.files,
         syn_cold.seconds, "", ""],
        [f"synthetic {args.files} files: warm, nothing changed", syn_report.files_scanned,
         syn_warm.seconds, "", ""],
    ]
    print(f"repo: {src} ({report.files_scanned} files, {report.chunks_total} chunks)")
    print(table(["measure", "chunks/files", "seconds", "chunks/s", "x torch fp32"], rows))
    path = write_json("index_speed", {
        "repo": str(src),
        "files": report.files_scanned,
        "chunks": report.chunks_total,
        "model": model.model_id,
        "cold": {"seconds": cold.seconds, "chunks_per_s": cold_rate, "report": report.to_dict()},
        "raw_encode": raw,
        "ratio_to_own_backend": cold_rate / own_rate,
        "ratio_to_torch_fp32": cold_rate / torch_rate,
        "warm_nothing_changed_s": warm.seconds,
        "one_file_edited": {"seconds": one.seconds, "report": one_report.to_dict()},
        "synthetic": {"files": args.files, "cold_s": syn_cold.seconds,
                      "warm_s": syn_warm.seconds},
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
