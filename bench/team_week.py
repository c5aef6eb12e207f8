"""A scripted week of a team on one server: is each chunk embedded once per team, and
does any checkout put back another's files?

Three people on one real server on loopback: alice with two clones on one machine (one
user, one host, no CODEVEIL_REF: a worktree, a CI container), bob and carol on machines
of their own (their refs named by CODEVEIL_REF, as their hosts would). A shared
"upstream" stands in for git: each of 30 edits is made by alice, bob or carol in turn
on a checkout that first pulls upstream, is indexed, and is pushed; every 10 edits the
whole team merges upstream (the second merge brings 5 new files), and alice's second
clone, which only pulls at merges, indexes after each of her edits (unchanged: it must
send nothing). The hashing embedder stands in for the model: what is counted is the
sync.

    python bench/team_week.py            # writes bench/results/team_week.json

Counted: chunks embedded by every machine together against the distinct chunk texts
ever indexed (once per team: equal), rows the server holds at the end, bytes sent, and
reverts (an index of alice's unchanged second clone that changed files on the server).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Server, isolate, table, write_json

FILES = 40
EDITS = 30
MERGE_EVERY = 10


def _body(i: int, version: int) -> str:
    return "".join(f"def step_{i}_{version}_{n}(x):\n    return x * {i + n + version}\n\n\n"
                   for n in range(1 + i % 3))


class Checkout:
    """One clone: its folder, whose config dir and cache it uses, its ref name."""

    def __init__(self, base: Path, name: str, person: str, ref: str | None) -> None:
        self.root = base / name
        self.name = name
        self.person = person
        self.ref = ref
        self.index = None
        self.files: dict[str, str] = {}

    def use(self, base: Path) -> None:
        os.environ["CODEVEIL_CONFIG_DIR"] = str(base / self.person / "config")
        os.environ["CODEVEIL_CACHE_DIR"] = str(base / self.person / "cache")
        if self.ref is None:
            os.environ.pop("CODEVEIL_REF", None)
        else:
            os.environ["CODEVEIL_REF"] = self.ref

    def pull(self, upstream: dict[str, str]) -> None:
        for path, text in upstream.items():
            if self.files.get(path) != text:
                target = self.root / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        self.files = dict(upstream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="team_week")
    parser.add_argument("--label", default="", help="what the run measures (e.g. main)")
    args = parser.parse_args(argv)

    from indexer.embedder import HashingEmbedder
    from indexer.local_chunks import LocalChunks, open_state_db
    from retrieval import Index
    from sync.checkout.config import load_token, state_path
    from sync.crypto.keys import export_key, import_key, load_key
    from sync.syncer.sync_report import SyncReport

    rng = random.Random(56)
    base = isolate()
    (base / "data").mkdir()
    server = Server(base / "data")
    versions = dict.fromkeys(range(FILES), 0)
    upstream = {f"pkg{i % 5}/mod_{i}.py": _body(i, 0) for i in range(FILES)}
    a1 = Checkout(base, "alice-1", "alice", None)
    a2 = Checkout(base, "alice-2", "alice", None)
    bob = Checkout(base, "bob", "bob", "bob@desk:main")
    carol = Checkout(base, "carol", "carol", "carol@laptop:main")
    team = [a1, a2, bob, carol]
    texts: set[str] = set()
    totals = {"embedded": 0, "pulled": 0, "bytes_sent": 0, "reverts": 0, "syncs": 0}
    started = time.perf_counter()

    def index(c: Checkout) -> SyncReport:
        c.use(base)
        report = c.index.index(wait=True)
        totals["embedded"] += report.chunks_embedded
        totals["pulled"] += report.chunks_pulled
        totals["bytes_sent"] += report.bytes_sent
        totals["syncs"] += 1
        db = open_state_db(state_path(c.root))
        try:
            texts.update(ch.embed_text for _, ch in LocalChunks(db).iter_all())
        finally:
            db.close()
        return report

    try:
        for c in team:
            c.pull(upstream)
        a1.use(base)
        a1.index = Index(a1.root, embedder=HashingEmbedder())
        config = a1.index.init(server=server.url)
        index(a1)
        key_text, token = export_key(load_key(config.workspace_id)), load_token(
            config.workspace_id)
        for c in team[1:]:
            c.use(base)
            if c.person != "alice":
                import_key(config.workspace_id, key_text)
            c.index = Index(c.root, embedder=HashingEmbedder())
            c.index.init(server=server.url, workspace_id=config.workspace_id, token=token)
            index(c)
        authors = [a1, bob, carol]
        merges = 0
        for step in range(EDITS):
            author = authors[step % 3]
            author.pull(upstream)
            i = rng.randrange(FILES)
            versions[i] += 1
            path = f"pkg{i % 5}/mod_{i}.py"
            upstream = {**upstream, path: _body(i, versions[i])}
            author.pull(upstream)
            index(author)
            # Her second clone, unchanged since it last pulled, must send nothing.
            if author is a1 and index(a2).files_changed:
                totals["reverts"] += 1
            if (step + 1) % MERGE_EVERY == 0:
                merges += 1
                if merges == 2:  # bob's feature branch lands: five new files
                    upstream = {**upstream, **{
                        f"feature/f_{n}.py": f"def feature_{n}(x):\n    return x + {n}\n"
                        for n in range(5)}}
                for c in team:
                    c.pull(upstream)
                    index(c)
        rows = a1.index.workspace.open().client.info().chunks
        live = len({(p, t) for p, t in upstream.items()})
    finally:
        for c in team:
            if c.index is not None:
                c.index.close()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    distinct = len(texts)
    out = {"label": args.label, "edits": EDITS, "merges": merges, "files": live,
           "syncs": totals["syncs"], "chunks_embedded": totals["embedded"],
           "chunks_pulled": totals["pulled"], "distinct_chunks": distinct,
           "embedded_per_distinct": totals["embedded"] / distinct,
           "server_rows": rows, "bytes_sent": totals["bytes_sent"],
           "reverts": totals["reverts"], "seconds": time.perf_counter() - started}
    print(table(["", "chunks embedded", "distinct chunks", "x", "pulled", "server rows",
                 "bytes sent", "reverts"],
                [[args.label or "run", totals["embedded"], distinct,
                  f"{totals['embedded'] / distinct:.2f}", totals["pulled"], rows,
                  totals["bytes_sent"], totals["reverts"]]]))
    print(f"wrote {write_json(args.out, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
