"""What a server sees of a teammate's pull: the files asked for do not depend on their
content. A recording relay on loopback stands where the server's request handling is,
in front of a real `python -m sync.server.app`, and keeps every request body it forwards.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.checkout.config import load_token
from sync.crypto.ciphers import node_key
from sync.crypto.keys import export_key, import_key, load_key
from sync.wire import b64decode
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess
from tests.server_rows import leaf_rows

# Empty files (no chunks, so no rows), beside files with rows.
EMPTY = ("pkg/__init__.py", "pkg/sub/__init__.py", "docs/EMPTY.md")
FILLED = {f"pkg/mod_{i}.py": f'''
    def handler_{i}(request):
        """Answer request number {i} with its own greeting."""
        return "hello {i}", request
''' for i in range(12)}


class Relay:
    """A loopback HTTP relay to `upstream` that records (method, path, JSON body) of
    every request it forwards."""

    def __init__(self, upstream: str) -> None:
        self.requests: list[tuple[str, str, object]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with contextlib.suppress(ValueError):
                    relay.requests.append((self.command, self.path,
                                           json.loads(body) if body else None))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                answer = httpx.request(self.command, upstream + self.path, content=body,
                                       headers=headers, timeout=60)
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                         "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def asked_rows(self) -> list[list[bytes]]:
        """The file keys of each request for rows (by file key, or by blob), in order."""
        out = []
        for _, path, body in self.requests:
            if not isinstance(body, dict):
                continue
            if path.endswith("/rows"):
                out.append([b64decode(k) for k in body["files"]])
            elif path.endswith("/blobs") and body.get("rows", True):
                out.append([b64decode(k) for k, _ in body["blobs"]])
        return out


@contextlib.contextmanager
def _machine(monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[None]:
    """Another teammate's machine: a config dir and an embedding cache of its own."""
    with monkeypatch.context() as m:
        m.setenv("CODEVEIL_CONFIG_DIR", str(home / "config"))
        m.setenv("CODEVEIL_CACHE_DIR", str(home / "cache"))
        yield


def test_a_pull_asks_for_empty_files_like_the_others(
        tmp_path: Path, server_factory, hashing_embedder: HashingEmbedder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server: ServerProcess = server_factory(tmp_path / "data")
    server_url = server.url
    repo = write_repo(tmp_path / "alice", {**FILLED, **{p: "" for p in EMPTY}})
    with _machine(monkeypatch, tmp_path / "alice-home"):
        with Index(repo, embedder=hashing_embedder) as a:
            config = a.init(server=server_url)
            a.index(wait=True)
        assert config.sealed
        key = load_key(config.workspace_id)
        key_text, token = export_key(key), load_token(config.workspace_id)

    clone = tmp_path / "bob"
    shutil.copytree(repo, clone, ignore=shutil.ignore_patterns(".codeveil"))
    with _machine(monkeypatch, tmp_path / "bob-home"), Relay(server_url) as relay:
        import_key(config.workspace_id, key_text)
        with Index(clone, embedder=hashing_embedder) as b:
            b.init(server=relay.url, workspace_id=config.workspace_id, token=token)
            relay.requests.clear()  # the pull only, not the join's checks
            report = b.index(wait=True)
        assert report.chunks_embedded == 0 and report.chunks_pulled > 0

    asked = relay.asked_rows()
    keys = {p: node_key(key, p) for p in (*FILLED, *EMPTY)}
    flat = [k for request in asked for k in request]
    # No file is asked for by name, the empty ones no more than the others: the rows
    # come in pages (sync.crypto.pages), and every page of the tree is read, once.
    assert not set(flat) & set(keys.values())
    pages = {k for k, n in leaf_rows(server.data_dir).items() if n}
    assert sorted(flat) == sorted(pages) and len(flat) == len(set(flat))
    # In as many requests as the rows take (one batch here).
    assert len(asked) == 1
