"""`codeveil index` returns with the words indexed and leaves the vectors to one
background builder per index (sync.builder, retrieval.vector_builder): real processes,
real files, the hashing embedder (the model is not what is under test)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from sync.builder import MAX_ATTEMPTS, Builder
from tests.test_cli import run


def _json(args: list[str], cwd: Path) -> dict:
    proc = run(args, cwd)
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
    assert out["searchable_now"] == ["words", "names", "structure"]
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
