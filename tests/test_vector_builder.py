"""`codeveil index` returns with the words indexed and leaves the vectors to one
background builder per index (sync.daemon.builder, retrieval.indexes.vector_builder): real
processes, real files, the hashing embedder (the model is not what is under test)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from indexer.embed_cache import EmbeddingCache, cache_key
from indexer.embedder import HashingEmbedder
from indexer.local_chunks import LocalChunks, open_state_db
from sync.checkout.config import load_config, state_path
from sync.daemon.builder import MAX_ATTEMPTS, Builder, BuilderState
from sync.daemon.target import WorkspaceSync
from sync.workspace.workspace import Workspace
from tests.conftest import write_repo
from tests.test_cli import run


def _json(args: list[str], cwd: Path, **env: str) -> dict:
    proc = run(args, cwd, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _wait_built(repo: Path, timeout: float = 90.0) -> dict:
    """`status --json`'s builder once it is no longer running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        builder = _json(["status", "--json"], repo)["builder"]
        if not builder["running"]:
            return builder
        time.sleep(0.2)
    raise AssertionError(f"the builder still runs after {timeout} s: {builder}")


def test_index_returns_with_the_words_and_the_builder_brings_the_vectors(
        sample_repo: Path) -> None:
    out = _json(["index", "--json"], sample_repo)
    assert out["files_changed"] == 5 and out["chunks_total"] > 0
    assert out["chunks_embedded"] == 0  # the model's work was left to the builder
    assert out["searchable_now"] == ["words", "names", "structure", "static meaning"]
    assert out["vectors"]["chunks_with_vectors"] == 0
    assert out["vectors"]["builder"]["pid"] > 0

    # Searchable by name at once, and saying the index is partial until the vectors land.
    found = _json(["search", "verify_password", "--json", "-k", "1"], sample_repo)
    assert found["hits"][0]["path"] == "auth/password.py"

    builder = _wait_built(sample_repo)
    assert builder["state"] == "done" and builder["attempts"] == 0
    assert builder["chunks_done"] == builder["chunks_todo"] == out["chunks_total"]
    after = _json(["search", "verify password digest", "--json", "-k", "1"], sample_repo)
    assert after["index"] == {"partial": False, "chunks": out["chunks_total"],
                              "chunks_with_vectors": out["chunks_total"]}
    status = run(["status"], sample_repo)
    assert "builder: done" in status.stdout

    # Nothing changed: nothing to chunk, and the builder's pass finds nothing to do.
    again = _json(["index", "--json"], sample_repo)
    assert again["files_changed"] == 0 and "vectors" in again["searchable_now"]
    assert _wait_built(sample_repo)["state"] == "done"


def test_a_second_index_leaves_the_running_builder_and_asks_for_another_pass(
        sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    builder = Builder(sample_repo)
    before = builder.state()
    (sample_repo / "auth" / "tokens.py").write_text("def mint_token():\n    return 1\n")
    with builder.hold() as held:  # what a running builder holds
        assert held and builder.running()
        out = _json(["index", "--json"], sample_repo)
        assert out["files_changed"] == 1
        assert out["vectors"]["builder"]["running"]
        assert builder.files.again.exists()  # the running one is asked for a pass
        assert builder.state() == before  # and no second builder was started
    # The pass is taken by whoever builds next.
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    found = _json(["search", "mint_token", "--json", "-k", "1"], sample_repo)
    assert found["hits"][0]["path"] == "auth/tokens.py"
    assert not found["index"]["partial"]


def test_a_builder_that_dies_three_times_is_given_up_and_doctor_says_so(
        sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    (sample_repo / "auth" / "tokens.py").write_text("def mint_token():\n    return 1\n")
    builder = Builder(sample_repo)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        pid = builder.start()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # started by this process: reaped here
        state = builder.state()
        assert state is not None and state.attempts == attempt
        assert not builder.running()
    assert builder.start() is None
    assert builder.given_up() is not None

    out = run(["index"], sample_repo)
    assert out.returncode == 0, out.stderr
    assert "given up" in out.stdout
    doctor = run(["doctor"], sample_repo)
    assert "vector builder was given up" in doctor.stdout

    # A foreground index builds the vectors and lets a builder start again.
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    assert builder.given_up() is None
    assert run(["index", "-q"], sample_repo).returncode == 0
    assert _wait_built(sample_repo)["state"] == "done"


def _builder_environ(root: Path) -> dict[str, str]:
    """The environment of a builder started for `root` (read from /proc, then killed)."""
    root.mkdir()
    pid = Builder(root).start()  # returns once the builder's program runs: its own env
    assert pid is not None
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_the_builder_embeds_on_one_thread_unless_the_user_says_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEVEIL_EMBED_THREADS", raising=False)
    assert _builder_environ(tmp_path / "default")["CODEVEIL_EMBED_THREADS"] == "1"
    # The process that started it (a foreground index) keeps a thread per core.
    assert "CODEVEIL_EMBED_THREADS" not in os.environ
    monkeypatch.setenv("CODEVEIL_EMBED_THREADS", "2")
    assert _builder_environ(tmp_path / "told")["CODEVEIL_EMBED_THREADS"] == "2"


def _pending_files(repo: Path) -> int:
    db = sqlite3.connect(f"file:{repo / '.codeveil' / 'state.sqlite'}?mode=ro", uri=True,
                         timeout=5)
    try:
        return int(db.execute("SELECT count(*) FROM pending_files").fetchone()[0])
    finally:
        db.close()


def _cached_vectors(repo: Path, cache_dir: Path) -> dict[str, bytes]:
    """embedded text -> the bytes of the vector this machine's cache holds for it."""
    config = load_config(repo)
    db = open_state_db(state_path(repo))
    cache = EmbeddingCache(cache_dir / "embeddings.sqlite")
    try:
        keys = {c.embed_text: cache_key(config.model_id, c.embed_text)
                for _, c in LocalChunks(db).iter_all()}
        found = cache.get_many(list(keys.values()), config.dim)
        return {text: found[key].tobytes() for text, key in keys.items() if key in found}
    finally:
        cache.close()
        db.close()


def test_a_builder_killed_mid_way_resumes_to_the_same_vectors(tmp_path: Path) -> None:
    files = {f"pkg/mod{i:04d}.py": "".join(
        f"def handler_{i}_{j}(value):\n    \"\"\"Handle case {j} of module {i}.\"\"\"\n"
        f"    return value * {j} + {i}\n\n\n" for j in range(12)) for i in range(1500)}
    killed_repo = write_repo(tmp_path / "killed", files)
    whole_repo = write_repo(tmp_path / "whole", files)
    killed_env = {"CODEVEIL_CONFIG_DIR": str(tmp_path / "k-config"),
                  "CODEVEIL_CACHE_DIR": str(tmp_path / "k-cache")}
    whole_env = {"CODEVEIL_CONFIG_DIR": str(tmp_path / "w-config"),
                 "CODEVEIL_CACHE_DIR": str(tmp_path / "w-cache")}

    assert run(["index", "-q"], killed_repo, **killed_env).returncode == 0
    builder = Builder(killed_repo)
    total = _pending_files(killed_repo)
    deadline = time.monotonic() + 120
    while True:  # kill it once some files have their vectors and others do not
        assert time.monotonic() < deadline, "the builder never got going"
        st = builder.state()
        left = _pending_files(killed_repo)
        if st is not None and st.state == "running" and 0 < left < total:
            os.kill(st.pid, signal.SIGKILL)
            break
        assert st is None or st.state in ("starting", "running"), st
        time.sleep(0.005)
    for _ in range(100):
        if not builder.running():
            break
        time.sleep(0.05)
    assert not builder.running()
    mid = _json(["status", "--json"], killed_repo, **killed_env)
    assert mid["builder"]["state"] == "running" and not mid["builder"]["running"]
    assert mid["server_rows"] == 0  # sealed rows are sent once every file is embedded

    # The next run resumes where the cache stops: what was embedded is not again.
    resumed = json.loads(run(["index", "--wait", "--json"], killed_repo,
                             **killed_env).stdout)
    assert resumed["chunks_from_cache"] > 0
    assert 0 < resumed["chunks_embedded"] < resumed["chunks_total"]
    whole = json.loads(run(["index", "--wait", "--json"], whole_repo, **whole_env).stdout)
    assert whole["chunks_embedded"] == whole["chunks_total"] == resumed["chunks_total"]

    k_status = _json(["status", "--json"], killed_repo, **killed_env)
    w_status = _json(["status", "--json"], whole_repo, **whole_env)
    assert k_status["server_rows"] == w_status["server_rows"] > 0
    assert k_status["chunks"] == w_status["chunks"]
    mine = _cached_vectors(killed_repo, tmp_path / "k-cache")
    theirs = _cached_vectors(whole_repo, tmp_path / "w-cache")
    assert len(mine) == resumed["chunks_total"] and mine == theirs
    query = ["search", "handle case 7 of module 42", "--json", "-k", "5"]
    k_hits = json.loads(run(query, killed_repo, **killed_env).stdout)
    w_hits = json.loads(run(query, whole_repo, **whole_env).stdout)
    assert not k_hits["index"]["partial"] and not w_hits["index"]["partial"]
    # The clear winner is the same; ties further down follow each table's row order.
    assert k_hits["hits"][0]["path"] == w_hits["hits"][0]["path"] == "pkg/mod0042.py"


def test_daemon_stop_stops_the_builder_and_the_next_index_resumes(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", {f"pkg/mod{i:04d}.py": "".join(
        f"def step_{i}_{j}(value):\n    return value - {j}\n\n\n" for j in range(12))
        for i in range(1500)})
    assert run(["index", "-q"], repo).returncode == 0
    builder = Builder(repo)
    deadline = time.monotonic() + 60
    while (st := builder.state()) is None or st.state != "running":  # its SIGTERM handler set
        assert time.monotonic() < deadline and (st is None or st.state == "starting"), st
        time.sleep(0.01)
    stopped = run(["daemon", "stop"], repo)
    assert stopped.returncode == 0, stopped.stderr
    assert "vector builder stopped" in stopped.stdout
    st = builder.state()
    assert st is not None and st.state == "stopped" and st.attempts == 0
    assert not builder.running()
    resumed = json.loads(run(["index", "--wait", "--json"], repo).stdout)
    assert resumed["chunks_total"] > 0
    found = _json(["search", "step_42_7", "--json", "-k", "1"], repo)
    assert found["hits"][0]["path"] == "pkg/mod0042.py" and not found["index"]["partial"]


def test_a_daemon_sync_leaves_a_running_builder_alone_and_asks_it_for_a_pass(
        sample_repo: Path, hashing_embedder: HashingEmbedder) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    (sample_repo / "auth" / "tokens.py").write_text("def mint_token():\n    return 1\n")
    target = WorkspaceSync(Workspace(sample_repo, embedder=hashing_embedder))
    builder = Builder(sample_repo)
    try:
        with builder.hold() as held:  # what a running builder holds
            assert held
            report = target.sync()
            assert report.files_changed == 0  # no second sync beside the builder
            assert builder.files.again.exists()
        report = target.sync()
        assert report.files_changed == 1
    finally:
        target.close()


def test_index_wait_stops_a_running_builder_and_finishes_in_the_foreground(
        tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", {f"pkg/mod{i:04d}.py": "".join(
        f"def task_{i}_{j}(value):\n    return value + {j}\n\n\n" for j in range(12))
        for i in range(1500)})
    assert run(["index", "-q"], repo).returncode == 0
    builder = Builder(repo)
    deadline = time.monotonic() + 60
    while (st := builder.state()) is None or st.state != "running":
        assert time.monotonic() < deadline and (st is None or st.state == "starting"), st
        time.sleep(0.01)
    waited = json.loads(run(["index", "--wait", "--json"], repo).stdout)
    assert waited["chunks_total"] > 0
    st = builder.state()
    # Stopped by the foreground sync, which did its work: nothing is left to build.
    assert st is not None and st.state == "done" and not builder.running()
    found = _json(["search", "task_42_7", "--json", "-k", "1"], repo)
    assert found["hits"][0]["path"] == "pkg/mod0042.py" and not found["index"]["partial"]


def test_a_daemon_leaves_a_large_change_to_the_builder_and_embeds_an_edit_itself(
        tmp_path: Path, hashing_embedder: HashingEmbedder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_EMBEDDER", "hashing")  # the builder this starts
    def body(name: str, i: int) -> str:  # functions long enough to be chunks of their own
        return "".join(f"def {name}_{i}_{j}(value):\n" + "".join(
            f"    value = value * {j} + {k}\n" for k in range(25)) + "    return value\n\n\n"
            for j in range(4))

    repo = write_repo(tmp_path / "repo", {f"pkg/mod{i:04d}.py": body("part", i)
                                          for i in range(100)})
    target = WorkspaceSync(Workspace(repo, embedder=hashing_embedder))
    builder = Builder(repo)
    try:
        # Start-up on a folder never indexed: 400 chunks wait, more than a sync embeds.
        first = target.sync()
        assert first.files_changed == 100 and first.chunks_embedded == 0
        found = _json(["search", "part_42_3", "--json", "-k", "1"], repo)
        assert found["hits"][0]["path"] == "pkg/mod0042.py"  # by its name, at once
        built = _wait_built(repo)
        assert built["state"] == "done" and built["chunks_done"] == built["chunks_todo"] > 0
        # An edit of one file: embedded in the daemon's own sync, no builder started.
        (repo / "pkg" / "mod0003.py").write_text("def renamed(value):\n    return 0\n")
        edit = target.sync(changed=1)
        assert edit.files_changed == 1 and edit.chunks_embedded == 1
        assert builder.state() is not None and builder.state().started == built["started"]
        # A branch switch's worth of paths goes to the builder again.
        for i in range(10, 80):
            (repo / "pkg" / f"mod{i:04d}.py").write_text(body("other", i))
        switch = target.sync(changed=70)
        assert switch.chunks_embedded == 0 and switch.files_changed == 70
        assert _wait_built(repo)["state"] == "done"
        after = _json(["search", "other_33_2", "--json", "-k", "1"], repo)
        assert after["hits"][0]["path"] == "pkg/mod0033.py" and not after["index"]["partial"]
    finally:
        target.close()


def test_a_wait_after_the_quick_start_counts_no_change_and_leaves_the_builder_done(
        sample_repo: Path) -> None:
    builder = Builder(sample_repo)
    builder.files.dir.mkdir(parents=True)
    builder.files.failed.write_text("held back by the test\n")  # no builder races the wait
    first = run(["index"], sample_repo)
    assert first.stdout.startswith("5 files scanned, 5 changed,"), first.stdout
    # What a builder stopped by the foreground sync (SIGTERM) leaves behind.
    st = builder.state() or BuilderState()
    st.state = "stopped"
    builder.write(st)

    wait = run(["index", "--wait", "-q"], sample_repo)
    assert wait.returncode == 0, wait.stderr
    # The words pass chunked every file: nothing changed since, the five were only sent.
    assert wait.stdout.startswith("5 files scanned, 0 changed, 0 deleted, 0 skipped;"
                                  " 5 sent to the store;"), wait.stdout
    status = run(["status"], sample_repo)
    assert "builder: done" in status.stdout, status.stdout
    assert "stopped" not in status.stdout


def test_status_says_the_builder_prepares_before_its_first_chunk(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    builder = Builder(sample_repo)
    with builder.hold() as held:  # what a running builder holds
        assert held
        builder.write(BuilderState(state="running", pid=os.getpid(), chunks_todo=7116))
        preparing = run(["status"], sample_repo).stdout
        builder.write(BuilderState(state="running", pid=os.getpid(), chunks_todo=7116,
                                   chunks_done=64))
        first_batch = run(["status"], sample_repo).stdout
    assert "preparing (loading the model); 7116 chunks to build" in preparing, preparing
    assert "0.0/s" not in preparing and "0 of 7116" not in preparing
    assert "64 of 7116 chunks, no rate yet" in first_batch, first_batch
