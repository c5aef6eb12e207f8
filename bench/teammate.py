"""A teammate joining a sealed workspace: pull the vectors, or embed everything again.

One run, side by side, on one real server on loopback:

    cold      the first machine indexes the trees from scratch (empty embedding cache)
    teammate  a second machine (its own config dir and empty cache) joins the workspace
              with the exported key and indexes its clone of the same trees: it pulls
              the sealed rows and embeds only what the workspace lacks
    first     the teammate's time from joining to its first answered search

once for a pristine teammate machine (its first search also prepares the model: the
one-time ONNX export, paid once per machine, not per repo) and once for a machine that
has run codeveil before (the prepared model copied into its cache, no vectors), and
checks that each teammate's top-10 equals the first machine's for a set of queries.

    python bench/teammate.py --tree /path/to/requests --tree /path/to/flask
    python bench/teammate.py                 # the installed requests package
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Server, isolate, table, write_json

QUERIES = [
    "retry a request after a connection error",
    "parse cookies from a response header",
    "register a url route on the application",
    "load configuration from environment variables",
    "stream a large response body in chunks",
    "handle an http redirect",
    "render a template with a context",
    "set basic authentication credentials",
]


def _as(base: Path, name: str) -> None:
    os.environ["CODEVEIL_CONFIG_DIR"] = str(base / name / "config")
    os.environ["CODEVEIL_CACHE_DIR"] = str(base / name / "cache")


def _top(idx, query: str) -> list[tuple[str, int, int]]:
    return [(h.path, h.start_line, h.end_line) for h in idx.search(query, k=10)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, action="append",
                        help="a source tree to index (repeat; default: the requests package)")
    parser.add_argument("--out", default="teammate")
    args = parser.parse_args(argv)
    if not args.tree:
        import requests

        args.tree = [Path(requests.__file__).resolve().parent]

    from retrieval import Index
    from sync.checkout.config import load_token
    from sync.crypto.keys import export_key, import_key, load_key

    base = isolate()
    (base / "data").mkdir()
    server = Server(base / "data")
    try:
        repo = base / "alice-repo"
        for tree in args.tree:
            shutil.copytree(tree, repo / tree.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
        _as(base, "alice")
        alice = Index(repo)
        config = alice.init(server=server.url)
        t0 = time.perf_counter()
        cold = alice.index(wait=True)
        cold_s = time.perf_counter() - t0
        want = {q: _top(alice, q) for q in QUERIES}
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
        alice.close()

        teammates = {}
        for name, prepared in (("bob", False), ("carol", True)):
            clone = base / f"{name}-repo"
            shutil.copytree(repo, clone, ignore=shutil.ignore_patterns(".codeveil"))
            _as(base, name)
            if prepared:
                shutil.copytree(base / "alice" / "cache" / "models",
                                base / name / "cache" / "models")
            import_key(config.workspace_id, key_text)
            t0 = time.perf_counter()
            mate = Index(clone)
            mate.init(server=server.url, workspace_id=config.workspace_id, token=token)
            pulled = mate.index(wait=True)
            pull_s = time.perf_counter() - t0
            got = _top(mate, QUERIES[0])
            first_s = time.perf_counter() - t0
            same = [got == want[QUERIES[0]]] + [_top(mate, q) == want[q] for q in QUERIES[1:]]
            mate.close()
            teammates[name] = {"prepared_model": prepared, "seconds": pull_s,
                               "first_answer_seconds": first_s, "share_of_cold": pull_s / cold_s,
                               "embedded": pulled.chunks_embedded,
                               "pulled": pulled.chunks_pulled, "same_top10": sum(same),
                               "queries": len(same)}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)

    rows = [["cold index (first machine)", f"{cold_s:.1f} s", "", cold.chunks_embedded, 0, ""]]
    for m in teammates.values():
        rows.append([f"teammate, {'model prepared' if m['prepared_model'] else 'pristine'}",
                     f"{m['seconds']:.1f} s ({m['share_of_cold']:.1%} of cold)",
                     f"{m['first_answer_seconds']:.1f} s", m["embedded"], m["pulled"],
                     f"{m['same_top10']} of {m['queries']}"])
    print(table(["machine", "first index", "join to first answer", "chunks embedded",
                 "chunks pulled", "same top-10"], rows))
    path = write_json(args.out, {
        "trees": [str(t) for t in args.tree], "chunks": cold.chunks_total,
        "cold_seconds": cold_s, "teammates": teammates,
        "note": "cold and teammate runs are side by side in one process, on one server",
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
