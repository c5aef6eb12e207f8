"""A checkout's copy is its own: search, status and the lookups of a sealed workspace
never ask its server. With the server up they send it no request (its log is read);
stopped, answering 500 to everything, or having revoked the teammate's token, they
answer the same, exit 0 and print nothing on stderr. `status --server` asks on demand.
A real server on loopback; the hashing embedder."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli_in_process import run_in_process
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess
from tests.test_offline_reads import FILES

READS = [["search", "retry failed requests"], ["def", "retry_failed_requests"],
         ["outline", "net/retry.py"], ["uses", "send_all"], ["grep", "retry_failed"],
         ["status"]]
REQUEST = re.compile(r"\b(GET|POST|PUT|DELETE) /v1/")


def _env(tmp: Path, who: str) -> dict[str, str]:
    return {"CODEVEIL_CONFIG_DIR": str(tmp / f"{who}-config"),
            "CODEVEIL_CACHE_DIR": str(tmp / f"{who}-cache"), "CODEVEIL_EMBEDDER": "hashing"}


def _indexed(tmp: Path, url: str, who: str = "alice") -> Path:
    repo = write_repo(tmp / who, FILES)
    env = _env(tmp, who)
    assert run_in_process(["init", "--server", url], repo, **env).returncode == 0
    made = run_in_process(["index", "--wait", "-q"], repo, **env)
    assert made.returncode == 0, made.stderr
    return repo


def _answers(repo: Path, env: dict[str, str]) -> list[dict]:
    """Each read's --json answer, checked to exit 0 and say nothing on stderr."""
    out = []
    for args in READS:
        result = run_in_process([*args, "--json"], repo, **env)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stderr == "", (args, result.stderr)
        answer = json.loads(result.stdout)
        answer.pop("builder", None)
        answer.pop("seconds", None)
        out.append(answer)
    return out


def _requests(server: ServerProcess) -> int:
    """The requests in the server's log, once it has stopped growing (a line is written
    after its answer is sent, and a loaded machine writes it late)."""
    count = -1
    while True:
        seen = len(REQUEST.findall(server.log_text()))
        if seen == count:
            return count
        count = seen
        time.sleep(0.5)


def test_reads_send_the_server_no_request(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server.url)
    before = _requests(server)
    assert before > 0  # the log counts requests: the index's are there
    answers = _answers(repo, _env(tmp_path, "alice"))
    assert "net/retry.py" in {h["path"] for h in answers[0]["hits"]}
    assert _requests(server) == before, server.log_text()[-2000:]
    # On demand, status asks: the store's counts, and its tree of this checkout.
    asked = run_in_process(["status", "--server", "--json"], repo, **_env(tmp_path, "alice"))
    assert asked.returncode == 0, asked.stderr
    out = json.loads(asked.stdout)
    assert out["server_tree"]["in_step"] is True and out["server_rows"] >= out["chunks"]
    assert _requests(server) > before


class _Failing(http.server.BaseHTTPRequestHandler):
    def _fail(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = _fail

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _answering_500(port: int) -> Iterator[None]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("outage", ["stopped", "500"])
def test_reads_answer_the_same_whatever_the_server_does(
        tmp_path: Path, server_factory: Callable[..., ServerProcess], outage: str) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server.url)
    env = _env(tmp_path, "alice")
    online = _answers(repo, env)
    server.stop()
    if outage == "stopped":
        assert _answers(repo, env) == online
    else:
        with _answering_500(server.port):
            assert _answers(repo, env) == online


def test_a_revoked_teammate_keeps_searching_their_copy(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    alice = _indexed(tmp_path, server.url)
    env = _env(tmp_path, "alice")
    invite = run_in_process(["invite"], alice, **env)
    token_id = re.search(r"--revoke ([0-9a-f]{16})", invite.stderr)
    assert invite.returncode == 0 and token_id, invite.stderr
    bob, bob_env = tmp_path / "bob", _env(tmp_path, "bob")
    shutil.copytree(alice, bob, ignore=shutil.ignore_patterns(".codeveil"))
    joined = run_in_process(["join", invite.stdout.strip(), str(bob)], tmp_path, **bob_env)
    assert joined.returncode == 0, joined.stderr
    before = _answers(bob, bob_env)
    assert run_in_process(["invite", "--revoke", token_id.group(1)], alice,
                          **env).returncode == 0
    assert _answers(bob, bob_env) == before
    # A sync, and status --server, are refused with the server's word.
    assert run_in_process(["index", "--wait", "-q"], bob, **bob_env).returncode == 1
    assert run_in_process(["status", "--server"], bob, **bob_env).returncode == 1
