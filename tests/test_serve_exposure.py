"""`codeveil serve` is closed by default: beyond loopback it needs an admin token or --open."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from retrieval.faces.cli import main as cli_main
from sync.server.exposure import is_loopback, open_server_refusal
from tests.server_fixtures import PROJECT_ROOT, free_port


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]",
                                  "LOCALHOST"])
def test_loopback_hosts_are_recognised(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com", ""])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_refusal_lifts_with_a_token_or_open() -> None:
    assert open_server_refusal("0.0.0.0", None, False)
    assert open_server_refusal("0.0.0.0", "   ", False)  # blank: the server ignores it too
    assert open_server_refusal("0.0.0.0", "s3cret", False) is None
    assert open_server_refusal("0.0.0.0", None, True) is None
    assert open_server_refusal("127.0.0.1", None, False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_serve_beyond_loopback_without_token_refuses_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.delenv("CODEVEIL_ADMIN_TOKEN", raising=False)
    result = CliRunner().invoke(
        cli_main, ["serve", "--data", str(tmp_path / "data"), "--host", host, "--port", "0"])
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("codeveil: error: refusing to serve on")
    assert "CODEVEIL_ADMIN_TOKEN" in lines[0] and "--open" in lines[0]
    assert not (tmp_path / "data").exists()  # refused before touching any store


def test_serve_on_loopback_starts_as_before(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), PYTHONUNBUFFERED="1")
    env.pop("CODEVEIL_ADMIN_TOKEN", None)
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "retrieval", "serve", "--data", str(tmp_path / "data"),
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1.0).is_success:
                    healthy = True
                    break
            time.sleep(0.1)
        assert healthy, log.read_text(errors="replace")[-3000:]
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_python_m_sync_server_beyond_loopback_without_token_refuses(
        tmp_path: Path, host: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    env.pop("CODEVEIL_ADMIN_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sync.server.app", "--data", str(tmp_path / "data"),
         "--host", host, "--port", str(free_port())],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "refusing to serve on" in lines[0] and "CODEVEIL_ADMIN_TOKEN" in lines[0]
    assert "--open" in lines[0]
    assert not (tmp_path / "data").exists()


def test_the_server_itself_refuses_whoever_starts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sync.server.app import serve
    from sync.server.exposure import ServeRefused

    monkeypatch.delenv("CODEVEIL_ADMIN_TOKEN", raising=False)
    with pytest.raises(ServeRefused, match=r"refusing to serve on 0\.0\.0\.0"):
        serve(tmp_path / "data", host="0.0.0.0", port=free_port())
    assert not (tmp_path / "data").exists()
