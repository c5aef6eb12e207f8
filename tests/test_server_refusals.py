"""A server that answers with an error is not a server that cannot be reached: each
refusal says, in one line, what to do about it (sync.transport.http_advice). Reads ask no server
(tests/test_reads_ask_no_server.py): what asks is a sync and `status --server`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import find_root, load_config, token_path
from sync.crypto.keys import key_path
from sync.transport.http_client import HttpClient, ServerError, ServerUnavailable
from sync.wire import AuthError, PermissionDenied, WorkspaceExists, WorkspaceNotFound
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo


def _indexed(path: Path, url: str) -> tuple[Path, str]:
    repo = write_repo(path, {"a.py": "def alpha():\n    return 1\n"})
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.init(server=url)
        idx.index(wait=True)
    return repo, load_config(find_root(repo)).workspace_id


def _one_error_line(args: list[str], repo: Path) -> str:
    result = run_in_process(args, repo)
    assert result.returncode == 1, (args, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "unreachable" not in lines[0] and "cannot reach" not in lines[0]
    return lines[0]


def test_a_token_the_server_refuses_says_where_the_token_goes(
        tmp_path: Path, server_url: str) -> None:
    repo, workspace = _indexed(tmp_path / "repo", server_url)
    token_path(workspace).write_text("not-the-token")
    for args in (["status", "--server"], ["index"]):
        line = _one_error_line(args, repo)
        assert "(HTTP 401 from" in line and str(token_path(workspace)) in line, line
        assert "CODEVEIL_TOKEN" in line
    assert run_in_process(["search", "alpha"], repo).returncode == 0  # asks nothing


def test_another_workspaces_token_says_so(tmp_path: Path, server_url: str) -> None:
    repo, workspace = _indexed(tmp_path / "repo", server_url)
    _other, other_ws = _indexed(tmp_path / "other", server_url)
    token_path(workspace).write_text(token_path(other_ws).read_text())
    line = _one_error_line(["index"], repo)
    assert "(HTTP 403 from" in line and "is another workspace's" in line, line
    assert str(token_path(workspace)) in line


def test_a_workspace_the_server_does_not_hold_says_what_to_do(
        tmp_path: Path, server_url: str) -> None:
    # A valid token and key under an id the server has no workspace of (a config
    # pointed at a workspace since removed, or mistyped): 404.
    repo, workspace = _indexed(tmp_path / "repo", server_url)
    gone = "f" * 32
    config_file = repo / ".codeveil" / "config.json"
    config_file.write_text(config_file.read_text().replace(workspace, gone))
    token_path(gone).write_text(token_path(workspace).read_text())
    key_path(gone).write_bytes(key_path(workspace).read_bytes())
    key_path(gone).chmod(0o600)
    line = _one_error_line(["status", "--server"], repo)
    assert "(HTTP 404 from" in line and f"workspace {gone} is not on this server" in line
    assert "codeveil init --server" in line


def test_a_taken_workspace_id_says_how_to_join_it(tmp_path: Path, server_url: str) -> None:
    _repo, workspace = _indexed(tmp_path / "repo", server_url)
    with pytest.raises(WorkspaceExists, match="HTTP 409") as caught:
        HttpClient.create_workspace(server_url, workspace, dim=384, model_id="m",
                                    key_check=b"\0" * 16)
    assert "join it with `codeveil init --server" in str(caught.value)


class _Answers(BaseHTTPRequestHandler):
    status = 500

    def do_GET(self) -> None:
        body = json.dumps({"error": "something broke"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Callable[[int], str]]:
    """A plain HTTP server (not codeveil's) that answers every request with one status."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int) -> str:
        handler = type("Handler", (_Answers,), {"status": status})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(("status", "error", "says"), [
    (401, AuthError, "is not one the server accepts"),
    (403, PermissionDenied, "is another workspace's"),
    (404, WorkspaceNotFound, "is not on this server"),
    (500, ServerError, "failed on its side; retry later"),
    (503, ServerUnavailable, "unavailable (503): something broke; retry later"),
])
def test_each_status_reads_as_what_it_is(answering: Callable[[int], str], status: int,
                                          error: type[Exception], says: str) -> None:
    url = answering(status)
    with HttpClient(url, "ws1", "tok") as client, pytest.raises(error) as caught:
        client.info()
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert "cannot reach" not in message
    if status in (502, 503, 504):
        assert isinstance(caught.value, ServerUnavailable) and caught.value.status == status
