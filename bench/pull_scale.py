"""A teammate joining a large sealed workspace: how much memory the pull takes, and how
soon a search answers, at growing sizes, on one `codeveil serve` on loopback.

    python bench/pull_scale.py [--sizes 30000,100000,300000] [--chunks-per-file 16]
                               [--keep DIR | --reuse DIR]

For each size, a generated tree (files of `--chunks-per-file` functions, one chunk each)
is indexed by a first machine (the hashing embedder stands in for the model: what is
measured is the pull, which does not depend on the vectors; the model would take hours
on 2 cores). A second machine (its own config, cache and checkout) joins with the
exported key and indexes its copy in a child process, which pulls every row. Measured:

    peak RSS     the joining process's high-water mark (VmHWM), and its RSS sampled
    first answer seconds from the join's start to the first search (another process,
    `codeveil search --json` in a loop) that answers with a hit; and to the first
    answer whose index has vectors (`chunks_with_vectors` > 0)
    pull         seconds and chunks pulled (none embedded: the workspace has them all)

The pull goes in batches (`PULL_FILES` files a request) in a random order: the server
must not read the files' categories off the order a teammate asks for them in (the
structure attack of bench/privacy.py), so there is no priority order here; a file is
searchable by words as soon as it is chunked, and by meaning once its batch lands.
At 1M chunks the first machine's index takes ~25 minutes here; `--keep DIR` leaves it
(the tree, its config and cache, the server's data) in DIR/<size>, and `--reuse DIR`
starts the server on that data and measures a fresh join against it, skipping the
generation and the first index (the result records `reused`).

Writes bench/results/pull_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import Server, isolate, proc_status_kb, table, write_json  # noqa: E402

JOIN = """
import json, sys, time
from pathlib import Path
from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.crypto.keys import import_key
root, url, ws, key_text, token = sys.argv[1:6]
import_key(ws, key_text)
t0 = time.perf_counter()
idx = Index(Path(root), embedder=HashingEmbedder())
idx.init(server=url, workspace_id=ws, token=token)
r = idx.index(wait=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "pulled": r.chunks_pulled,
                  "embedded": r.chunks_embedded, "files": r.files_changed}))
"""


def _module(i: int, per_file: int) -> str:
    return "\n\n".join(
        f"def op_{i}_{j}(value, scale={j + 1}):\n"
        f"    \"\"\"Step {j} of stage {i}: scale, shift and clamp the value.\"\"\"\n"
        f"    shifted = value * scale + {(i * 31 + j) % 997}\n"
        f"    return max(0, min(shifted, {1000 + j}))"
        for j in range(per_file)) + "\n"


def generate(root: Path, chunks: int, per_file: int) -> int:
    """Files of `per_file` distinct functions, about `chunks` chunks in all (the
    chunker may merge small functions: one file is chunked first to count); returns
    the number of files."""
    from indexer.chunker import chunk_file

    # Long numbers make longer functions, which the chunker merges less: sample widely.
    sample = [len(chunk_file(f"pkg0/sub0/mod_{i}.py", _module(i, per_file)))
              for i in range(1, 100_000, 4_999)]
    files = max(1, round(chunks * len(sample) / sum(sample)))
    for i in range(files):
        path = root / f"pkg{i % 50}" / f"sub{i % 7}" / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_module(i, per_file))
    return files


def _env(base: Path, name: str) -> dict[str, str]:
    return {**os.environ, "CODEVEIL_CONFIG_DIR": str(base / name / "config"),
            "CODEVEIL_CACHE_DIR": str(base / name / "cache"), "CODEVEIL_EMBEDDER": "hashing",
            "PYTHONPATH": str(ROOT)}


def run_size(base: Path, chunks: int, per_file: int, *, reuse: bool = False
             ) -> dict[str, object]:
    from indexer.embedder import HashingEmbedder
    from indexer.local_chunks import open_state_db
    from retrieval import Index
    from sync.checkout.config import load_config, load_token
    from sync.crypto.keys import export_key, load_key

    if not reuse:
        base.mkdir(parents=True)
    elif not (base / "data").is_dir() or not (base / "alice" / "repo").is_dir():
        raise SystemExit(f"nothing to reuse in {base}: run with --keep first")
    server = Server(base / "data")
    try:
        first = base / "alice" / "repo"
        os.environ.update({k: v for k, v in _env(base, "alice").items()
                           if k.startswith("CODEVEIL_")})
        first_s: float | None = None
        if reuse:  # the first machine's index as --keep left it
            # Counted from its state (its config names the old server's port).
            db = open_state_db(first / ".codeveil" / "state.sqlite")
            files = db.execute("SELECT count(*) FROM chunk_files").fetchone()[0]
            sent_chunks = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
            db.close()
        else:
            files = generate(first, chunks, per_file)
            t0 = time.perf_counter()
            with Index(first, embedder=HashingEmbedder()) as idx:
                idx.init(server=server.url)
                sent_chunks = idx.index(wait=True).chunks_embedded
            first_s = time.perf_counter() - t0
        ws = load_config(first).workspace_id
        key_text, token = export_key(load_key(ws)), load_token(ws)
        mate = base / "bob" / "repo"
        shutil.rmtree(base / "bob", ignore_errors=True)
        shutil.copytree(first, mate, ignore=shutil.ignore_patterns(".codeveil"))

        env = _env(base, "bob")
        join = subprocess.Popen([sys.executable, "-c", JOIN, str(mate), server.url, ws,
                                 key_text, token], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        samples: list[tuple[float, int]] = []  # (seconds since the join began, kB)
        answers: dict[str, float] = {}

        def search_loop() -> None:
            # A user (or an agent) asking as soon as the join began: every answer counts.
            while join.poll() is None and len(answers) < 2:
                proc = subprocess.run([sys.executable, "-m", "retrieval", "search",
                                       "scale shift and clamp", "--json", "-k", "3", "-C",
                                       str(mate)], env=env, capture_output=True, text=True,
                                      check=False)
                if proc.returncode != 0:
                    time.sleep(0.2)
                    continue
                out = json.loads(proc.stdout)
                now = time.monotonic() - started
                if out["hits"]:
                    answers.setdefault("any", now)
                    if out["index"]["chunks_with_vectors"] > 0:
                        answers.setdefault("vectors", now)

        searcher = threading.Thread(target=search_loop, daemon=True)
        searcher.start()
        hwm = 0
        while join.poll() is None:
            rss = proc_status_kb(join.pid, "VmRSS")
            hwm = max(hwm, proc_status_kb(join.pid, "VmHWM") or 0)
            if rss is not None:
                samples.append((time.monotonic() - started, rss))
            time.sleep(0.2)
        out, err = join.communicate()
        searcher.join(timeout=60)
        if join.returncode != 0:
            raise SystemExit(f"the join failed: {err.strip().splitlines()[-1:]}")
        result = json.loads(out.strip().splitlines()[-1])
        return {"chunks": sent_chunks, "files": files, "first_index_s": first_s,
                "reused": reuse,
                "join_s": result["seconds"], "pulled": result["pulled"],
                "embedded": result["embedded"], "peak_rss_mb": hwm / 1024,
                "median_rss_mb": (sorted(k for _, k in samples)[len(samples) // 2] / 1024
                                  if samples else None),
                # Where the memory goes over the join: RSS every ~2 s.
                "rss_timeline_mb": [(round(t, 1), round(k / 1024, 1))
                                    for t, k in samples[::10]],
                "first_answer_s": answers.get("any"),
                "first_answer_with_vectors_s": answers.get("vectors"),
                "server_rss_mb": server.rss_mb()}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="30000,100000,300000",
                        help="chunks per workspace, comma-separated")
    parser.add_argument("--chunks-per-file", type=int, default=16)
    kept = parser.add_mutually_exclusive_group()
    kept.add_argument("--keep", type=Path, metavar="DIR",
                      help="leave each size's first index and server data in DIR/<size>")
    kept.add_argument("--reuse", type=Path, metavar="DIR",
                      help="join the first index --keep left in DIR/<size>")
    args = parser.parse_args(argv)
    base = isolate()
    if args.keep or args.reuse:
        shutil.rmtree(base, ignore_errors=True)
        base = (args.keep or args.reuse).resolve()
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            row = run_size(base / str(size), size, args.chunks_per_file,
                           reuse=args.reuse is not None)
            rows.append(row)
            print(table(["chunks", "files", "join s", "pulled", "embedded", "peak RSS MB",
                         "first answer s", "with vectors s"],
                        [[r["chunks"], r["files"], r["join_s"], r["pulled"], r["embedded"],
                          r["peak_rss_mb"], r["first_answer_s"],
                          r["first_answer_with_vectors_s"]] for r in rows]), flush=True)
            if not (args.keep or args.reuse):
                shutil.rmtree(base / str(size), ignore_errors=True)
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(base, ignore_errors=True)
    print(write_json("pull_scale", {"chunks_per_file": args.chunks_per_file, "results": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
