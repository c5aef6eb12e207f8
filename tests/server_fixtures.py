"""A real codeveil server for tests: `python -m sync.server.app` in a subprocess on loopback,
exactly what a user runs. Loaded by conftest.py (`pytest_plugins`).

Fixtures:
    live_server     one server for the whole run (tests isolate themselves by creating
                    workspaces of their own); `.url`, `.data_dir`, `.log_text()`
    server_url      its base URL
    server_factory  servers of a test's own, on data dirs it chooses (or, with
                    `store=URL`, on a PostgreSQL database); they can be stopped, killed
                    and restarted, and are stopped at teardown
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 60.0  # seconds; importing LanceDB, faiss and FastAPI takes a couple


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `python -m sync.server.app` subprocess; its output goes to `log_path`."""

    def __init__(self, data_dir: Path, *, port: int | None = None, args: tuple[str, ...] = (),
                 store: str | None = None):
        self.data_dir = Path(data_dir)  # with `store`, only where its log goes
        self.store = store
        self.port = port or free_port()
        self.args = args
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = STARTUP_TIMEOUT) -> ServerProcess:
        assert not self.running, "already running"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [
            sys.executable, "-m", "sync.server.app",
            *(("--store", self.store) if self.store else ("--data", str(self.data_dir))),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self._proc.returncode}:\n{self.log_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/health", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log_text()[-3000:]}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, as a service manager would; SIGKILL if it does not stop in time."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown code runs."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def start_server(data_dir: Path, *, args: tuple[str, ...] = (), attempts: int = 3,
                 store: str | None = None) -> ServerProcess:
    """Start a server on a free port, trying another port if one was taken meanwhile."""
    for attempt in range(attempts):
        server = ServerProcess(data_dir, args=args, store=store)
        try:
            return server.start()
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("live-server") / "data")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server_url(live_server: ServerProcess) -> str:
    return live_server.url


@pytest.fixture
def server_factory() -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def make(data_dir: Path, *, args: tuple[str, ...] = (),
             store: str | None = None) -> ServerProcess:
        server = start_server(data_dir, args=args, store=store)
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()
