"""Indexing speed: codeveil's cold index against the raw model on the same chunks.

    python bench/index_speed.py [--repo PATH] [--files 10000]

1. Cold index of a real source tree (default: the installed `rich` package) with the
   real model, then the raw model's `encode` on exactly the same chunk texts, in one run:
   chunks/s of both and their ratio (target >= 0.9).
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
from indexer.embedder import HashingEmbedder, SentenceTransformerEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from retrieval import Index
from sync.workspace import state_path


def default_repo() -> Path:
    spec = importlib.util.find_spec("rich")
    assert spec and spec.origin
    return Path(spec.origin).parent


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
    args = parser.parse_args()
    work = isolate()
    src = args.repo or default_repo()
    repo = copy_tree(src, work / "repo")

    model = SentenceTransformerEmbedder()
    model.embed(["warm up the model"])  # load time is not indexing time

    idx = Index(repo, embedder=model)
    with Timer() as cold:
        report = idx.index()
    db = open_state_db(state_path(repo))
    texts = [c.embed_text for _, c in LocalChunks(db).iter_all()]
    db.close()

    raw_model = SentenceTransformerEmbedder()
    raw_model.embed(["warm up the model"])
    with Timer() as raw:
        raw_model._load().encode(texts, batch_size=64, normalize_embeddings=True)

    with Timer() as warm:
        warm_report = idx.index()
    victim = sorted(repo.rglob("*.py"))[len(texts) % 7]
    victim.write_text(victim.read_text() + "\n\ndef added_for_bench():\n    return 42\n")
    with Timer() as one:
        one_report = idx.index()
    idx.close()

    syn = work / "synthetic"
    make_synthetic(syn, args.files)
    syn_idx = Index(syn, embedder=HashingEmbedder())
    with Timer() as syn_cold:
        syn_idx.index()
    with Timer() as syn_warm:
        syn_report = syn_idx.index()
    syn_idx.close()

    cold_rate = report.chunks_embedded / cold.seconds
    raw_rate = len(texts) / raw.seconds
    rows = [
        ["cold index (codeveil)", report.chunks_embedded, cold.seconds, cold_rate],
        ["raw model encode, same chunks", len(texts), raw.seconds, raw_rate],
        ["ratio codeveil / raw", "", "", cold_rate / raw_rate],
        ["warm re-index, nothing changed", warm_report.files_scanned, warm.seconds, ""],
        ["re-index, one file edited", one_report.chunks_embedded, one.seconds, ""],
        [f"synthetic {args.files} files: cold (hashing embedder)", args.files,
         syn_cold.seconds, ""],
        [f"synthetic {args.files} files: warm, nothing changed", syn_report.files_scanned,
         syn_warm.seconds, ""],
    ]
    print(f"repo: {src} ({report.files_scanned} files, {report.chunks_total} chunks)")
    print(table(["measure", "chunks/files", "seconds", "chunks/s"], rows))
    path = write_json("index_speed", {
        "repo": str(src),
        "files": report.files_scanned,
        "chunks": report.chunks_total,
        "cold": {"seconds": cold.seconds, "chunks_per_s": cold_rate, "report": report.to_dict()},
        "raw_encode": {"seconds": raw.seconds, "chunks_per_s": raw_rate},
        "ratio": cold_rate / raw_rate,
        "warm_nothing_changed_s": warm.seconds,
        "one_file_edited": {"seconds": one.seconds, "report": one_report.to_dict()},
        "synthetic": {"files": args.files, "cold_s": syn_cold.seconds,
                      "warm_s": syn_warm.seconds},
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
