"""Sync cost against repo size, through the HTTP server on loopback.

    python bench/sync_scaling.py [--sizes 1000,10000,100000]

For synthetic repos of each size (small Python files in a realistic directory fan-out),
after a cold index: (a) a sync with nothing changed, (b) one changed file, (c) 1% of
files changed. The fast hashing embedder stands in for the model: this measures sync,
not embedding. Prints a table, writes bench/results/sync_scaling.json and .png.
Targets at 100k files: no-change under 1 s, one file under 2 s, bytes O(changed).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Server, Timer, isolate, save_figure, table, write_json
from indexer.embedder import HashingEmbedder
from retrieval import Index


def make_repo(root: Path, files: int) -> list[Path]:
    """`files` small files, ~20 per directory, three levels deep."""
    paths = []
    for i in range(files):
        d = root / f"a{i // 4000:02d}" / f"b{(i // 200) % 20:02d}" / f"c{(i // 20) % 10}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"m{i:06d}.py"
        p.write_text(f"def handler_{i}(request):\n    return respond(request, code={i})\n")
        paths.append(p)
    return paths


def touch(paths: list[Path], tag: str) -> None:
    for p in paths:
        p.write_text(p.read_text() + f"# {tag}\n")


def measure(idx: Index) -> dict:
    with Timer() as t:
        r = idx.index(wait=True)
    return {"seconds": t.seconds, "requests": r.requests, "bytes_sent": r.bytes_sent,
            "bytes_received": r.bytes_received, "files_changed": r.files_changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = isolate()
    server = Server(work / "server-data")
    rng = random.Random(1)
    results = []
    try:
        for n in sizes:
            repo = work / f"repo{n}"
            paths = make_repo(repo, n)
            idx = Index(repo, embedder=HashingEmbedder())
            idx.init(server=server.url)
            with Timer() as cold:
                idx.index(wait=True)
            idx.index(wait=True)  # settle: files written within the racy window are re-read once
            row = {"files": n, "cold_s": cold.seconds}
            row["no_change"] = measure(idx)
            touch([rng.choice(paths)], "one")
            row["one_file"] = measure(idx)
            touch(rng.sample(paths, max(1, n // 100)), "pct")
            row["one_percent"] = measure(idx)
            idx.close()
            results.append(row)
            print(f"{n} files done", flush=True)
    finally:
        rss = server.rss_mb()
        server.stop()
    rows = []
    for r in results:
        for case in ("no_change", "one_file", "one_percent"):
            m = r[case]
            rows.append([r["files"], case, m["files_changed"], m["seconds"], m["requests"],
                         m["bytes_sent"], m["bytes_received"]])
    print(table(["files", "case", "changed", "seconds", "requests", "sent B", "recv B"], rows))
    print(f"server RSS at the end: {rss:.0f} MB")
    write_json("sync_scaling", {"results": results, "server_rss_mb": rss})
    plot(results)


def plot(results: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["files"] for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for case, label in (("no_change", "nothing changed"), ("one_file", "one file"),
                        ("one_percent", "1% of files")):
        ax1.plot(sizes, [r[case]["seconds"] for r in results], marker="o", label=label)
        ax2.plot(sizes, [r[case]["bytes_sent"] + r[case]["bytes_received"] for r in results],
                 marker="o", label=label)
    for ax, title, unit in ((ax1, "sync time", "seconds"), (ax2, "bytes on the wire", "bytes")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("files in repo")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, "sync_scaling")


if __name__ == "__main__":
    main()
