"""The daemon's status and the workspace's status are typed records read by attribute,
and still read as the dicts they were: same keys, same order, same JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index, WorkspaceStatus
from sync.daemon import Daemon, DaemonFiles, DaemonStatus, read_status
from sync.daemon.report import status_lines
from tests.cli_in_process import run_in_process
from tests.conftest import write_repo

# Written by a daemon, and by `codeveil status --json`, before the status was typed.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "status"


def _status_file(repo: Path, text: str) -> DaemonFiles:
    files = DaemonFiles.for_root(repo)
    files.dir.mkdir(parents=True, exist_ok=True)
    files.status.write_text(text)
    return files


def test_a_status_file_reads_as_attributes_and_writes_back_byte_for_byte(
        tmp_path: Path) -> None:
    text = (FIXTURES / "daemon.json").read_text()
    files = _status_file(tmp_path, text)
    status = read_status(files)
    assert isinstance(status, DaemonStatus)
    raw = json.loads(text)
    assert status.state == raw["state"] == "stopped"
    assert status.last_result is not None
    assert status.last_result["chunks_total"] == raw["last_result"]["chunks_total"]
    assert status.syncs == raw["syncs"] and status.stopped == raw["stopped"]
    # The mapping view old callers read.
    assert status["pending_changes"] == raw["pending_changes"]
    assert status.get("watching") == raw["watching"] and dict(status) == raw
    assert json.dumps(status.to_dict(), indent=2) + "\n" == text


def test_a_running_daemon_writes_the_keys_in_the_order_it_always_did(
        tmp_path: Path) -> None:
    class Idle:
        server = "embedded"
        unreachable: tuple[type[BaseException], ...] = ()

        def sync(self, changed: int = 0) -> None:
            raise AssertionError("not run")

        def close(self) -> None:
            pass

    old = json.loads((FIXTURES / "daemon.json").read_text())
    daemon = Daemon(tmp_path, Idle())  # type: ignore[arg-type]
    DaemonFiles.for_root(tmp_path).dir.mkdir()
    daemon._write_status()
    written = json.loads(DaemonFiles.for_root(tmp_path).status.read_text())
    # The key only a stopped daemon writes comes last, as it always did.
    assert [*written, "stopped"] == list(old)
    assert written["state"] == "starting" and "stopped" not in written


def test_status_lines_read_the_typed_status(tmp_path: Path) -> None:
    files = _status_file(tmp_path, (FIXTURES / "daemon.json").read_text())
    from sync.daemon import probe

    state = probe(tmp_path)
    assert not state.running and isinstance(state.status, DaemonStatus)
    lines = status_lines(state, files.log)
    assert lines[1] == "  last state: stopped"
    assert any(line.startswith("   last sync:") and "2 chunks in the index" in line
               for line in lines)


@pytest.mark.parametrize("text", ["[]", "{}", "not json", '{"state": "idle", "pid": 1, "x": 2}'])
def test_odd_status_files(tmp_path: Path, text: str) -> None:
    status = read_status(_status_file(tmp_path, text))
    if text.startswith('{"state"'):  # a key it does not know is left out
        assert status is not None and status.state == "idle" and "x" not in status
    else:
        assert status is None


def test_workspace_status_is_typed_and_prints_the_json_it_always_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "cache"))
    repo = write_repo(tmp_path / "repo", {"a.py": "def a():\n    return 1\n",
                                          "b.py": "def b():\n    return 2\n"})
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
        status = idx.status()
        coverage = idx.coverage().to_dict()
    assert isinstance(status, WorkspaceStatus)
    assert status.files == status["files"] == 2
    assert status.server == "embedded" and status.root == str(repo.resolve())
    printed = run_in_process(["status", "--json"], repo)
    assert printed.returncode == 0, printed.stderr
    # How many chunks have vectors, and the vector builder's state follow (none ran:
    # the index above waited): the JSON the MCP tool index_status answers too.
    builder = {"running": False, "given_up": None}
    assert printed.stdout == json.dumps(
        {**status.to_dict(), "index": coverage, "builder": builder}, indent=2) + "\n"
    old = json.loads((FIXTURES / "workspace.json").read_text())
    new = json.loads(printed.stdout)
    del new["index"], new["builder"]
    # Every key it always had, in its order, with its type; then the ref this checkout
    # syncs, added since (a string in a sealed workspace with a blob pool), and when it
    # last synced with a server and whether it could not reach it (None here: embedded),
    # and the check of the store's tree that `--server` asks for (None: not asked).
    assert list(new) == [*old, "ref", "last_sync", "offline", "server_tree"]
    assert isinstance(new["ref"], str)
    assert new["last_sync"] is new["offline"] is new["server_tree"] is None
    assert {k: type(new[k]) for k in old} == {k: type(v) for k, v in old.items()}
    text = run_in_process(["status"], repo)
    assert text.stdout.splitlines()[5] == f"{'files':>14}: 2"
    assert text.stdout == "".join(f"{name:>14}: {value}\n" for name, value in new.items()
                                  if value is not None)
