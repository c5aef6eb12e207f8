"""`codeveil status` does not hide a lost client state behind "0 files"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_in_process import run_in_process
from tests.test_cli import run


def test_status_after_losing_state_db_says_so_and_fails(sample_repo: Path) -> None:
    # Set up in-process; the failing status runs in a real process, as a user meets it.
    assert run_in_process(["index", "--wait", "-q"], sample_repo).returncode == 0
    before = run_in_process(["status", "--json"], sample_repo)
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["files"] > 0
    for suffix in ("", "-wal", "-shm"):
        (sample_repo / f".codeveil/state.sqlite{suffix}").unlink(missing_ok=True)
    for args in (["status"], ["status", "--json"]):
        after = run(args, sample_repo)
        assert after.returncode != 0, after.stdout
        assert "Traceback" not in after.stderr
        lines = [ln for ln in after.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, after.stderr
        assert "state.sqlite is missing or empty" in lines[0]
        assert "codeveil index" in lines[0]


def test_a_long_lived_index_reads_a_replaced_state_file(tmp_path: Path) -> None:
    # Search keeps its connection to state.sqlite between queries; a state file deleted
    # and rebuilt meanwhile (by another process) must be read, not the deleted one.
    from indexer.embedder import HashingEmbedder
    from retrieval import Index
    from tests.conftest import write_repo

    repo = write_repo(tmp_path / "repo", {
        "alpha.py": "def alpha_function():\n    return 1\n"})
    with Index(repo, embedder=HashingEmbedder()) as served:
        served.index(wait=True)
        assert served.search("alpha_function", k=1)[0].path == "alpha.py"
        state = repo / ".codeveil" / "state.sqlite"
        for p in (state, state.with_name("state.sqlite-wal"), state.with_name("state.sqlite-shm")):
            p.unlink(missing_ok=True)
        (repo / "beta.py").write_text("def beta_function_renamed():\n    return 2\n")
        with Index(repo, embedder=HashingEmbedder()) as other:
            other.index(wait=True)
        hits = served.search("beta_function_renamed", k=2)
        assert hits and hits[0].path == "beta.py"
