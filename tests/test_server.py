"""The HTTP server as an attacker or a buggy client meets it: authentication, a table of
malformed requests, oversized bodies, and `HttpClient`'s mapping of what goes wrong.
Everything runs against a real `python -m sync.server.app` on loopback; what the store
answers (tokens, workspaces, invalid requests, the quota) against one on a data dir and
one on PostgreSQL alike."""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from sync.records import ChunkRecord, FileUpdate
from sync.transport.http_client import HttpClient, ServerUnavailable
from sync.wire import (
    LIMITS,
    AuthError,
    BadRequest,
    PermissionDenied,
    WorkspaceExists,
    WorkspaceNotFound,
)
from tests.pg_fixtures import other_database
from tests.server_fixtures import ServerProcess, free_port

DIM = 8


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def k(name: str) -> bytes:
    return (name.encode() * 16)[:16]


def vec(values: list[float] | np.ndarray) -> str:
    return b64(np.asarray(values, dtype="<f4").tobytes())


def good_update(name: str = "f", n_chunks: int = 1) -> dict[str, Any]:
    return {
        "file_key": b64(k(name)),
        "ancestors": [b64(k("root"))],
        "value": b64(k("v" + name)),
        "chunks": [
            {"chunk_id": b64(k(f"{name}{i}")), "vector": vec([0.5] * DIM), "meta": b64(b"m")}
            for i in range(n_chunks)
        ],
    }


@dataclass
class Workspace:
    url: str
    id: str
    token: str

    def path(self, suffix: str = "") -> str:
        return f"{self.url}/v1/workspaces/{self.id}{suffix}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> HttpClient:
        return HttpClient(self.url, self.id, self.token)


def new_workspace(url: str, dim: int = DIM) -> Workspace:
    ws = secrets.token_hex(8)
    token = HttpClient.create_workspace(url, ws, dim=dim, model_id="m", key_check=b"check")
    return Workspace(url, ws, token)


@pytest.fixture(params=["data", "postgres"])
def any_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The run's server on a data dir, and its server on PostgreSQL."""
    return request.getfixturevalue(
        "pg_live_server" if request.param == "postgres" else "live_server")


@pytest.fixture
def server_url(any_server: ServerProcess) -> str:
    return any_server.url


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


def test_health(server_url: str) -> None:
    answer = HttpClient.health(server_url)
    assert answer["status"] == "ok"
    assert answer["limits"]["max_body_bytes"] == LIMITS.max_body_bytes


# -- authentication -------------------------------------------------------------------------


def test_a_token_opens_its_own_workspace_only(server_url: str, http: httpx.Client) -> None:
    a, b = new_workspace(server_url), new_workspace(server_url)
    with a.client() as ca:
        ca.apply([FileUpdate(k("f"), (k("root"),), k("v"))], [])
        assert ca.info().nodes == 2

    intruder = HttpClient(server_url, b.id, a.token)  # A's token on B's workspace
    calls = {
        "info": intruder.info,
        "root": intruder.root,
        "children": lambda: intruder.children([k("root")]),
        "search": lambda: intruder.search(np.zeros(DIM), 5),
        "apply": lambda: intruder.apply([], [k("root")]),
        "dirs": lambda: intruder.set_dir_values([(k("root"), k("x"), k("y"))]),
    }
    for call in calls.values():
        with pytest.raises(PermissionDenied, match="another workspace"):
            call()
    intruder.close()
    # ...and B's token cannot touch A's data either (A's tree is intact).
    r = http.post(a.path("/apply"), json={"deletes": [b64(k("root"))]}, headers=b.auth)
    assert r.status_code == 403 and "another workspace" in r.json()["error"]
    with a.client() as ca:
        assert ca.info().nodes == 2


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "missing bearer token"),
        ({"Authorization": "Bearer"}, 401, "Bearer <token>"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401, "Bearer <token>"),
        ({"Authorization": "Bearer not-a-real-token"}, 401, "invalid bearer token"),
    ],
)
def test_missing_or_bad_tokens_get_401(
    server_url: str, http: httpx.Client, headers: dict[str, str], status: int, message: str
) -> None:
    ws = new_workspace(server_url)
    for method, suffix, body in [("GET", "", None), ("POST", "/search", {"k": 1})]:
        r = http.request(method, ws.path(suffix), json=body, headers=headers)
        assert r.status_code == status, r.text
        assert message in r.json()["error"]


def test_unknown_workspace(server_url: str, http: httpx.Client) -> None:
    ws = new_workspace(server_url)
    # With a valid token: 404. Without one: 401, which does not reveal whether it exists.
    r = http.get(f"{server_url}/v1/workspaces/nosuchworkspace", headers=ws.auth)
    assert r.status_code == 404 and "no workspace" in r.json()["error"]
    assert http.get(f"{server_url}/v1/workspaces/nosuchworkspace").status_code == 401
    with pytest.raises(WorkspaceNotFound, match="no workspace"):
        HttpClient(server_url, "nosuchworkspace", ws.token).info()


def test_creating_a_taken_workspace_id(server_url: str) -> None:
    ws = new_workspace(server_url)
    with pytest.raises(WorkspaceExists, match="already exists"):
        HttpClient.create_workspace(server_url, ws.id, dim=DIM, model_id="m", key_check=b"c")


# -- malformed requests ---------------------------------------------------------------------

TOO_MANY_KEYS = json.dumps({"keys": [b64(k(str(i))) for i in range(LIMITS.max_keys + 1)]})
NAN = vec([float("nan")] + [0.0] * (DIM - 1))
INF = vec([float("inf")] + [0.0] * (DIM - 1))

# (name, route, body: dict -> JSON or str/bytes -> sent as is, status, words in the error)
BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    ("not json", "/apply", "this is not json", 400, "malformed JSON"),
    ("empty body", "/apply", b"", 400, "malformed JSON"),
    ("invalid utf-8", "/apply", b'{"deletes": ["\xff\xfe"]}', 400, "malformed JSON"),
    ("deep nesting", "/apply", "[" * 100_000 + "]" * 100_000, 400, "malformed JSON"),
    ("array body", "/apply", [], 422, "body: Input should be an object"),
    ("updates not a list", "/apply", {"updates": 5}, 422, "updates: Input should be a valid array"),
    ("unknown field", "/apply", {"updatez": []}, 422, "updatez: Extra inputs are not permitted"),
    ("key not base64", "/apply", {"deletes": ["!!!!"]}, 422, "deletes.0: not base64url"),
    ("key padded", "/apply", {"deletes": [b64(k("a")) + "=="]}, 422, "no '=' padding"),
    ("key as number", "/apply", {"deletes": [12]}, 422, "expected a base64url string"),
    ("key too short", "/apply", {"deletes": [b64(b"short")]}, 422, "must be 16 bytes, got 5"),
    ("impossible base64 length", "/apply", {"deletes": ["A" * 21]}, 422, "impossible"),
    ("missing value", "/apply",
     {"updates": [{k_: v for k_, v in good_update().items() if k_ != "value"}]},
     422, "updates.0.value: Field required"),
    ("no ancestors", "/apply", {"updates": [{**good_update(), "ancestors": []}]},
     422, "ancestors must hold 1 to 256 keys"),
    ("vector of wrong dim", "/apply",
     {"updates": [{**good_update(), "chunks": [
         {"chunk_id": b64(k("c")), "vector": vec([1.0] * 3), "meta": ""}]}]},
     422, "must have 8 values (the workspace's dim), got 3"),
    ("vector with NaN", "/apply",
     {"updates": [{**good_update(), "chunks": [
         {"chunk_id": b64(k("c")), "vector": NAN, "meta": ""}]}]}, 422, "NaN or infinite"),
    ("vector with inf", "/search", {"vector": INF, "k": 3}, 422, "NaN or infinite"),
    ("vector bytes not float32", "/search", {"vector": b64(b"12345"), "k": 3},
     422, "not a multiple of 4"),
    ("vector as JSON list", "/search", {"vector": [0.0] * DIM, "k": 3},
     422, "vector: expected a base64url string"),
    ("k as string", "/search", {"vector": vec([0.0] * DIM), "k": "5"}, 422, "k: Input should be"),
    ("k as float", "/search", {"vector": vec([0.0] * DIM), "k": 5.0}, 422, "k: Input should be"),
    ("k zero", "/search", {"vector": vec([0.0] * DIM), "k": 0}, 422, "between 1 and 1000"),
    ("k too big", "/search", {"vector": vec([0.0] * DIM), "k": 1001}, 422, "between 1 and 1000"),
    ("k huge", "/search", {"vector": vec([0.0] * DIM), "k": 10**30}, 422, "k"),
    ("too many keys", "/tree/children", TOO_MANY_KEYS, 422, "at most 10000 items"),
    ("too many updates", "/apply",
     {"updates": [good_update(str(i), 0) for i in range(LIMITS.max_updates + 1)]},
     422, "at most 4096 items"),
    ("too many chunks", "/apply",
     {"updates": [good_update("a", 10_000), good_update("b", 10_001)]},
     422, "too many chunks: more than 20000"),
    ("meta too large", "/apply",
     {"updates": [{**good_update(), "chunks": [{"chunk_id": b64(k("c")), "vector": vec(
         [0.0] * DIM), "meta": b64(b"x" * (LIMITS.max_meta_bytes + 1))}]}]},
     422, "meta is 65537 bytes"),
    ("same file twice", "/apply", {"updates": [good_update("a"), good_update("a")]},
     422, "appears twice"),
    ("dir pair of one", "/tree/dirs", {"values": [[b64(k("a"))]]}, 422, "values.0"),
    ("dir value without its children", "/tree/dirs", {"values": [[b64(k("a")), b64(k("b"))]]},
     422, "values.0"),
    ("children without keys", "/tree/children", {}, 422, "keys: Field required"),
]

CREATE_BAD: list[tuple[str, Any, int, str]] = [
    ("dim zero", {"dim": 0, "model_id": "m", "key_check": "AAAA"}, 422, "dim must be"),
    ("dim as string", {"dim": "8", "model_id": "m", "key_check": "AAAA"}, 422, "dim: Input"),
    ("dim huge", {"dim": 10**6, "model_id": "m", "key_check": "AAAA"}, 422, "dim must be"),
    ("key check empty", {"dim": 8, "model_id": "m", "key_check": ""}, 422, "key_check must"),
    ("model id empty", {"dim": 8, "model_id": "", "key_check": "AAAA"}, 422, "model_id"),
    ("path in workspace id", {"dim": 8, "model_id": "m", "key_check": "AAAA",
                              "workspace_id": "../../etc"}, 422, "workspace_id must be"),
]


def _send(http: httpx.Client, url: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes):
        return http.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
    return http.post(url, json=body, headers=headers)


def test_bad_requests_get_a_4xx_with_a_clear_message(
    any_server: ServerProcess, http: httpx.Client
) -> None:
    ws = new_workspace(any_server.url)
    with ws.client() as c:  # a root exists, so a wrong root is refused below
        c.apply([FileUpdate(k("x"), (k("root"),), k("v"))], [])
    cases = [(name, ws.path(route), body, status, words)
             for name, route, body, status, words in BAD_REQUESTS]
    cases += [(name, f"{ws.url}/v1/workspaces", body, status, words)
              for name, body, status, words in CREATE_BAD]
    cases.append(("wrong root", ws.path("/apply"),
                  {"updates": [{**good_update(), "ancestors": [b64(k("other"))]}]},
                  422, "not this workspace's root key"))
    assert len(cases) >= 15
    failures = []
    for name, url, body, status, words in cases:
        r = _send(http, url, body, ws.auth)
        error = r.json().get("error", "") if r.headers.get("content-type", "").startswith(
            "application/json") else r.text
        if r.status_code != status or words not in error:
            failures.append(f"{name}: {r.status_code} {error[:300]!r}")
    assert not failures, "\n".join(failures)

    # Still healthy, nothing half-written, and it still works.
    assert any_server.running
    assert http.get(f"{ws.url}/v1/health").status_code == 200
    with ws.client() as c:
        assert c.info().nodes == 2
        c.apply([FileUpdate(k("y"), (k("root"),), k("v"),
                            (ChunkRecord(k("c"), np.ones(DIM), b"m"),))], [])
        assert len(c.search(np.ones(DIM), 5)) == 1
    assert "Traceback" not in any_server.log_text()


def test_unknown_routes_and_methods_answer_json(server_url: str, http: httpx.Client) -> None:
    r = http.get(f"{server_url}/v1/nothing-here")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = http.delete(f"{server_url}/v1/health")
    assert r.status_code == 405 and "error" in r.json()


# -- oversized bodies -------------------------------------------------------------------------


def _raw_request(port: int, head: bytes, body_chunks: Iterator[bytes] | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        try:
            for chunk in body_chunks or ():
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before it has read it all
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            data = s.recv(65536)
            if not data:
                break
            answer += data
    return answer


def test_declared_oversized_body_is_refused_unread(live_server: ServerProcess) -> None:
    ws = new_workspace(live_server.url)
    size = LIMITS.max_body_bytes + 1
    head = (
        f"POST /v1/workspaces/{ws.id}/apply HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ws.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    answer = _raw_request(live_server.port, head)  # no body sent at all
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request body too large" in answer


def test_streamed_oversized_body_is_refused(live_server: ServerProcess) -> None:
    ws = new_workspace(live_server.url)
    head = (
        f"POST /v1/workspaces/{ws.id}/apply HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ws.token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"x" * (1 << 20)

    def chunks() -> Iterator[bytes]:
        for _ in range(LIMITS.max_body_bytes // len(piece) + 2):
            yield b"%x\r\n" % len(piece) + piece + b"\r\n"
        yield b"0\r\n\r\n"

    answer = _raw_request(live_server.port, head, chunks())
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request body too large" in answer
    assert HttpClient.health(live_server.url)["status"] == "ok"


def test_client_refuses_to_send_an_oversized_body(server_url: str) -> None:
    ws = new_workspace(server_url)
    client = HttpClient(server_url, ws.id, ws.token, max_body_bytes=10_000)
    big = FileUpdate(k("f"), (k("root"),), k("v"),
                     tuple(ChunkRecord(k(f"c{i}"), np.zeros(DIM), b"m") for i in range(200)))
    with pytest.raises(BadRequest, match="exceeds the server's limit") as err:
        client.apply([big], [])
    assert err.value.http_status == 413
    assert client.stats.requests == 0  # nothing was sent
    client.close()


# -- the client's view of failures ------------------------------------------------------------


def test_unreachable_server_is_a_distinct_retryable_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = HttpClient(url, "ws", "token", timeout=5)
    with pytest.raises(ServerUnavailable, match=f"cannot reach server at {url}"):
        client.info()
    with pytest.raises(ServerUnavailable):
        HttpClient.create_workspace(url, "ws", dim=DIM, model_id="m", key_check=b"c")
    client.close()


def test_stats_count_requests_and_bytes(server_url: str) -> None:
    ws = new_workspace(server_url)
    with ws.client() as c:
        c.apply([FileUpdate(k("f"), (k("root"),), k("v"),
                            (ChunkRecord(k("c"), np.ones(DIM), b"m" * 100),))], [])
        c.search(np.ones(DIM), 3)
        c.root()
        assert c.stats.requests == 3
        assert c.stats.bytes_sent > 100 + 2 * (DIM * 4)
        assert c.stats.bytes_received > 100  # the sealed meta came back


def test_auth_errors_are_auth_errors(server_url: str) -> None:
    ws = new_workspace(server_url)
    with HttpClient(server_url, ws.id, "wrong") as c, pytest.raises(AuthError) as err:
        c.root()
    assert type(err.value) is AuthError and "invalid bearer token" in str(err.value)


def test_log_holds_requests_but_no_tokens_or_bodies(live_server: ServerProcess) -> None:
    ws = new_workspace(live_server.url)
    marker = b"sealed-meta-marker-" + secrets.token_hex(8).encode()
    with ws.client() as c:
        c.apply([FileUpdate(k("f"), (k("root"),), k("v"),
                            (ChunkRecord(k("c"), np.ones(DIM), marker),))], [])
        assert c.search(np.ones(DIM), 1)[0].meta == marker
    log = live_server.log_text()
    assert f"POST /v1/workspaces/{ws.id}/apply 200" in log
    assert ws.token not in log
    assert marker.decode() not in log and b64(marker) not in log


@pytest.mark.parametrize("damaged", ["tree.sqlite", "chunks.lance"])
def test_a_damaged_workspace_file_is_a_clear_503_logged_once(
    tmp_path: Path, server_factory, damaged: str
) -> None:
    server = server_factory(tmp_path / "data")
    token = HttpClient.create_workspace(server.url, "ws1", dim=DIM, model_id="m",
                                        key_check=b"check")
    client = HttpClient(server.url, "ws1", token)
    vec = np.ones(DIM, np.float32)
    client.apply([FileUpdate(k("f"), (k("root"),), k("v"), (ChunkRecord(k("c"), vec, b"m"),))],
                 [])
    client.close()
    server.stop()
    ws = tmp_path / "data" / "workspaces" / "ws1"
    if damaged == "tree.sqlite":
        (ws / "tree.sqlite").write_bytes(b"garbage!" * 4096)
        for side in ("tree.sqlite-wal", "tree.sqlite-shm"):
            (ws / side).unlink(missing_ok=True)
    else:
        for f in (ws / "chunks.lance" / "_versions").iterdir():
            f.unlink()
        (ws / "search.index").unlink(missing_ok=True)  # searches must read the table
    server.start()
    client = HttpClient(server.url, "ws1", token)
    for _ in range(3):
        with pytest.raises(ServerUnavailable, match=f"503.*{damaged}.*(corrupt|cannot be read)"):
            client.search(vec, 1)
    if damaged == "chunks.lance":  # the first request of a sync says so too
        with pytest.raises(ServerUnavailable, match=r"503.*chunks\.lance.*no version manifest"):
            client.root()
    client.close()
    server.stop()
    log = server.log_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    # Each cause once (for the table: the search's read, the root's file check), however
    # many requests met it; no traceback.
    assert len(errors) == (2 if damaged == "chunks.lance" else 1), log
    assert all(damaged in line for line in errors), log
    assert "Traceback" not in log
    statuses = re.findall(r"POST /v1/workspaces/ws1/search (\d+) ", log)
    assert statuses == ["503"] * 3, log  # the request log says what was answered


def test_openapi_describes_path_parameters_and_request_bodies(live_server: ServerProcess) -> None:
    spec = httpx.get(live_server.url + "/openapi.json", timeout=10).json()
    refs: list[str] = []

    def collect(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(spec)
    schemas = spec["components"]["schemas"]
    assert refs and all(r.removeprefix("#/components/schemas/") in schemas for r in refs)
    operations = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            operations += 1
            params = {p["name"]: p for p in op.get("parameters", [])}
            if "{workspace_id}" in path:
                assert params["workspace_id"]["in"] == "path", (method, path)
                assert params["workspace_id"]["required"] is True
            if method == "post":
                body = op["requestBody"]["content"]["application/json"]["schema"]
                assert body["$ref"].startswith("#/components/schemas/"), (method, path)
    # 9 routes, the 9 of refs and the blob pool (5 tree routes under /refs/{ref}), and
    # the 3 of invitee tokens
    assert operations == 21
    apply_body = schemas["ApplyBody"]["properties"]["updates"]["items"]
    assert apply_body["$ref"] == "#/components/schemas/UpdateBody"
    assert "base64url" in schemas["UpdateBody"]["properties"]["file_key"]["description"]


@pytest.mark.parametrize("kind", ["data", "postgres"])
def test_workspace_creation_needs_the_admin_token_and_keeps_to_the_quota(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    store = None
    if kind == "postgres":
        store = other_database(request.getfixturevalue("pg_url"), "codeveil_quota")
    monkeypatch.setenv("CODEVEIL_ADMIN_TOKEN", "s3cret-admin")
    server = ServerProcess(tmp_path / "data", args=("--max-workspaces", "2"),
                           store=store).start()
    try:
        def create(name: str) -> str:
            return HttpClient.create_workspace(server.url, name, dim=DIM, model_id="m",
                                               key_check=b"check")

        monkeypatch.delenv("CODEVEIL_ADMIN_TOKEN")
        with pytest.raises(AuthError, match="needs its admin token"):
            create("anyone")
        monkeypatch.setenv("CODEVEIL_ADMIN_TOKEN", "wrong")
        with pytest.raises(AuthError, match="needs its admin token"):
            create("guess")
        monkeypatch.setenv("CODEVEIL_ADMIN_TOKEN", "s3cret-admin")
        token = create("one")
        create("two")
        with pytest.raises(PermissionDenied, match="limit of 2 workspaces"):
            create("three")
        # The admin token creates; it does not open a workspace, and its own token does.
        assert HttpClient(server.url, "one", token).info().workspace_id == "one"
        with pytest.raises(AuthError):
            HttpClient(server.url, "one", "s3cret-admin").info()
    finally:
        server.stop()


def test_a_damaged_registry_stops_the_server_with_one_clear_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from sync.store import Store

    Store(tmp_path / "data").close()
    (tmp_path / "data" / "registry.sqlite").write_bytes(b"garbage!" * 4096)
    proc = subprocess.run(
        [sys.executable, "-m", "sync.server.app", "--data", str(tmp_path / "data"), "--port",
         str(free_port())], capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "registry.sqlite is corrupt" in proc.stderr and "restore it from a backup" in proc.stderr
