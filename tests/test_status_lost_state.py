"""`codeveil status` does not hide a lost client state behind "0 files"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_cli import run


def test_status_after_losing_state_db_says_so_and_fails(sample_repo: Path) -> None:
    assert run(["index", "-q"], sample_repo).returncode == 0
    before = run(["status", "--json"], sample_repo)
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
