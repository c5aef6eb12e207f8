"""With the server down, every read answers from this machine's copy, which it never
asked anyway (tests/test_reads_ask_no_server.py); what asks says so.

A real server on loopback is indexed against, then stopped (SIGTERM, as a laptop off the
VPN sees it: nothing answers); search, def, outline, uses, grep and status must exit 0
and print nothing on stderr; `status --server` prints one line naming the server and
when the copy last synced, and carries `offline` in --json. A server-search workspace,
which ranks on the server, refuses search in one line while its lookups still answer.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess

FILES = {
    "net/retry.py": """
        def retry_failed_requests(session, attempts=3):
            '''Send again the requests that failed, with backoff.'''
            for n in range(attempts):
                if send_all(session):
                    return True
            return False


        def send_all(session):
            return session.flush()
        """,
    "app.py": """
        from net.retry import retry_failed_requests


        def main(session):
            return retry_failed_requests(session)
        """,
}

NOTE = re.compile(r"^codeveil: server at http://127\.0\.0\.1:\d+ unreachable; answered from"
                  r" this machine's copy \(this copy last synced \d{4}-\d\d-\d\d \d\d:\d\d"
                  r" UTC\)$")

# Each read, and what its --json output must hold besides `offline`.
READS: list[tuple[list[str], Callable[[dict], bool]]] = [
    (["search", "retry failed requests"],
     lambda out: "net/retry.py" in {h["path"] for h in out["hits"]}),
    (["def", "retry_failed_requests"],
     lambda out: out["definitions"][0]["path"] == "net/retry.py"),
    (["outline", "net/retry.py"],
     lambda out: [s["name"] for s in out["symbols"]] == ["retry_failed_requests",
                                                         "send_all"]),
    (["uses", "send_all"], lambda out: out["references"][0]["path"] == "net/retry.py"),
    (["grep", "retry_failed"], lambda out: len(out["matches"]) == 3),
    (["status"], lambda out: out["files"] == 2 and out["server_chunks"] == 2),
]


def _indexed(tmp_path: Path, server: ServerProcess, *, server_search: bool = False) -> Path:
    repo = write_repo(tmp_path / "repo", FILES)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.init(server=server.url, server_search=server_search)
        idx.index(wait=True)
    return repo


def _server(backend: str, tmp_path: Path, server_factory: Callable[..., ServerProcess],
            request: pytest.FixtureRequest) -> ServerProcess:
    """A server on a data dir, or a replica on a PostgreSQL database of the test's own."""
    if backend == "data":
        return server_factory(tmp_path / "data")
    from tests.pg_fixtures import other_database

    url = other_database(request.getfixturevalue("pg_url"), "codeveil_offline_reads")
    return server_factory(tmp_path / "replica", store=url)


@pytest.mark.parametrize("backend", ["data", "postgres"])
def test_every_read_answers_offline_and_status_server_says_so(
        tmp_path: Path, server_factory: Callable[..., ServerProcess],
        request: pytest.FixtureRequest, backend: str) -> None:
    server = _server(backend, tmp_path, server_factory, request)
    repo = _indexed(tmp_path, server)
    online = run_in_process(["search", "retry failed requests", "--json"], repo)
    assert online.returncode == 0 and online.stderr == "", online.stderr
    assert "offline" not in json.loads(online.stdout)
    server.stop()
    for args, holds in READS:
        text = run_in_process(args, repo)
        assert text.returncode == 0, (args, text.stderr)
        assert text.stderr == "", (args, text.stderr)
        assert text.stdout.strip(), args
        as_json = run_in_process([*args, "--json"], repo)
        assert as_json.returncode == 0, (args, as_json.stderr)
        out = json.loads(as_json.stdout)
        assert holds(out), (args, out)
        assert out.get("offline") is None, args
    status = run_in_process(["status", "--server"], repo)
    assert status.returncode == 0, status.stderr
    lines = status.stderr.splitlines()
    assert len(lines) == 1 and NOTE.match(lines[0]), status.stderr
    assert "server_rows: unknown (server unreachable)" in status.stdout
    assert re.search(r"last_sync: \d{4}-", status.stdout)
    asked = json.loads(run_in_process(["status", "--server", "--json"], repo).stdout)
    offline = asked["offline"]
    assert offline["server"] == server.url and offline["reachable"] is False
    assert offline["last_sync"] and "cannot reach server" in offline["error"]

    # Back online: status --server asks again and says nothing.
    server.start()
    back = run_in_process(["status", "--server", "--json"], repo)
    assert back.returncode == 0 and back.stderr == "", back.stderr
    out = json.loads(back.stdout)
    assert out["offline"] is None and out["server_chunks"] == 2
    assert out["server_tree"]["in_step"] is True


def test_an_index_open_across_the_outage_asks_only_on_demand(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.search("retry failed requests") and idx.offline is None
        server.stop()
        hits = idx.search("retry failed requests")
        assert "net/retry.py" in {h.path for h in hits} and idx.offline is None
        assert idx.status().offline is None and idx.status().server_chunks == 2
        assert idx.status(server=True).offline is not None
        server.start()
        assert idx.status(server=True).offline is None
        idx.search("retry failed requests")
        assert idx.offline is None and idx.status().server_chunks == 2


def test_offline_still_refuses_a_key_other_than_the_one_last_confirmed(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    server.stop()
    from sync.checkout.config import find_root, load_config
    from sync.crypto.keys import create_key, key_path

    workspace = load_config(find_root(repo)).workspace_id
    key_path(workspace).unlink()
    create_key(workspace)  # another key under the same id
    result = run_in_process(["search", "retry"], repo)
    assert result.returncode == 1
    assert "does not match the one its index was built with" in result.stderr


def test_mcp_results_answer_offline(
        tmp_path: Path, server_factory: Callable[..., ServerProcess],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval.faces.mcp_server import build_server

    monkeypatch.setenv("CODEVEIL_EMBEDDER", "hashing")
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    server.stop()
    mcp = build_server(repo)
    calls = [("search", {"query": "retry failed requests"}),
             ("definition", {"name": "send_all"}),
             ("outline", {"path": "net/retry.py"}),
             ("references", {"name": "send_all"}),
             ("grep", {"pattern": "send_all"}),
             ("index_status", {})]

    async def run() -> list[dict]:
        answers = []
        for name, args in calls:
            result = await mcp.call_tool(name, args)
            assert not result.is_error, (name, result)
            answers.append(result.structured_content)
        return answers

    answers = anyio.run(run)
    for (name, _args), answer in zip(calls, answers, strict=True):
        assert answer.get("offline") is None, name
    assert "net/retry.py" in {h["path"] for h in answers[0]["hits"]}
    assert answers[-1]["server_chunks"] == 2


def test_server_search_refuses_search_offline_in_one_line_and_lookups_answer(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server, server_search=True)
    server.stop()
    result = run_in_process(["search", "retry failed requests"], repo)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "ranks on its server (server-search), which cannot be reached" in lines[0]
    assert "`codeveil def`" in lines[0]
    for args in (["def", "send_all"], ["grep", "send_all"], ["status"]):
        looked = run_in_process(args, repo)
        assert looked.returncode == 0, (args, looked.stderr)
        assert looked.stderr == "", looked.stderr


def test_a_search_over_several_repositories_answers_offline(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    local = write_repo(tmp_path / "local", {"b.py": "def retry_later():\n    return 2\n"})
    assert run_in_process(["index"], local).returncode == 0  # embedded: no server
    server.stop()
    result = run_in_process(["search", "retry", "-C", str(repo), "-C", str(local), "--json"],
                            tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    out = json.loads(result.stdout)
    assert not out.get("offline")
    assert {h["repo"] for h in out["hits"]} == {str(repo.resolve()), str(local.resolve())}


def _silent_listener(port: int) -> list[socket.socket]:
    """A port that takes no more connections and refuses none: its accept queue full,
    new SYNs are dropped, as by a server's address seen from off the VPN."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(0)
    held = [srv]
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        held.append(c)
    time.sleep(0.3)
    return held


def test_a_server_that_drops_packets_delays_no_read(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    server.stop()
    held = _silent_listener(server.port)
    try:
        for args in (["search", "retry failed requests"], ["def", "send_all"]):
            started = time.monotonic()
            result = run_in_process(args, repo)
            took = time.monotonic() - started
            assert result.returncode == 0 and result.stderr == "", (args, result.stderr)
            assert took < 3.0, (args, took)  # a read asks nothing: no connect timeout
    finally:
        for s in held:
            s.close()


def test_a_lost_client_state_offline_says_to_index_not_no_results(
        tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(tmp_path / "data")
    repo = _indexed(tmp_path, server)
    server.stop()
    for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"):
        (repo / ".codeveil" / name).unlink(missing_ok=True)
    for args in (["search", "retry failed requests"], ["def", "send_all"], ["status"]):
        result = run_in_process(args, repo)
        assert result.returncode == 1, (args, result.stdout)
        last = result.stderr.strip().splitlines()[-1]
        assert "was never completed on this machine" in last, (args, result.stderr)
        assert "state.sqlite was removed" in last and "run `codeveil index" in last
