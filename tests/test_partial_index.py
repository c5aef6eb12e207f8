"""Searchable while the first index builds: a search from another process answers and
says the index is partial; an index killed half way resumes where it stopped.

Real processes, the real model (torch, so no ONNX export is waited for), real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from indexer.embedder import HashingEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from indexer.priority import OTHER, SOURCE, TESTS, category, embed_order
from retrieval.faces.api import Index
from sync.checkout.config import state_path
from sync.syncer.progress import Progress
from tests.conftest import write_repo

ROOT = Path(__file__).resolve().parent.parent


def _module(i: int) -> str:
    # Functions long enough to be chunks of their own: many batches for the model.
    body = "\n".join(f"    total_{j} = value * {j} + offset_{i}  # step {j} of handler {i}"
                     for j in range(12))
    return "\n\n".join(
        f"def handler_{i}_{n}(value, offset_{i}=0):\n    \"\"\"Handle case {n} of {i}.\"\"\"\n"
        f"{body}\n    return total_0"
        for n in range(4)
    ) + "\n"


@pytest.fixture
def big_repo(tmp_path: Path) -> Path:
    files = {f"pkg/mod_{i:02d}.py": _module(i) for i in range(40)}
    files["auth/password.py"] = (
        "import hashlib\n\n\ndef hash_password(password: str, salt: bytes) -> bytes:\n"
        "    \"\"\"Derive a key from a password with PBKDF2 and a salt.\"\"\"\n"
        "    return hashlib.pbkdf2_hmac('sha256', password.encode(), salt, 100_000)\n"
    )
    files["tests/test_password.py"] = "def test_hash():\n    assert True\n"
    files["README.md"] = "# demo\n\nA demo project.\n"
    return write_repo(tmp_path / "repo", files)


def _env(tmp_path: Path) -> dict[str, str]:
    # A cache of its own: every chunk goes through the model, none comes from the cache.
    return dict(os.environ, CODEVEIL_EMBEDDER="minilm-torch", PYTHONPATH=str(ROOT),
                CODEVEIL_CACHE_DIR=str(tmp_path / "cache"))


def _cv(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retrieval", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # about 100 s on two busy cores; the in-process version below is fast
def test_search_during_first_index_then_resume(big_repo: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    indexing = subprocess.Popen([sys.executable, "-m", "retrieval", "index", "--wait", "-q"],
                                cwd=big_repo, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        seen = None
        deadline = time.monotonic() + 240
        while seen is None and indexing.poll() is None and time.monotonic() < deadline:
            if not (big_repo / ".codeveil" / "config.json").exists():
                time.sleep(0.2)
                continue
            proc = _cv(big_repo, env, "search", "hash_password salt pbkdf2", "--json", "-k", "3")
            if proc.returncode != 0:  # the workspace is still being created
                time.sleep(0.2)
                continue
            out = json.loads(proc.stdout)
            if out["index"]["partial"] and out["hits"]:
                seen = out
        assert seen is not None, "the index finished before a search saw it partial"
        # Found by name and words although most vectors are not there yet.
        assert seen["hits"][0]["path"] == "auth/password.py"
        assert 0 <= seen["index"]["chunks_with_vectors"] < seen["index"]["chunks"]
        plain = _cv(big_repo, env, "search", "hash_password", "-k", "1")
        assert plain.returncode == 0, plain.stderr
        total, done = _coverage(big_repo)
        if done < total:  # partial after it answered, so partial while it did
            assert "index is partial" in plain.stderr
            assert "auth/password.py" in plain.stdout
        # Stop the index the hard way once some vectors, not all, are stored.
        while indexing.poll() is None and time.monotonic() < deadline:
            total, done = _coverage(big_repo)
            if 0 < done < total:
                indexing.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        indexing.kill()
        indexing.wait()
    total, before = _coverage(big_repo)
    assert 0 < before < total, "the index finished before it could be interrupted"

    resumed = _cv(big_repo, env, "index", "--wait", "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    files = 43
    # Only the files whose vectors had not reached the store were sent again.
    assert 0 < report["files_changed"] < files
    assert report["chunks_total"] == total
    after = json.loads(_cv(big_repo, env, "search", "handler 7 case 2", "--json").stdout)
    assert after["index"] == {"partial": False, "chunks": total, "chunks_with_vectors": total}
    assert after["hits"]
    status = json.loads(_cv(big_repo, env, "status", "--json").stdout)
    assert status["server_chunks"] == status["chunks"] == total  # nothing twice


class _Interrupt(Exception):
    pass


class _SearchThenStop(Progress):
    """After the first batch reaches the store, and once the chunker (which runs ahead of
    the model) has written every file, search the index as a second client would (its
    own `Index`), then stop the sync as a crash would. (Storing a sealed batch takes
    milliseconds: the first one can land before the last file is chunked.)"""

    def __init__(self, repo: Path, model: HashingEmbedder) -> None:
        self.repo, self.model = repo, model
        self.seen: tuple[list, dict] | None = None

    def files_done(self, n: int) -> None:
        _wait_until_all_chunked(self.repo)
        with Index(self.repo, embedder=self.model) as other:
            self.seen = (other.search("hash_password salt pbkdf2", k=3), other.coverage())
        raise _Interrupt


def test_search_while_building_and_resume_in_process(big_repo: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    model = HashingEmbedder()
    stop = _SearchThenStop(big_repo, model)
    with Index(big_repo, embedder=model) as idx, pytest.raises(_Interrupt):
        idx.index(wait=True, progress=stop)
    assert stop.seen is not None
    hits, coverage = stop.seen
    assert coverage["partial"] and 0 < coverage["chunks_with_vectors"] < coverage["chunks"]
    # Every file's chunks are there already (chunked ahead), by name and words at least.
    assert hits and hits[0].path == "auth/password.py"
    with Index(big_repo, embedder=model) as idx:
        report = idx.index(wait=True)
        # Resumed: the embedded batch is not embedded again. (A sealed index sends its
        # rows once everything is embedded, in a random order: all of them are sent now.)
        assert 0 < report.chunks_embedded < report.chunks_total
        assert report.chunks_total == coverage["chunks"]
        assert idx.coverage() == {"partial": False, "chunks": coverage["chunks"],
                                  "chunks_with_vectors": coverage["chunks"]}
        status = idx.status()
    assert status["server_chunks"] == status["chunks"]


def _coverage(repo: Path) -> tuple[int, int]:
    db = open_state_db(state_path(repo))
    try:
        return LocalChunks(db).coverage()
    finally:
        db.close()


def test_embed_order_puts_source_first_then_recent(tmp_path: Path) -> None:
    assert category("src/app.py") == SOURCE
    assert category("tests/test_app.py") == TESTS
    assert category("pkg/app_test.go") == TESTS
    assert category("docs/guide.md") == OTHER
    assert category("docs/conf.py") == SOURCE  # a program is code wherever it sits
    assert category("README.md") == OTHER
    repo = write_repo(tmp_path / "r", {"a.py": "x = 1\n", "b.py": "y = 2\n",
                                       "tests/test_a.py": "z = 3\n", "NOTES.md": "n\n"})
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one", "--date=2020-01-01T00:00:00"], check=True,
                   env=dict(os.environ, GIT_COMMITTER_DATE="2020-01-01T00:00:00"))
    (repo / "b.py").write_text("y = 3\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    # b.py changed last: first among the sources; tests, then docs, after them.
    assert embed_order(["NOTES.md", "tests/test_a.py", "a.py", "b.py"], repo) == [
        "b.py", "a.py", "tests/test_a.py", "NOTES.md"]
    # Outside git: by category; within it, in no particular order (never by path, which
    # would number a server's rows in path order).
    names = [f"m{i:02d}.py" for i in range(30)]
    orders = {tuple(embed_order([*names, "NOTES.md"], tmp_path / "nogit")) for _ in range(5)}
    assert all(o[-1] == "NOTES.md" and sorted(o[:-1]) == names for o in orders)
    assert len(orders) > 1


class _SearchOnce(Progress):
    def __init__(self, repo: Path, model: HashingEmbedder, query: str) -> None:
        self.repo, self.model, self.query = repo, model, query
        self.seen: tuple[list, dict] | None = None

    def files_done(self, n: int) -> None:
        # Searches after the first batch, once every file's chunks are in the table: the
        # chunker runs ahead of the model, but how far ahead by then depends on the
        # machine, so the model's side waits for it here.
        if self.seen is None:
            _wait_until_all_chunked(self.repo)
            with Index(self.repo, embedder=self.model) as other:
                self.seen = (other.search(self.query, k=3), other.coverage())


def _wait_until_all_chunked(repo: Path) -> None:
    """Until every file's chunks are in the table. The chunker runs ahead of the model,
    but how far ahead after the first batch depends on the machine."""
    files = sum(1 for p in repo.rglob("*") if p.is_file() and ".codeveil" not in p.parts)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        db = open_state_db(state_path(repo))
        try:
            if LocalChunks(db).count_files() == files:
                return
        finally:
            db.close()
        time.sleep(0.02)


def test_a_few_early_vectors_do_not_outvote_the_words(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    files = {f"pkg/mod_{i:03d}.py": _module(i) for i in range(120)}
    # Docs are embedded last: while the first batches go in, only words can find it.
    files["docs/guide.md"] = "# Guide\n\nHow to reticulate splines for the minimap.\n"
    repo = write_repo(tmp_path / "repo", files)
    model = HashingEmbedder()
    # The query asks for the guide: a docs page's word votes are not held back behind
    # code then (retrieval.search.signals), so only the vectors' coverage decides here.
    probe = _SearchOnce(repo, model, "the guide to reticulate splines for the minimap")
    with Index(repo, embedder=model) as idx:
        idx.index(wait=True, progress=probe)
    assert probe.seen is not None
    hits, coverage = probe.seen
    assert coverage["partial"] and coverage["chunks_with_vectors"] < coverage["chunks"] / 4
    # The vector ranking covers only the handlers embedded so far; it ranks some of them
    # first all the same, and at a full vote they would beat BM25's find.
    assert hits[0].path == "docs/guide.md", (hits, coverage)


class _CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting the texts it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_batch(texts)


def test_a_search_with_no_vectors_does_not_embed_the_query(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No chunk has a vector here (the cache was emptied before any search built the
    # local vector index, as before a first index's first batch): the search answers by
    # words and names, without the model, so that it neither loads it nor waits for
    # its graph to be exported.
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    files = {
        "auth/password.py": "def hash_password(password, salt):\n    return salt + password\n",
        "docs/guide.md": "# Guide\n\nHow to reticulate splines.\n",
    }
    for name in ("with", "without"):
        with Index(write_repo(tmp_path / name, files), embedder=HashingEmbedder()) as idx:
            idx.index(wait=True)
    shutil.rmtree(tmp_path / "cache")
    seen = {}
    for name in ("without", "with"):  # the cache is shared: refilled for the second only
        if name == "with":
            with Index(tmp_path / name, embedder=HashingEmbedder()) as idx:
                idx.index(wait=True, reupload=True)  # the vectors back in the cache
        model = _CountingEmbedder()
        with Index(tmp_path / name, embedder=model) as idx:
            # Asking for the guide: a docs page is not held back behind code then.
            hits = idx.search("the guide to reticulate splines", k=2)
            seen[name] = (hits[0].path, idx.coverage()["chunks_with_vectors"], model.texts)
    assert seen["with"] == ("docs/guide.md", 2, ["the guide to reticulate splines"])
    assert seen["without"] == ("docs/guide.md", 0, [])
