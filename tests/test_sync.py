"""Sync against every store: the embedded one in-process, a real server on loopback
serving a data dir ("http"), and one serving a PostgreSQL database ("postgres"):
incremental updates, deletes, a teammate joining by diff, and convergence after crashes.
Every test that runs against a server runs against both servers.

These tests use the hashing embedder: what they measure is the sync, not the model
(the real model runs in test_index_e2e, test_canary and test_cli).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.store_contents import Contents, pg_workspace_contents, workspace_contents
from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_config, load_token, store_path
from sync.crypto.keys import WorkspaceKey, export_key, import_key, load_key
from sync.crypto.pages import PAGE_ROWS
from tests.conftest import write_repo
from tests.pg_fixtures import kill_mid_write, other_database
from tests.server_fixtures import ServerProcess

SERVERS = ["http", "postgres"]  # a server process on a data dir, on a PostgreSQL database
BACKENDS = ["embedded", *SERVERS]


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "retrieval", *args], cwd=cwd, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def snapshot(data_dir: Path, workspace_id: str, key: WorkspaceKey | None = None) -> Contents:
    """What a workspace of a data dir holds, opened (row ids are fresh on every send)."""
    return workspace_contents(data_dir, workspace_id, key or load_key(workspace_id))


@dataclass
class Backend:
    """Where a test's workspaces live: the embedded store under each repo's `.codeveil/`
    (no server), or the workspaces of a server process."""

    kind: str  # one of BACKENDS
    server: ServerProcess | None = None

    def open_index(self, repo: Path) -> Index:
        idx = Index(repo, embedder=HashingEmbedder())
        if self.server is not None:
            idx.init(server=self.server.url)
        return idx

    def init(self, repo: Path, env: dict[str, str]) -> None:
        """`codeveil init --server URL` in `repo`; nothing for the embedded store."""
        if self.server is not None:
            assert cli(["init", ".", "--server", self.server.url], repo, env).wait(60) == 0

    def contents(self, repo: Path, workspace_id: str,
                 key: WorkspaceKey | None = None) -> Contents:
        """What the workspace of `repo` holds, opened with its key."""
        key = key or load_key(workspace_id)
        if self.server is None:
            return workspace_contents(store_path(repo), workspace_id, key)
        if self.server.store is not None:
            return pg_workspace_contents(self.server.store, workspace_id, key)
        return workspace_contents(self.server.data_dir, workspace_id, key)


def _server(request: pytest.FixtureRequest, kind: str) -> ServerProcess:
    return request.getfixturevalue("pg_live_server" if kind == "postgres" else "live_server")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "embedded":
        return Backend("embedded")
    return Backend(request.param, _server(request, request.param))


@pytest.fixture(params=SERVERS)
def served(request: pytest.FixtureRequest) -> Backend:
    """A `Backend` of each kind of server."""
    return Backend(request.param, _server(request, request.param))


def many_files(root: Path, count: int, *, seed: int = 0) -> Path:
    rng = random.Random(seed)
    files = {}
    for i in range(count):
        folder = f"pkg{i % 7}/sub{i % 3}" if i % 5 else f"pkg{i % 7}"
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"])
                         for _ in range(12))
        files[f"{folder}/mod_{i}.py"] = (
            f"def function_{i}(value):\n    '''{words}'''\n    return value + {i}\n"
        )
    return write_repo(root, files)


def test_nothing_changed_is_one_request(tmp_path: Path, backend: Backend) -> None:
    repo = many_files(tmp_path / "repo", 60)
    idx = backend.open_index(repo)
    first = idx.index(wait=True)
    assert first.files_changed == 60
    assert first.chunks_embedded + first.chunks_from_cache == first.chunks_total > 0
    again = idx.index(wait=True)
    assert (again.files_changed, again.files_deleted, again.chunks_embedded) == (0, 0, 0)
    assert again.requests == 1
    if backend.server is not None:
        assert again.bytes_sent < 200 and again.bytes_received < 500
    idx.close()


def test_one_change_costs_its_depth_not_the_repo(tmp_path: Path, backend: Backend) -> None:
    repo = many_files(tmp_path / "repo", 200)
    idx = backend.open_index(repo)
    idx.index(wait=True)
    target = repo / "pkg3/sub2/mod_38.py"
    target.write_text(target.read_text() + "\ndef freshly_added_helper():\n    return 1\n")
    report = idx.index(wait=True)
    assert report.files_changed == 1 and report.files_deleted == 0
    # root + one children request per bucket level (root, level 1, level 2) + apply + dirs,
    # and the list of refs, asked before a new version is embedded (sync.syncer.ref_watch).
    assert report.requests <= 7
    if backend.server is not None:
        # One page of rows (the file's, and the emptiest pages' live ones: sync.crypto.pages)
        # and the tree path, not the repo's 200 files: ~1.4 KB a row on the wire.
        assert report.bytes_sent < PAGE_ROWS * 1_500 + 5_000
    hits = idx.search("freshly_added_helper", k=3)
    assert hits[0].path == "pkg3/sub2/mod_38.py"
    idx.close()


def test_deletes_remove_files_and_whole_directories(tmp_path: Path, backend: Backend) -> None:
    repo = many_files(tmp_path / "repo", 80)
    idx = backend.open_index(repo)
    idx.index(wait=True)
    before = idx.status()["server_chunks"]
    (repo / "pkg1/mod_15.py").unlink()
    shutil.rmtree(repo / "pkg2")
    report = idx.index(wait=True)
    gone = 1 + sum(1 for i in range(80) if i % 7 == 2)
    assert report.files_deleted == gone
    assert idx.status()["server_chunks"] == before - gone
    for hit in idx.search("function value return", k=50):
        assert not hit.path.startswith("pkg2/") and hit.path != "pkg1/mod_15.py"
    again = idx.index(wait=True)
    assert again.requests == 1
    idx.close()


def test_store_equals_a_clean_sync_after_many_edits(tmp_path: Path, backend: Backend,
                                                   monkeypatch) -> None:
    repo = many_files(tmp_path / "repo", 120)
    idx = backend.open_index(repo)
    idx.index(wait=True)
    rng = random.Random(7)
    files = sorted(p for p in repo.rglob("*.py"))
    for path in rng.sample(files, 15):
        path.write_text(path.read_text() + f"\n# edit {rng.random()}\n")
    for path in rng.sample([f for f in files if f.exists()], 10):
        path.unlink()
    write_repo(repo, {"newdir/deep/er/fresh.py": "def fresh():\n    return 'new'\n"})
    idx.index(wait=True)
    ws = load_config(repo).workspace_id
    state = backend.contents(repo, ws)
    idx.close()

    # A clean sync of the same files under the same key lands on the same store.
    clean_repo = tmp_path / "clean"
    shutil.copytree(repo, clean_repo, ignore=shutil.ignore_patterns(".codeveil"))
    monkeypatch.setenv("CODEVEIL_KEY", export_key(load_key(ws)))
    clean = backend.open_index(clean_repo)
    clean.index(wait=True)
    clean_ws = load_config(clean_repo).workspace_id
    clean_state = backend.contents(clean_repo, clean_ws)
    clean.close()
    assert state[0] is not None and state[0] == clean_state[0]
    assert state[1] == clean_state[1]
    assert state[2] == clean_state[2]


def test_teammate_joins_by_diff_not_reupload(tmp_path: Path, served: Backend,
                                             monkeypatch) -> None:
    assert served.server is not None
    repo = many_files(tmp_path / "repo", 100)
    idx = served.open_index(repo)
    idx.index(wait=True)
    ws = load_config(repo).workspace_id
    shared_key, token = export_key(load_key(ws)), load_token(ws)
    idx.close()

    # The teammate: another home (config dir), a clone of the same files, one edit.
    mate = tmp_path / "mate"
    shutil.copytree(repo, mate, ignore=shutil.ignore_patterns(".codeveil"))
    (mate / "pkg0/mod_0.py").write_text("def teammate_change():\n    return 0\n")
    monkeypatch.setenv("CODEVEIL_CONFIG_DIR", str(tmp_path / "mate-config"))
    import_key(ws, shared_key)
    mate_idx = Index(mate, embedder=HashingEmbedder())
    mate_idx.init(server=served.server.url, workspace_id=ws, token=token)
    report = mate_idx.index(wait=True)
    # The teammate's checkout syncs a ref of its own: every file alice sent is linked
    # (its leaf, and the pages holding its rows), the one edited is sent.
    assert report.files_changed - report.files_linked == 1
    assert report.chunks_embedded <= 2
    assert report.chunks_total >= 100  # every file is chunked locally for search
    assert mate_idx.search("teammate_change", k=1)[0].path == "pkg0/mod_0.py"
    mate_idx.close()


# -- crashes ------------------------------------------------------------------------


def test_client_killed_mid_sync_converges(tmp_path: Path, backend: Backend) -> None:
    repo = many_files(tmp_path / "repo", 1500, seed=3)
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")
    # How long a whole first index takes here, on a copy: the kills below land inside
    # that time, whatever the machine's speed or load (a fixed sleep was sometimes longer
    # than the whole index on a fast, idle machine).
    timing = tmp_path / "timing"
    shutil.copytree(repo, timing)
    backend.init(timing, env)
    started = time.monotonic()
    assert cli(["index", "--wait", "-q"], timing, env).wait(300) == 0
    whole = time.monotonic() - started
    backend.init(repo, env)
    rng = random.Random(11)
    kills = 0
    for _ in range(4):
        proc = cli(["index", "--wait", "-q"], repo, env)
        time.sleep(rng.uniform(0.3, 0.8) * whole)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(60)
        # Change things between attempts, as a user would.
        victim = repo / f"pkg{rng.randrange(7)}/mod_{rng.randrange(7, 1500, 7)}.py"
        if victim.exists():
            victim.unlink()
    assert kills >= 1
    final = cli(["index", "--wait", "-q"], repo, env)
    assert final.wait(300) == 0, final.stderr.read().decode()
    ws = load_config(repo).workspace_id
    state = backend.contents(repo, ws)

    clean_repo = tmp_path / "clean"
    shutil.copytree(repo, clean_repo, ignore=shutil.ignore_patterns(".codeveil"))
    clean_env = dict(env, CODEVEIL_KEY=export_key(load_key(ws)))
    backend.init(clean_repo, clean_env)
    assert cli(["index", "--wait", "-q"], clean_repo, clean_env).wait(300) == 0
    clean_state = backend.contents(clean_repo, load_config(clean_repo).workspace_id,
                                   load_key(ws))
    assert state[0] == clean_state[0] and state[1] == clean_state[1]
    assert state[2] == clean_state[2]


@pytest.mark.parametrize("kind", SERVERS)
def test_server_killed_mid_sync_converges(
    tmp_path: Path, request: pytest.FixtureRequest,
    server_factory: Callable[..., ServerProcess], kind: str,
) -> None:
    """A server of the test's own killed -9 three times while a first index runs. The
    data-dir server dies at a random moment; the PostgreSQL replica the moment it is
    inside a write transaction (the database keeps what committed and drops the rest)."""
    admin = None
    if kind == "postgres":
        import psycopg

        pg_url, name = request.getfixturevalue("pg_url"), "codeveil_sync_killed"
        server = server_factory(tmp_path / "replica", store=other_database(pg_url, name))
        admin = psycopg.connect(pg_url, autocommit=True)
    else:
        server = server_factory(tmp_path / "server-data")
    backend = Backend(kind, server)
    repo = many_files(tmp_path / "repo", 1500, seed=5)
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")
    backend.init(repo, env)
    rng = random.Random(13)
    caught = 0
    with admin or contextlib.nullcontext():
        for _ in range(3):
            proc = cli(["index", "--wait", "-q"], repo, env)
            if admin is not None:
                caught += kill_mid_write(server, proc, admin, name)
            else:
                time.sleep(rng.uniform(1.0, 4.0))
                server.kill()
            proc.wait(120)  # the client fails with a clear error, or had finished
            assert "Traceback" not in proc.stderr.read().decode()
            server.start()
            # Change things between attempts, as a user would.
            victim = repo / f"pkg{rng.randrange(7)}/mod_{rng.randrange(7, 1500, 7)}.py"
            victim.unlink(missing_ok=True)
    assert admin is None or caught >= 1  # at least one kill landed inside a write
    final = cli(["index", "--wait", "-q"], repo, env)
    assert final.wait(300) == 0, final.stderr.read().decode()
    ws = load_config(repo).workspace_id
    state = backend.contents(repo, ws)

    clean_repo = tmp_path / "clean"
    shutil.copytree(repo, clean_repo, ignore=shutil.ignore_patterns(".codeveil"))
    clean_env = dict(env, CODEVEIL_KEY=export_key(load_key(ws)))
    backend.init(clean_repo, clean_env)
    assert cli(["index", "--wait", "-q"], clean_repo, clean_env).wait(300) == 0
    clean_state = backend.contents(clean_repo, load_config(clean_repo).workspace_id,
                                   load_key(ws))
    assert state[0] == clean_state[0] and state[1] == clean_state[1]
    assert state[2] == clean_state[2]


def test_an_existing_workspace_keeps_its_model(tmp_path: Path, monkeypatch) -> None:
    # Built with one model, later opened with no model named: the workspace's own model
    # is used, so a new default never mixes vectors into it.
    monkeypatch.delenv("CODEVEIL_EMBEDDER", raising=False)
    repo = many_files(tmp_path / "repo", 5)
    built = Index(repo, embedder=HashingEmbedder())
    built.index(wait=True)
    built.close()
    reopened = Index(repo)
    assert reopened.index(wait=True).files_changed == 0
    assert reopened.search("function value", k=1)
    reopened.close()


def test_a_link_flipped_outside_during_indexing_never_gets_indexed(tmp_path: Path) -> None:
    from tests.test_walk import _FLIPPER

    repo = many_files(tmp_path / "repo", 30)
    outside = tmp_path / "outside.py"
    outside.write_text("def outside_secret_function():\n    return 'OUTSIDE_SECRET'\n")
    (repo / "inside.py").write_text("def inside_function():\n    return 1\n")
    os.symlink("inside.py", repo / "link.py")
    idx = Index(repo, embedder=HashingEmbedder())
    flipper = subprocess.Popen([sys.executable, "-c", _FLIPPER, str(repo / "link.py"),
                                "inside.py", str(outside)])
    try:
        for i in range(25):
            # A new stat each time, so the sync reads the link again (the race window).
            (repo / "inside.py").write_text(f"def inside_function():\n    return {i}\n")
            idx.index(wait=True)
            state = b"".join(p.read_bytes() for p in (repo / ".codeveil").glob("state.sqlite*"))
            assert b"OUTSIDE_SECRET" not in state, f"indexed at sync {i}"
    finally:
        flipper.kill()
        flipper.wait()
    hits = idx.search("outside_secret_function OUTSIDE_SECRET", k=50)
    assert all("OUTSIDE_SECRET" not in h.text for h in hits)
    idx.close()


def test_a_file_nested_too_deep_is_skipped_and_the_rest_indexed(
    tmp_path: Path, backend: Backend
) -> None:
    repo = many_files(tmp_path / "repo", 10)
    deepest_ok = "/".join(["d"] * 255)  # 255 directories above the file: the limit
    too_deep = "/".join(["e"] * 300)
    write_repo(repo, {f"{deepest_ok}/ok.py": "def deepest_allowed():\n    return 1\n",
                      f"{too_deep}/deep.py": "def far_too_deep():\n    return 2\n"})
    idx = backend.open_index(repo)
    report = idx.index(wait=True)
    skipped = dict(report.skipped)
    assert skipped["/".join(["e"] * 256)].startswith("nested too deep")
    assert report.files_changed == 11
    assert idx.search("deepest_allowed", k=1)[0].path == f"{deepest_ok}/ok.py"
    assert idx.index(wait=True).requests == 1  # and it stays in step
    idx.close()
