"""Many `codeveil init --server` at once against one real `codeveil serve` on loopback:
each folder ends with exactly one workspace and one key, the server holds exactly the
workspaces the folders point to, and each is usable (indexed and searched) afterwards.
Two inits of one folder at once leave one workspace: the second is refused under the
init lock instead of creating another and re-pointing the folder to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from retrieval.faces.cli import main as cli_main
from sync.checkout.config import init_lock, load_config
from sync.store import Store
from tests.conftest import write_repo
from tests.server_fixtures import ServerProcess


def codeveil(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "retrieval", *args], cwd=cwd,
                            env=dict(os.environ, CODEVEIL_EMBEDDER="hashing"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err


PROC_LOCKS = Path("/proc/locks")


def blocked_on(lock_file: Path) -> set[int]:
    """The pids waiting for an flock on `lock_file` (the `->` lines of /proc/locks)."""
    inode = f":{lock_file.stat().st_ino} "
    return {int(line.split()[5]) for line in PROC_LOCKS.read_text().splitlines()
            if "->" in line and inode in line}


def server_workspaces(live_server: ServerProcess) -> list[str]:
    with Store(live_server.data_dir) as store:
        return store.workspace_ids()


def test_many_folders_initialised_at_once_each_get_one_usable_workspace(
    tmp_path: Path, live_server: ServerProcess
) -> None:
    before = set(server_workspaces(live_server))
    repos = [write_repo(tmp_path / f"repo{i}", {
        "app.py": f"def unique_handler_{i}(request):\n    return 'reply {i}'\n"})
        for i in range(6)]
    procs = [codeveil("init", ".", "--server", live_server.url, cwd=r) for r in repos]
    results = [finish(p) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), results
    ids = [load_config(r).workspace_id for r in repos]
    assert len(set(ids)) == len(repos)
    assert set(server_workspaces(live_server)) - before == set(ids)
    # Usable afterwards: in this process (only the inits' concurrency needs processes).
    runner = CliRunner(env={"CODEVEIL_EMBEDDER": "hashing"})
    for i, repo in enumerate(repos):
        indexed = runner.invoke(cli_main, ["index", "--wait", str(repo), "-q"])
        assert indexed.exit_code == 0, indexed.output
        found = runner.invoke(cli_main, ["search", f"unique_handler_{i}", "--json",
                                         "-C", str(repo)])
        assert found.exit_code == 0, found.output
        assert json.loads(found.stdout)["hits"][0]["path"] == "app.py"


def test_two_inits_of_one_folder_at_once_leave_one_workspace(
    tmp_path: Path, live_server: ServerProcess
) -> None:
    before = set(server_workspaces(live_server))
    repo = write_repo(tmp_path / "repo")
    # Held here until both are past their start-up and waiting on it at once: the
    # overlap a slow server or a loaded machine gives.
    with init_lock(repo.resolve()):
        procs = [codeveil("init", ".", "--server", live_server.url, cwd=repo)
                 for _ in range(2)]
        pids = {p.pid for p in procs}
        deadline = time.monotonic() + 120
        if not PROC_LOCKS.exists():  # no lock table to read (not Linux): a fixed wait
            time.sleep(6)
        while PROC_LOCKS.exists() and not pids <= blocked_on(repo / ".codeveil" / "init.lock"):
            assert all(p.poll() is None for p in procs), [finish(p) for p in procs]
            assert time.monotonic() < deadline, "the inits never both waited on the lock"
            time.sleep(0.02)
    results = [finish(p) for p in procs]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 1], results
    refused = next(err for rc, _, err in results if rc == 1)
    assert "already indexed" in refused and "Traceback" not in refused
    created = set(server_workspaces(live_server)) - before
    assert created == {load_config(repo).workspace_id}
    keys = list((Path(os.environ["CODEVEIL_CONFIG_DIR"]) / "keys").glob("*.key"))
    assert [k.stem for k in keys if k.stem in created] == sorted(created)
