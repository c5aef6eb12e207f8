"""The two workspace modes through the public API and the CLI: sealed (the default;
search runs here) and server-search (the server ranks encrypted vectors)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from indexer.embedder import SentenceTransformerEmbedder
from retrieval import Index
from sync.checkout.config import load_config
from sync.records import MODE_SEALED, MODE_SERVER_SEARCH
from tests.cli_in_process import run_in_process
from tests.conftest import codeveil_env

QUERIES = ["retry failed uploads", "hash a password", "distance between two points"]


def _hits(idx: Index, query: str) -> list[tuple[str, int, int]]:
    return [(h.path, h.start_line, h.end_line) for h in idx.search(query, k=5)]


def test_both_modes_rank_alike(sample_repo: Path, tmp_path: Path,
                               real_embedder: SentenceTransformerEmbedder) -> None:
    # The server's candidates are re-ranked with this machine's plain vectors, so on a
    # repo this small the two modes must agree exactly, but for the header vectors' vote,
    # which only a sealed workspace casts (its vector index is on this machine).
    other = tmp_path / "server-search"
    shutil.copytree(sample_repo, other)
    with Index(sample_repo, embedder=real_embedder) as sealed, \
            Index(other, embedder=real_embedder) as ranked:
        sealed.index(wait=True)
        ranked.init(server_search=True)
        ranked.index(wait=True)
        assert sealed.mode == MODE_SEALED and ranked.mode == MODE_SERVER_SEARCH
        assert sealed.status()["mode"] == MODE_SEALED
        with_headers = {q: _hits(sealed, q) for q in QUERIES}
        sealed.search_options = replace(sealed.search_options, w_header_vector=0.0,
                                        w_header_vector_prose=0.0)
        for q in QUERIES:
            assert _hits(sealed, q) == _hits(ranked, q), q
        # With it the answers still agree on where each query's code is.
        assert all(with_headers[q][0][0] == _hits(ranked, q)[0][0] for q in QUERIES)


def test_the_cli_says_when_a_workspace_ranks_on_the_server(tmp_path: Path,
                                                           sample_repo: Path) -> None:
    # What the commands say runs in-process; the refusal, an error, in a real process.
    other = tmp_path / "other"
    shutil.copytree(sample_repo, other)
    made = run_in_process(["init", "--server-search"], other)
    assert made.returncode == 0, made.stderr
    assert "server-search" in made.stdout
    assert load_config(other).mode == MODE_SERVER_SEARCH
    indexed = run_in_process(["index", "--wait"], other)
    assert indexed.returncode == 0 and "ranks on the server" in indexed.stderr
    sealed = run_in_process(["index", "--wait"], sample_repo)
    assert sealed.returncode == 0 and "ranks on the server" not in sealed.stderr
    assert load_config(sample_repo).mode == MODE_SEALED
    elsewhere = tmp_path / "other2"
    elsewhere.mkdir()
    refused = subprocess.run(
        [sys.executable, "-m", "retrieval", "init", "--server", "http://127.0.0.1:9",
         "--workspace", "abc", "--server-search"], cwd=elsewhere,
        env=codeveil_env({"CODEVEIL_EMBEDDER": "hashing"}), capture_output=True, text=True,
        timeout=120)
    assert refused.returncode != 0 and "keeps its own mode" in refused.stderr


def test_a_config_written_before_modes_reads_as_server_search(sample_repo: Path) -> None:
    import json

    with Index(sample_repo) as idx:
        idx.init(server_search=True)
    path = sample_repo / ".codeveil" / "config.json"
    raw = json.loads(path.read_text())
    del raw["mode"]
    path.write_text(json.dumps(raw))
    assert load_config(sample_repo).mode == MODE_SERVER_SEARCH


@pytest.mark.parametrize("bad", ["plain", 3, ""])
def test_a_config_with_an_unknown_mode_is_named(sample_repo: Path, bad: object) -> None:
    import json

    from sync.checkout.config import ConfigError

    with Index(sample_repo) as idx:
        idx.init()
    path = sample_repo / ".codeveil" / "config.json"
    raw = json.loads(path.read_text())
    raw["mode"] = bad
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="mode"):
        load_config(sample_repo)
