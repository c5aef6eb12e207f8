"""With the server unreachable, `codeveil index` updates this machine's index (chunks,
words and vectors) and the next index that reaches the server sends exactly what it
lacks: a real server on loopback, stopped and restarted; real `codeveil` processes,
killed with SIGKILL on the way; a teammate who then pulls the workspace. The server
keeps its workspace in a data dir or, where one can be started, on PostgreSQL.

The hashing embedder stands for the model: what is under test is what is sent, not
how the vectors rank."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import load_config, state_path
from sync.crypto.keys import export_key, load_key
from tests.conftest import write_repo
from tests.pg_fixtures import other_database
from tests.server_fixtures import ServerProcess

EDITED = "def offline_edited_helper(records):\n    return sorted(records)\n"


def _env(tmp: Path, name: str) -> dict[str, str]:
    """One machine: its own config dir (keys, tokens) and embedding cache."""
    return dict(os.environ, CODEVEIL_EMBEDDER="hashing",
                CODEVEIL_CONFIG_DIR=str(tmp / f"{name}-config"),
                CODEVEIL_CACHE_DIR=str(tmp / f"{name}-cache"))


def _cv(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retrieval", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _ok(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = _cv(args, cwd, env)
    assert proc.returncode == 0, proc.stderr
    return proc


def _many_files(repo: Path, n: int) -> None:
    """Enough files that a SIGKILL a moment after the start lands mid-way."""
    write_repo(repo, {f"pkg/mod{i:03d}.py": "".join(
        f"def handler_{i}_{j}(value):\n    return value * {j} + {i}\n\n\n"
        for j in range(12)) for i in range(n)})


def _killed_mid_way(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run `codeveil ARGS` and SIGKILL it once it has written chunks that still wait for
    their vectors (pending): mid-way, between the chunk table and the rest."""
    state = cwd / ".codeveil" / "state.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "retrieval", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=5)
            try:
                pending = db.execute("SELECT count(*) FROM pending_files").fetchone()[0]
            except sqlite3.OperationalError:  # locked for a moment: look again
                pending = 0
            finally:
                db.close()
            if pending:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        assert proc.wait() == -signal.SIGKILL, "it finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()


def _offline_line(proc: subprocess.CompletedProcess[str]) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "cannot reach server" in lines[0] and "sent when the server answers" in lines[0]


def _local_vectors_cover(repo: Path, env: dict[str, str], path: str, symbol: str) -> None:
    """`path` is in this machine's chunk table with `symbol`, not pending (search by
    meaning covers it), and its vectors are in this machine's cache."""
    config = load_config(repo)
    db = open_state_db(state_path(repo))
    cache = EmbeddingCache(Path(env["CODEVEIL_CACHE_DIR"]) / "embeddings.sqlite")
    try:
        local = LocalChunks(db)
        chunks = local.for_file(path)
        assert any(symbol in c.symbol for c in chunks)
        assert not local.pending_files()
        keys = [cache_key(config.model_id, c.embed_text) for c in chunks]
        assert set(cache.get_many(keys, config.dim)) == set(keys)
    finally:
        cache.close()
        db.close()


def _teammate_pulls_exactly(tmp: Path, repo: Path, url: str, env: dict[str, str]) -> None:
    """A teammate with a copy of `repo` as it is now joins and pulls: every chunk's
    vector comes from the workspace (so the server holds this very state), no row is
    sent back (the teammate's own ref links what is there), and the tree of `repo`'s
    ref is `repo`'s (so it holds nothing else)."""
    config = load_config(repo)
    key_text, token = _credentials(env, config.workspace_id)
    mate_env = _env(tmp, "mate")
    mate_repo = tmp / "mate-repo"
    subprocess.run(["cp", "-r", str(repo), str(mate_repo)], check=True)
    subprocess.run(["rm", "-rf", str(mate_repo / ".codeveil")], check=True)
    _ok(["key", "import", key_text, "--workspace", config.workspace_id], mate_repo, mate_env)
    _ok(["init", "--server", url, "--workspace", config.workspace_id, "--token",
         token], mate_repo, mate_env)
    report = json.loads(_ok(["index", "--wait", "--json"], mate_repo, mate_env).stdout)
    assert report["chunks_embedded"] == 0, report  # nothing the server lacked
    assert report["chunks_pulled"] == report["chunks_total"] > 0
    assert report["files_linked"] == report["files_changed"]
    again = json.loads(_ok(["index", "--wait", "--json"], repo, env).stdout)
    assert again["files_changed"] == 0 and again["chunks_embedded"] == 0  # nothing twice
    tree = json.loads(_ok(["status", "--server", "--json"], repo, env).stdout)["server_tree"]
    assert tree["in_step"] is True, tree


def _credentials(env: dict[str, str], workspace_id: str) -> tuple[str, str]:
    """The key (exported) and the token `env`'s machine holds for `workspace_id`."""
    from sync.checkout.config import load_token

    old = os.environ.get("CODEVEIL_CONFIG_DIR")
    os.environ["CODEVEIL_CONFIG_DIR"] = env["CODEVEIL_CONFIG_DIR"]
    try:
        return export_key(load_key(workspace_id)), load_token(workspace_id)
    finally:
        if old is not None:
            os.environ["CODEVEIL_CONFIG_DIR"] = old


def _edit_delete_add(repo: Path) -> None:
    (repo / "net" / "upload.py").write_text(EDITED)
    (repo / "auth" / "password.py").unlink()
    (repo / "tools").mkdir(exist_ok=True)
    (repo / "tools" / "added.py").write_text("def added_while_offline():\n    return 7\n")


@pytest.fixture(params=["data-dir", "postgres"])
def store(request: pytest.FixtureRequest) -> str | None:
    """Where the server keeps the workspace: its data dir, or a PostgreSQL database of
    the test's own (skipped where none can be started)."""
    if request.param == "data-dir":
        return None
    return other_database(request.getfixturevalue("pg_url"),
                          f"codeveil_offline_{secrets.token_hex(4)}")


@pytest.mark.parametrize("killed", [False, True], ids=["clean", "kill-9"])
def test_offline_index_then_catch_up(tmp_path: Path, killed: bool, store: str | None,
                                     server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data", store=store)
    env = _env(tmp_path, "alice")
    repo = write_repo(tmp_path / "repo")
    if killed:
        _many_files(repo, 300)
    _ok(["init", "--server", server.url], repo, env)
    _ok(["index", "--wait", "-q"], repo, env)

    server.stop()
    _edit_delete_add(repo)
    if killed:
        for i in range(0, 300, 2):  # more work offline, for the kill to land in
            (repo / "pkg" / f"mod{i:03d}.py").write_text(
                f"def changed_{i}(x):\n    return x - {i}\n")
        _killed_mid_way(["index", "--wait", "-q"], repo, env)
    offline = _ok(["index", "--wait", "--json"], repo, env)
    _offline_line(offline)
    report = json.loads(offline.stdout)
    assert report["offline"] and report["files_deleted"] == (0 if killed else 1)
    _local_vectors_cover(repo, env, "net/upload.py", "offline_edited_helper")
    _local_vectors_cover(repo, env, "tools/added.py", "added_while_offline")
    # Searched with the server still down: the edit is found, the deleted file is not.
    found = _ok(["search", "sorted records helper", "--json", "-k", "3"], repo, env)
    hits = json.loads(found.stdout)["hits"]
    assert hits[0]["path"] == "net/upload.py" and "offline_edited_helper" in hits[0]["text"]
    assert all(h["path"] != "auth/password.py" for h in hits)
    assert found.stderr == ""  # a read asks no server, and says nothing of it

    server.start()  # same port, same data
    if killed:
        _killed_mid_way(["index", "--wait", "-q"], repo, env)
    caught_up = json.loads(_ok(["index", "--wait", "--json"], repo, env).stdout)
    assert not caught_up["offline"]
    if not killed:
        # The edit and the added file, no more; the deleted file's leaf went.
        assert caught_up["files_changed"] == 2 and caught_up["chunks_embedded"] == 0
    hits = json.loads(_ok(["search", "offline_edited_helper", "--json", "-k", "1"],
                          repo, env).stdout)["hits"]
    assert hits[0]["path"] == "net/upload.py"
    _teammate_pulls_exactly(tmp_path, repo, server.url, env)


def test_a_first_index_with_the_server_down_builds_here_and_syncs_later(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    env = _env(tmp_path, "alice")
    repo = write_repo(tmp_path / "repo")
    _ok(["init", "--server", server.url], repo, env)  # the workspace exists, empty
    server.stop()
    first = _ok(["index", "--wait", "--json"], repo, env)
    _offline_line(first)
    assert json.loads(first.stdout)["chunks_embedded"] > 0
    _local_vectors_cover(repo, env, "auth/password.py", "verify_password")

    # In the background too: the builder ends "offline", and says why.
    (repo / "net" / "upload.py").write_text(EDITED)
    background = _ok(["index", "-q"], repo, env)
    # The command says at once that the server did not answer, in one line.
    (line,) = [x for x in background.stderr.splitlines() if x.strip()]
    assert "unreachable" in line and "sent when the server answers" in line
    deadline = time.monotonic() + 60
    while True:
        state = json.loads((repo / ".codeveil" / "builder.json").read_text())
        if state["state"] not in ("starting", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert state["state"] == "offline" and "cannot reach server" in state["offline"]
    _local_vectors_cover(repo, env, "net/upload.py", "offline_edited_helper")

    server.start()
    caught_up = json.loads(_ok(["index", "--wait", "--json"], repo, env).stdout)
    assert caught_up["files_changed"] == 5 and caught_up["chunks_embedded"] == 0
    _teammate_pulls_exactly(tmp_path, repo, server.url, env)


def test_init_with_the_server_down_indexes_here_and_creates_the_workspace_later(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    server.stop()  # its port is known: the URL a user was given
    env = _env(tmp_path, "alice")
    repo = write_repo(tmp_path / "repo")
    init = _ok(["init", "--server", server.url], repo, env)
    assert "cannot reach server" in init.stderr
    first = _ok(["index", "--wait", "--json"], repo, env)
    _offline_line(first)
    _local_vectors_cover(repo, env, "auth/password.py", "verify_password")

    server.start()
    caught_up = json.loads(_ok(["index", "--wait", "--json"], repo, env).stdout)
    assert not caught_up["offline"]
    assert caught_up["files_changed"] == 5 and caught_up["chunks_embedded"] == 0
    assert not (repo / ".codeveil" / "create-on-server").exists()
    _teammate_pulls_exactly(tmp_path, repo, server.url, env)


def test_a_server_that_goes_away_mid_sync_leaves_the_index_updated_here(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    env = _env(tmp_path, "alice")
    repo = write_repo(tmp_path / "repo")
    _ok(["init", "--server", server.url], repo, env)
    _ok(["index", "--wait", "-q"], repo, env)
    _many_files(repo, 300)  # sent in one go once embedded: the server dies before that
    _edit_delete_add(repo)
    state = repo / ".codeveil" / "state.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "retrieval", "index", "--wait",
                             "--json"], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:  # the diff is done and the files are being read
        db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=5)
        try:
            pending = db.execute("SELECT count(*) FROM pending_files").fetchone()[0]
        finally:
            db.close()
        if pending:
            server.kill()
            break
        time.sleep(0.002)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    _offline_line(subprocess.CompletedProcess(proc.args, 0, out, err))
    assert json.loads(out)["offline"]
    _local_vectors_cover(repo, env, "net/upload.py", "offline_edited_helper")
    _local_vectors_cover(repo, env, "pkg/mod123.py", "handler_123_")

    server.start()
    caught_up = json.loads(_ok(["index", "--wait", "--json"], repo, env).stdout)
    assert caught_up["files_changed"] == 302 and caught_up["chunks_embedded"] == 0
    _teammate_pulls_exactly(tmp_path, repo, server.url, env)
