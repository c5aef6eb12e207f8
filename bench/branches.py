"""Branches and teammates over one sealed workspace: one tree per ref over a shared pool
of blobs, against one tree for everyone (what a workspace was before refs), side by side
in one run on one `codeveil serve` on loopback. Machines are simulated by checkouts of
their own (state dirs) with config and cache dirs of their own; a ref is named with
CODEVEIL_REF, as a git checkout's branch would name it. A generated tree and the hashing
embedder stand in for a real repository and the model (the model would take hours on 2
cores; what is measured is the sync, which does not depend on the vectors).

    alternate   two teammates on branches differing in 5% of files sync 20 times each,
                alternately: bytes sent per sync after the first ("today": both on one
                tree, which flips at every sync)
    switch      a checkout switches between two branches differing in 1,000 files, both
                synced before: bytes sent by the sync after the switch
    join        a teammate joins on a third branch: chunks embedded, against the files
                no ref holds
    ref cost    what each further ref over one repository costs the server (nodes,
                rows, bytes of the data dir) at 10 refs
    daemon      (--daemon) a git repository with a daemon running: seconds from
                `git checkout` of a branch 1,000 files away to the daemon's sync done
                and to a search answering from the new branch, first visit and return
                (bench/results/branches_daemon.json)

    python bench/branches.py [--files 2000]
    python bench/branches.py --daemon [--files 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Server, isolate, table, write_json


def generate(root: Path, files: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    out = {}
    for i in range(files):
        body = "\n".join(f"    v{j} = {rng.randrange(10**6)} + x  # step {j}" for j in range(12))
        out[f"pkg{i % 20}/mod_{i}.py"] = f"def f_{i}(x):\n{body}\n    return x\n"
    write(root, out)
    return out


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def branch(base: dict[str, str], names: list[str], tag: str) -> dict[str, str]:
    return {**base, **{n: base[n] + f"\ndef changed_on_{tag}():\n    return '{tag}'\n"
                       for n in names}}


class Machine:
    """One teammate's machine: a checkout, a config dir and a cache dir of its own."""

    def __init__(self, base: Path, name: str, server: Server, workspace: str | None,
                 key_text: str | None, token: str | None) -> None:
        self.root = base / name / "repo"
        self.env = {"CODEVEIL_CONFIG_DIR": str(base / name / "config"),
                    "CODEVEIL_CACHE_DIR": str(base / name / "cache")}
        self.server, self.workspace, self.key_text, self.token = server, workspace, \
            key_text, token
        self.index = None

    def _enter(self, ref: str) -> None:
        os.environ.update(self.env)
        os.environ["CODEVEIL_REF"] = ref

    def sync(self, ref: str, files: dict[str, str]) -> object:
        from indexer.embedder import HashingEmbedder
        from retrieval import Index
        from sync.checkout.config import load_config, load_token
        from sync.crypto.keys import export_key, import_key, load_key

        self._enter(ref)
        write(self.root, files)
        if self.index is None:
            self.index = Index(self.root, embedder=HashingEmbedder())
            if self.workspace is None:
                self.index.init(server=self.server.url)
                ws = load_config(self.root).workspace_id
                self.workspace, self.key_text = ws, export_key(load_key(ws))
                self.token = load_token(ws)
            else:
                assert self.key_text is not None
                import_key(self.workspace, self.key_text)
                self.index.init(server=self.server.url, workspace_id=self.workspace,
                                token=self.token)
        else:  # a new ref (branch) is read when the client is opened
            self.index.close()
            self.index = Index(self.root, embedder=HashingEmbedder())
        return self.index.index(wait=True)


def data_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*") if p.is_file())


def scenario_alternate(base: Path, files: int, one_tree: bool) -> list[int]:
    base.mkdir(parents=True)
    server = Server(base / "data")
    try:
        tree = generate(base / "seed", files)
        feature = branch(tree, sorted(tree)[: files // 20], "feature")
        alice = Machine(base, "alice", server, None, None, None)
        alice.sync("alice@a:main", tree)
        bob = Machine(base, "bob", server, alice.workspace, alice.key_text, alice.token)
        sent = []
        for _ in range(20):
            for m, ref, t in ((bob, "bob@b:feature", feature), (alice, "alice@a:main", tree)):
                r = m.sync("team" if one_tree else ref, t)
                sent.append(r.bytes_sent)  # type: ignore[attr-defined]
        return sent[1:]
    finally:
        server.stop()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=b@example.com", "-c",
                    "user.name=bench", *args], check=True, capture_output=True)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CODEVEIL_EMBEDDER": "hashing",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "retrieval", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _settled_after(repo: Path, since: float, timeout: float = 600.0) -> dict:
    """The daemon's status once a sync started after `since` is done with nothing
    pending (that sync saw the checkout)."""
    from sync.daemon import DaemonFiles, read_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = read_status(DaemonFiles.for_root(repo)) or {}
        if ((s.get("last_sync_started") or 0) > since and s.get("state") == "idle"
                and s.get("pending_changes") == 0 and s.get("last_sync_ok")):
            return dict(s)
        time.sleep(0.05)
    raise SystemExit(f"the daemon did not settle within {timeout} s")


def _answers_from(repo: Path, tag: str, timeout: float = 600.0) -> float:
    """Search until the top hit holds `changed_on_<tag>`; returns when (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _cli("search", f"changed_on_{tag}", "--json", "-k", "1", "-C", repo)
        hits = json.loads(found.stdout)["hits"] if found.returncode == 0 else []
        if hits and f"changed_on_{tag}" in hits[0]["text"]:
            return time.monotonic()
    raise SystemExit(f"search never answered from branch {tag}")


def scenario_daemon(base: Path, files: int) -> dict[str, object]:
    """A daemon over a git checkout, switched between two branches 1,000 files apart."""
    repo = base / "daemon" / "repo"
    tree = generate(repo, files)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "main")
    _git(repo, "checkout", "-q", "-b", "big")
    write(repo, {n: t for n, t in branch(tree, sorted(tree)[:1000], "big").items()
                 if n in sorted(tree)[:1000]})
    _git(repo, "commit", "-q", "-am", "big")
    _git(repo, "checkout", "-q", "main")
    server = Server(base / "daemon" / "data")
    rows = {}
    try:
        for step in (("init", repo, "--server", server.url),
                     ("daemon", "start", repo, "--debounce", "0.5")):
            done = _cli(*step)
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
        _settled_after(repo, 0)
        for label, target, tag in (("to big, first visit", "big", "big"),
                                   ("back to main", "main", None),
                                   ("to big again", "big", "big")):
            wall, t0 = time.time(), time.monotonic()
            _git(repo, "checkout", "-q", target)
            status = _settled_after(repo, wall)
            synced = time.monotonic()
            answered = _answers_from(repo, tag) if tag else synced
            result = status.get("last_result") or {}
            rows[label] = {"sync_done_s": synced - t0, "search_answers_s": answered - t0,
                           "files_changed": result.get("files_changed"),
                           "bytes_sent": result.get("bytes_sent"),
                           "chunks_embedded": result.get("chunks_embedded")}
    finally:
        _cli("daemon", "stop", repo)
        server.stop()
    print("daemon: git checkout between branches 1,000 files apart, daemon running")
    print(table(["checkout", "sync done s", "search answers s", "files changed",
                 "bytes sent", "embedded"],
                [[k, v["sync_done_s"], v["search_answers_s"], v["files_changed"],
                  v["bytes_sent"], v["chunks_embedded"]] for k, v in rows.items()]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--daemon", action="store_true",
                        help="only the daemon scenario (branches_daemon.json)")
    args = parser.parse_args()
    base = isolate()
    if args.daemon:
        rows = scenario_daemon(base, args.files)
        print(write_json("branches_daemon", {"files": args.files, "checkouts": rows}))
        shutil.rmtree(base, ignore_errors=True)
        return
    results: dict[str, object] = {"files": args.files}

    rows = []
    per = {}
    for label, one in (("one tree (today)", True), ("a tree per ref", False)):
        sent = scenario_alternate(base / label.split()[0], args.files, one)
        per[label] = sent
        rows.append([label, len(sent), sum(sent) / len(sent), max(sent)])
    today, refs = (sum(v) / len(v) for v in per.values())
    print("alternate: two teammates, branches 5% apart, 20 syncs each, after the first")
    print(table(["store", "syncs", "bytes sent/sync", "max"], rows))
    print(f"ratio: {refs / today:.4%} of today's\n" if today else "")
    results["alternate"] = {**per, "ratio": refs / today if today else None}

    # switch, join and ref cost: one server, one workspace of refs.
    b = base / "refs"
    b.mkdir()
    server = Server(b / "data")
    try:
        tree = generate(b / "seed", args.files)
        big = branch(tree, sorted(tree)[:1000], "big")
        alice = Machine(b, "alice", server, None, None, None)
        first = alice.sync("alice@a:main", tree)
        alice.sync("alice@a:big", big)
        back = alice.sync("alice@a:main", tree)
        again = alice.sync("alice@a:big", big)
        third = branch(tree, sorted(tree)[-30:], "third")
        carol = Machine(b, "carol", server, alice.workspace, alice.key_text, alice.token)
        joined = carol.sync("carol@c:third", third)
        size0 = data_bytes(b / "data")
        before = ref_counts(server, alice)
        for i in range(7):  # 3 refs so far: 10 in all
            alice.sync(f"alice@a:topic{i}", branch(tree, [sorted(tree)[i]], f"t{i}"))
        after = ref_counts(server, alice)
        size1 = data_bytes(b / "data")
    finally:
        server.stop()
    print("switch: 1,000 changed files, both branches synced before")
    print(table(["sync", "files changed", "bytes sent", "chunks embedded"], [
        ["first index (main)", first.files_changed, first.bytes_sent, first.chunks_embedded],
        ["back to main", back.files_changed, back.bytes_sent, back.chunks_embedded],
        ["back to big", again.files_changed, again.bytes_sent, again.chunks_embedded]]))
    print("join: a teammate on a third branch (30 files no ref holds)")
    print(table(["files", "linked", "chunks embedded", "chunks pulled", "bytes sent"], [
        [joined.files_changed, joined.files_linked, joined.chunks_embedded,
         joined.chunks_pulled, joined.bytes_sent]]))
    added = len(after) - len(before)
    cost = [(sum(r.files for r in after) - sum(r.files for r in before)) / added,
            (sum(r.rows for r in after) - sum(r.rows for r in before)) / added,
            (size1 - size0) / added]
    print(f"ref cost: {len(after)} refs over one repository of {args.files} files")
    print(table(["per further ref", "leaves", "rows it names (shared)", "data dir bytes"],
                [["", *cost]]))
    results.update(
        switch={"first": first.bytes_sent, "back": back.bytes_sent, "again": again.bytes_sent,
                "back_files": back.files_changed},
        join={"files": joined.files_changed, "linked": joined.files_linked,
              "embedded": joined.chunks_embedded, "pulled": joined.chunks_pulled,
              "bytes_sent": joined.bytes_sent},
        ref_cost={"refs": len(after), "leaves": cost[0], "rows_named": cost[1],
                  "data_dir_bytes": cost[2]})
    print(write_json("branches", results))
    shutil.rmtree(base, ignore_errors=True)


def ref_counts(server: Server, m: Machine) -> list:
    from sync.transport.http_client import HttpClient

    assert m.workspace is not None and m.token is not None
    with HttpClient(server.url, m.workspace, m.token) as client:
        return client.refs()


if __name__ == "__main__":
    main()
