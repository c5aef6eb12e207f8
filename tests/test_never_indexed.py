"""A folder set up for codeveil whose first index never finished (`codeveil init` alone,
or a first `codeveil index` that stopped) says so and what to run: never that a file is
corrupt, never an empty answer that reads as "nothing matches"."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo

READS = [["def", "alpha"], ["outline", "a.py"], ["uses", "alpha"], ["grep", "alpha"],
         ["search", "alpha"], ["status"]]


@pytest.fixture
def set_up_only(tmp_path: Path) -> Path:
    repo = write_repo(tmp_path / "repo", {"a.py": "def alpha():\n    return 1\n"})
    Index(repo, embedder=HashingEmbedder()).init()
    return repo


@pytest.mark.parametrize("args", READS, ids=lambda a: a[0])
def test_a_read_of_a_never_completed_index_says_what_to_run(
        set_up_only: Path, args: list[str]) -> None:
    result = run_in_process(args, set_up_only)
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "was never completed" in last and "run `codeveil index" in last, result.stderr
    assert "corrupt" not in result.stderr


def test_after_the_index_completes_the_reads_answer(set_up_only: Path) -> None:
    assert run_in_process(["index"], set_up_only).returncode == 0
    for args in READS:
        result = run_in_process(args, set_up_only)
        assert result.returncode == 0, (args, result.stderr)


def test_an_empty_folder_indexed_to_the_end_is_no_error(tmp_path: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    assert run_in_process(["index"], repo).returncode == 0
    result = run_in_process(["def", "alpha"], repo)
    assert result.returncode == 0 and "no definition of alpha" in result.stderr
