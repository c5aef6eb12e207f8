"""The `codeveil` command, run as a user runs it: a real process, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from retrieval.faces.cli import main as cli_main

INDEX_KEYS = {"files_scanned", "files_changed", "files_deleted", "chunks_total",
              "chunks_embedded", "chunks_from_cache", "seconds"}
HIT_KEYS = {"path", "start_line", "end_line", "symbol", "language", "kind", "score", "text"}


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, CODEVEIL_EMBEDDER="hashing", **env)
    return subprocess.run(
        [sys.executable, "-m", "retrieval", *args], cwd=cwd, env=full_env,
        capture_output=True, text=True, timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("codeveil: error:")
    assert needle in lines[0], lines[0]


def test_index_json_then_search_json(sample_repo: Path) -> None:
    proc = run(["index", "--wait", ".", "--json"], sample_repo)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert set(summary) >= INDEX_KEYS
    assert summary["files_scanned"] == 5 and summary["chunks_total"] > 0
    proc = run(["search", "hash_password salt pbkdf2", "--json", "-k", "3"], sample_repo)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["index"] == {"partial": False, "chunks": summary["chunks_total"],
                            "chunks_with_vectors": summary["chunks_total"]}
    hits = out["hits"]
    assert hits and set(hits[0]) >= HIT_KEYS
    assert hits[0]["path"] == "auth/password.py"


def test_index_json_shows_where_the_time_goes(sample_repo: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "own-cache")  # the shared cache would answer every chunk
    summary = json.loads(run(["index", "--wait", ".", "--json"], sample_repo,
                             CODEVEIL_CACHE_DIR=cache).stdout)
    stages = ("seconds_walk", "seconds_chunk", "seconds_embed", "seconds_encrypt",
              "seconds_sync")
    assert all(summary[k] > 0 for k in stages), summary
    assert summary["chunks_embedded"] > 0
    # Seconds are rounded to 0.1 ms in the JSON, and the hashing model is that fast.
    n, s = summary["chunks_embedded"], summary["seconds_embed"]
    assert n / (s + 5e-5) * 0.99 <= summary["embed_chunks_per_s"] <= n / max(s - 5e-5, 1e-9)
    # Nothing embedded on a re-index: no rate to claim.
    again = json.loads(run(["index", "--wait", ".", "--json"], sample_repo,
                           CODEVEIL_CACHE_DIR=cache).stdout)
    assert again["chunks_embedded"] == 0 and again["embed_chunks_per_s"] == 0


def test_search_prints_locations_and_snippets(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    proc = run(["search", "hash_password salt", "-k", "2", "--lang", "python"],
               sample_repo / "auth")
    assert proc.returncode == 0, proc.stderr
    assert "auth/password.py:" in proc.stdout
    assert "hash_password" in proc.stdout


def test_status_and_key_commands(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    status = json.loads(run(["status", "--json"], sample_repo).stdout)
    assert status["server"] == "embedded" and status["chunks"] > 0
    shown = run(["key", "show"], sample_repo)
    assert shown.returncode == 0 and "fingerprint" in shown.stdout
    exported = run(["key", "export"], sample_repo)
    assert exported.returncode == 0
    text = exported.stdout.strip()
    assert text.startswith("codeveil-key-v1:")
    # The key is a secret: `show` prints only its fingerprint.
    assert text.split(":", 1)[1] not in shown.stdout
    again = run(["key", "import", text], sample_repo)
    assert again.returncode == 0, again.stderr


def test_no_such_path(tmp_path: Path) -> None:
    assert_one_line_error(run(["index", "--wait", str(tmp_path / "missing")], tmp_path), "missing")


def test_no_index_here(tmp_path: Path) -> None:
    assert_one_line_error(run(["search", "anything"], tmp_path), "no codeveil index")


def test_wrong_key(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    assert_one_line_error(
        run(["search", "password"], sample_repo, CODEVEIL_KEY="11" * 32), "key"
    )


def test_corrupt_state_db(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    (sample_repo / ".codeveil/state.sqlite").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (sample_repo / f".codeveil/state.sqlite{suffix}").unlink(missing_ok=True)
    assert_one_line_error(run(["index", "--wait"], sample_repo), "corrupt")


def test_corrupt_config(sample_repo: Path) -> None:
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    (sample_repo / ".codeveil/config.json").write_text("{not json")
    assert_one_line_error(run(["search", "x"], sample_repo), "config.json")


def test_bad_option_values_are_usage_errors(sample_repo: Path) -> None:
    proc = run(["search", "x", "-k", "0"], sample_repo)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        yield f"{prefix}{name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")


@pytest.mark.parametrize("name", [n for n, _ in _commands(cli_main)])
def test_every_command_has_help(name: str) -> None:
    cmd = dict(_commands(cli_main))[name]
    assert cmd.help and len(cmd.help.strip()) > 20, name


def test_two_processes_initialising_one_folder_end_with_one_workspace(tmp_path: Path) -> None:
    from sync.checkout.config import load_config, store_path
    from sync.store import Store
    from tests.conftest import write_repo

    # Both start at once; creating a workspace takes seconds, so they overlap.
    for trial in range(1):
        repo = write_repo(tmp_path / f"repo{trial}")
        env = dict(os.environ, CODEVEIL_EMBEDDER="hashing")
        procs = [subprocess.Popen([sys.executable, "-m", "retrieval", "index", "--wait", "-q"],
                                  cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for proc in procs:
            assert proc.wait(120) == 0, proc.stderr.read()
            proc.stderr.close()
        with Store(store_path(repo)) as store:
            assert store.workspace_ids() == [load_config(repo).workspace_id]
        keys = list((Path(os.environ["CODEVEIL_CONFIG_DIR"]) / "keys").glob("*.key"))
        assert len(keys) == trial + 1  # one per folder
        found = run(["search", "retry failed uploads", "--json"], repo)
        assert found.returncode == 0, found.stderr
        assert json.loads(found.stdout)


@pytest.mark.parametrize(("field", "bad", "needle"), [
    ("workspace_id", "../../etc", "workspace_id '../../etc' is not a workspace id"),
    ("dim", "384", "dim '384' is not a positive integer"),
    ("dim", 385, "dim is 385 but workspace"),
    ("model_id", "another-model", "model_id is 'another-model' but workspace"),
])
def test_hand_edited_config_values_are_named(sample_repo: Path, field: str, bad: object,
                                             needle: str) -> None:
    from indexer.embedder import HashingEmbedder
    from retrieval import Index
    from sync.checkout.config import ConfigError

    with Index(sample_repo, embedder=HashingEmbedder()) as idx:  # as CODEVEIL_EMBEDDER does
        idx.index(wait=True)
    path = sample_repo / ".codeveil/config.json"
    config = json.loads(path.read_text())
    config[field] = bad
    path.write_text(json.dumps(config))
    proc = run(["search", "password"], sample_repo)
    assert_one_line_error(proc, needle)
    assert "config.json" in proc.stderr
    with Index(sample_repo, embedder=HashingEmbedder()) as idx, pytest.raises(
        ConfigError, match=r"config\.json"
    ):
        idx.index(wait=True)


def test_progress_bar_shows_stages_and_embed_rate(sample_repo: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer.embedder import HashingEmbedder
    from retrieval.faces.api import Index

    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "own-cache"))
    hashing_embedder = HashingEmbedder()
    from retrieval.faces.cli import _RichProgress

    with _RichProgress() as bar, Index(sample_repo, embedder=hashing_embedder) as idx:
        report = idx.index(wait=True, progress=bar)
    assert report.chunks_embedded > 0
    for stage in ("walk", "chunk", "embed", "encrypt", "sync"):
        assert f"{stage} " in bar.where, bar.where
    assert bar.rate == pytest.approx(report.embed_chunks_per_s)
    assert "/s" in bar.bar.tasks[0].fields["detail"]


@pytest.mark.parametrize("args", [["status"], ["search", "password hash"], ["grep", "def"],
                                  ["uses", "hash_password"], ["outline", "auth/password.py"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(
        sample_repo: Path, args: list[str]) -> None:
    # `codeveil status | head -1`: an unexpected BrokenPipeError and exit 1 (search: exit 1).
    assert run(["index", "--wait", "-q"], sample_repo).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "retrieval", *args], cwd=sample_repo,
                            env=dict(os.environ, CODEVEIL_EMBEDDER="hashing"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes a byte: its first write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "error" not in err and "Traceback" not in err


@pytest.mark.parametrize(("server", "said"), [
    ("127.0.0.1:42443", "has no scheme; a codeveil server is reached over http(s):"
                        " --server https://127.0.0.1:42443"),
    ("ftp://127.0.0.1:42443", "is not an http(s) URL"),
    ("http://", "is not an http(s) URL"),
])
def test_init_refuses_a_server_that_is_not_an_http_url_before_writing(
        tmp_path: Path, server: str, said: str) -> None:
    # It wrote config.json and exited 0; only the next index refused.
    from tests.cli_in_process import run_in_process

    proc = run_in_process(["init", ".", "--server", server], tmp_path)
    assert proc.returncode == 1 and said in proc.stderr, proc.stderr
    assert not (tmp_path / ".codeveil").exists()


def test_a_server_that_is_not_codeveil_is_said_to_be_so(tmp_path: Path) -> None:
    # A plain web server answered `init --server` with its whole HTML 501 page and "the
    # server failed on its side; retry later".
    import http.server
    import threading

    from tests.cli_in_process import run_in_process

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # its log would land in the command's captured stderr

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}"
        proc = run_in_process(["init", ".", "--server", url], tmp_path)
    finally:
        web.shutdown()
        web.server_close()
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert f"{url} is not a codeveil server: it answered HTTP 501 with text/html" in line
    assert "<html" not in line.lower() and "retry later" not in line
