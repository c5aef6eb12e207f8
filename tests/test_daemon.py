"""`codeveil daemon`: real daemon processes on real folders, a real server on loopback.

Every daemon here is started the way a user starts it (`codeveil daemon start`) and
searched the way a user searches (`codeveil search --json`), with the fast hashing
embedder: these tests measure the daemon, not the model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from sync.daemon import DaemonFiles, EventFilter, probe, read_status
from sync.daemon.builder import Builder
from sync.daemon.loop import _backoff
from tests.conftest import write_repo
from tests.test_sibling_chunks import git

PROJECT_ROOT = Path(__file__).resolve().parents[1]

NEW_FUNCTION = '''

def reticulate_splines_for_minimap(splines, zoom):
    """Reticulate the minimap splines at the given zoom level."""
    return [spline.reticulate(zoom) for spline in splines]
'''


def _env() -> dict[str, str]:
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p
    )
    return env


def cv(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the `codeveil` command as a user would."""
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-m", "retrieval", *map(str, args)], env=_env(),
        capture_output=True, text=True, timeout=timeout, cwd="/",
    )


def _stored_rows(tree: Path) -> int:
    """The chunk rows in a sealed workspace's tree.sqlite (0 while it cannot be read)."""
    try:
        db = sqlite3.connect(f"file:{tree}?mode=ro", uri=True, timeout=5)
        try:
            return int(db.execute("SELECT count(*) FROM rows").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` on timeout.

    Timeouts are generous upper bounds for a loaded machine; on a quiet one every wait
    here ends within a few seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def status_of(repo: Path) -> dict[str, Any]:
    return read_status(DaemonFiles.for_root(repo)) or {}


def synced_since(repo: Path, syncs: int, pid: int | None = None) -> dict[str, Any] | None:
    """The status once a sync after the `syncs`-th has finished successfully, else None."""
    s = status_of(repo)
    if pid is not None and s.get("pid") != pid:
        return None
    if s.get("syncs", 0) > syncs and s.get("last_sync_ok") and s.get("state") != "syncing":
        return s
    return None


def settled(repo: Path, since: float, pid: int) -> dict[str, Any] | None:
    """The status once a sync that started after `since` (wall clock) has succeeded and
    nothing is pending, else None. Any such sync saw every change made before `since`."""
    s = status_of(repo)
    if (s.get("pid") == pid and (s.get("last_sync_started") or 0) > since
            and s.get("state") == "idle" and s.get("pending_changes") == 0
            and s.get("last_sync_ok")):
        return s
    return None


def search(repo: Path, query: str) -> list[dict[str, Any]]:
    proc = cv("search", query, "--json", "-k", "5", "-C", repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["hits"]


def wait_for_top_hit(repo: Path, path: str, needle: str) -> dict[str, Any]:
    """Search (with `codeveil search --json`) until the top hit is `needle` in `path`."""
    def top() -> dict[str, Any] | None:
        hits = search(repo, "reticulate splines minimap zoom")
        if hits and hits[0]["path"] == path and needle in hits[0]["text"]:
            return hits[0]
        return None

    return wait_for(f"{needle} in {path} to be the top hit", top)


def start(repo: Path, *options: str) -> int:
    proc = cv("daemon", "start", repo, "--debounce", "0.2", *options)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"started \(pid (\d+)\)", proc.stdout)
    assert match, proc.stdout
    return int(match.group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[list[Path]]:
    """Folders whose daemons are stopped (or killed) at teardown, whatever happened."""
    made: list[Path] = []
    yield made
    for repo in made:
        # Shown by pytest only when the test failed.
        log = DaemonFiles.for_root(repo).log
        print(f"--- {log}\n{log.read_text() if log.exists() else '(none)'}")
        state = probe(repo)
        stopped = not state.running or cv("daemon", "stop", repo).returncode == 0
        if not stopped and state.pid:
            os.kill(state.pid, signal.SIGKILL)


# -- the daemon's life --------------------------------------------------------------


def test_start_edit_search_status_stop(tmp_path: Path, repos: list[Path]) -> None:
    repo = write_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("build/\n*.log\n")
    (repo / "build").mkdir()
    repos.append(repo)

    pid = start(repo)
    first = wait_for("the first sync", lambda: synced_since(repo, 0, pid))
    assert first["last_result"]["files_changed"] == 6  # the sample files and .gitignore
    assert first["watching"] is True

    again = cv("daemon", "start", repo)
    assert again.returncode == 0
    assert f"already running (pid {pid})" in again.stdout

    shown = cv("daemon", "status", repo)
    assert shown.returncode == 0, shown.stderr
    assert f"running (pid {pid})" in shown.stdout
    as_json = json.loads(cv("daemon", "status", repo, "--json").stdout)
    assert as_json["running"] is True and as_json["pid"] == pid
    assert as_json["status"]["consecutive_errors"] == 0

    # Ignored paths never start a sync. (A sync would begin within ~0.5 s.)
    syncs = status_of(repo)["syncs"]
    (repo / "build" / "generated.py").write_text("def generated(): pass\n")
    (repo / "net" / "debug.log").write_text("noise\n")
    time.sleep(1.2)
    assert status_of(repo)["syncs"] == syncs
    assert status_of(repo)["pending_changes"] == 0

    # An edit is searchable within seconds, as the top hit.
    upload = repo / "net" / "upload.py"
    before = time.time()
    upload.write_text(upload.read_text() + NEW_FUNCTION)
    wait_for("the sync of the edit", lambda: settled(repo, before, pid))
    wait_for_top_hit(repo, "net/upload.py", "def reticulate_splines_for_minimap")

    # A deleted file leaves the index.
    before = time.time()
    (repo / "geo" / "distance.go").unlink()
    wait_for("the sync of the deletion", lambda: settled(repo, before, pid))

    def deleted_everywhere() -> bool:
        with Index(repo, embedder=HashingEmbedder()) as idx:
            hits = idx.search("Haversine great-circle distance", k=5)
            return idx.status()["files"] == 5 and all(h.path != "geo/distance.go" for h in hits)

    wait_for("the deleted file to leave the index", deleted_everywhere)

    stopped = cv("daemon", "stop", repo)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped (pid {pid})" in stopped.stdout
    wait_for("the daemon process to exit", lambda: not alive(pid), timeout=10)
    files = DaemonFiles.for_root(repo)
    assert not files.pid.exists()
    assert status_of(repo)["state"] == "stopped"
    assert "daemon stopped" in files.log.read_text()

    down = cv("daemon", "status", repo)
    assert down.returncode == 3
    assert "not running" in down.stdout
    assert cv("daemon", "stop", repo).stdout.startswith("codeveil daemon: not running")


def test_a_checkout_moves_the_daemons_syncs_to_the_new_branchs_tree(
        tmp_path: Path, repos: list[Path]) -> None:
    repo = write_repo(tmp_path / "repo")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    repos.append(repo)
    pid = start(repo)
    wait_for("the first sync", lambda: synced_since(repo, 0, pid))

    def refs() -> list[str]:
        shown = cv("refs", "-C", repo)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.splitlines()

    assert len(refs()) == 1
    # A new branch changes no file: the daemon sees HEAD move, and syncs the new ref.
    syncs = status_of(repo)["syncs"]
    git(repo, "checkout", "-q", "-b", "feature")
    wait_for("a sync after the checkout", lambda: synced_since(repo, syncs, pid))
    wait_for("the feature branch's ref", lambda: len(refs()) == 2)
    assert any(line.startswith("*") and line.split()[1].endswith(":feature") for line in refs())

    # An edit on the feature branch, then back to main: search follows the checkout.
    upload = repo / "net" / "upload.py"
    before = time.time()
    upload.write_text(upload.read_text() + NEW_FUNCTION)
    wait_for("the sync of the edit", lambda: settled(repo, before, pid))
    wait_for_top_hit(repo, "net/upload.py", "def reticulate_splines_for_minimap")
    git(repo, "commit", "-q", "-am", "feature")
    before = time.time()
    git(repo, "checkout", "-q", "main")
    wait_for("the sync of the checkout", lambda: settled(repo, before, pid))
    wait_for("the edit to leave the results", lambda: all(
        "reticulate_splines_for_minimap" not in h["text"]
        for h in search(repo, "reticulate splines minimap zoom")))
    # Both refs named: this checkout's (*) and the other local branch's.
    names = {line[0]: line[2:].split()[0] for line in refs()}
    assert names["*"].endswith(":main") and names[" "].endswith(":feature")


def test_kill_9_mid_sync_then_restart_converges(tmp_path: Path, repos: list[Path]) -> None:
    repo = tmp_path / "big"
    for i in range(1200):
        path = repo / f"pkg{i % 25:02d}" / f"mod_{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(f'''
            """Module {i}: helpers for widget number {i}."""


            def widget_{i}_area(width, height):
                """Area of widget {i} in square units."""
                return width * height * {i}


            class Widget{i}:
                def __init__(self, name):
                    self.name = name

                def describe(self):
                    return f"widget {i} named {{self.name}}"
            '''))
    repos.append(repo)

    pid = start(repo)
    # The start-up sync indexes the words and leaves the 1,200 files' vectors to the
    # index's builder. Kill both (a machine that goes down) once the first batches are
    # in the store (its tree.sqlite holds rows), i.e. in the middle of the upload.
    store = repo / ".codeveil" / "store"
    builder = Builder(repo)
    wait_for("the builder to write to the store", lambda: (
        builder.running()
        and any(_stored_rows(tree) for tree in store.glob("workspaces/*/tree.sqlite"))
    ))
    state = builder.state()
    assert state is not None and state.pid > 0
    os.kill(state.pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    wait_for("the killed daemon and builder to be gone",
             lambda: not alive(pid) and not alive(state.pid), timeout=10)
    assert builder.state().state == "running", "the build ended before the kill"

    # The kernel dropped the lock; status sees a dead daemon and clears its pid file.
    shown = cv("daemon", "status", repo)
    assert shown.returncode == 3
    assert f"pid {pid} died without stopping cleanly" in shown.stdout
    assert not DaemonFiles.for_root(repo).pid.exists()

    # Change a file while no daemon runs, then start a fresh one: it converges.
    target = repo / "pkg07" / "mod_00007.py"
    target.write_text(target.read_text() + NEW_FUNCTION)
    pid2 = start(repo)
    assert pid2 != pid
    wait_for("the resumed sync", lambda: synced_since(repo, 0, pid2))
    wait_for_top_hit(repo, "pkg07/mod_00007.py", "def reticulate_splines_for_minimap")
    assert cv("daemon", "stop", repo).returncode == 0

    index = cv("index", "--wait", repo, "--json")
    assert index.returncode == 0, index.stderr
    report = json.loads(index.stdout)
    assert (report["files_changed"], report["files_deleted"]) == (0, 0)
    assert report["files_scanned"] == 1200
    with Index(repo, embedder=HashingEmbedder()) as idx:
        info = idx.status()
    assert info["files"] == 1200
    assert info["chunks"] == info["server_chunks"]  # nothing lost, nothing twice


def test_server_outage_retries_then_catches_up(
    tmp_path: Path, repos: list[Path], server_factory: Callable[..., Any]
) -> None:
    server = server_factory(tmp_path / "server-data")
    repo = write_repo(tmp_path / "repo")
    repos.append(repo)
    init = cv("init", repo, "--server", server.url)
    assert init.returncode == 0, init.stderr

    pid = start(repo, "--max-backoff", "1")
    first = wait_for("the first sync", lambda: synced_since(repo, 0, pid))
    assert first["server_reachable"] is True and first["server"] == server.url

    server.stop()
    down_since = time.time()
    upload = repo / "net" / "upload.py"
    upload.write_text(upload.read_text() + NEW_FUNCTION)
    failing = wait_for("failed syncs while the server is down", lambda: (
        (s := status_of(repo)).get("consecutive_errors", 0) >= 2
        and s["server_reachable"] is False and s["pending_changes"] >= 1 and s
    ))
    assert failing["last_sync_ok"] is False and failing["last_error"]
    shown = cv("daemon", "status", repo)
    assert shown.returncode == 0
    assert "UNREACHABLE" in shown.stdout and "failed syncs in a row" in shown.stdout

    server.start()  # the same port and data
    # The first sync to succeed started after the edit, so it carries it.
    caught_up = wait_for("the catch-up sync", lambda: settled(repo, down_since, pid))
    assert caught_up["server_reachable"] is True and caught_up["consecutive_errors"] == 0
    wait_for_top_hit(repo, "net/upload.py", "def reticulate_splines_for_minimap")

    assert cv("daemon", "stop", repo).returncode == 0
    report = json.loads(cv("index", "--wait", repo, "--json").stdout)
    assert (report["files_changed"], report["files_deleted"]) == (0, 0)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        info = idx.status()
    assert info["chunks"] == info["server_chunks"]


# -- shutdown during a sync -----------------------------------------------------------

SLOW_DAEMON = """
import sys, time
from pathlib import Path
from sync.daemon import NETWORK_ERRORS, Daemon
from sync.syncer.syncer import SyncReport

class SlowTarget:  # a stand-in sync whose slowness the test controls
    server = "embedded"
    unreachable = NETWORK_ERRORS

    def sync(self, changed=0):
        if Path(sys.argv[2]).exists():
            time.sleep(60)  # a sync that will not finish by itself in time
        return SyncReport()

    def close(self):
        pass

sys.exit(Daemon(Path(sys.argv[1]), SlowTarget(), stop_grace=float(sys.argv[3])).run())
"""


@pytest.mark.parametrize("grace", [0.3, 5.0])
def test_sigterm_mid_sync_exits_cleanly(tmp_path: Path, grace: float) -> None:
    """SIGTERM lets a sync finish for `stop_grace` seconds, then abandons it; either way
    the daemon exits 0 and leaves a "stopped" status. A second signal abandons at once."""
    repo = tmp_path / "repo"
    repo.mkdir()
    slow = tmp_path / "slow"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_DAEMON, str(repo), str(slow), str(grace)],
                            env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the first sync", lambda: status_of(repo).get("syncs") == 1)
        slow.touch()
        (repo / "edited.py").write_text("x = 1\n")
        wait_for("the slow sync", lambda: status_of(repo).get("state") == "syncing")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if grace > 1:
            time.sleep(0.3)
            assert proc.poll() is None  # still giving the sync its grace period
            proc.send_signal(signal.SIGTERM)  # a second signal: abandon now
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() - started < 3
        assert status_of(repo)["state"] == "stopped"
        assert not DaemonFiles.for_root(repo).pid.exists()
        assert not probe(repo).running
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# -- pieces -----------------------------------------------------------------------------


def test_event_filter_follows_the_ignore_rules(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel in ("src/app.py", "build/out.py", "node_modules/x/i.js", ".git/index",
                ".codeveil/daemon.json", "env/pyvenv.cfg", "env/lib/site.py",
                "sub/.gitignore", "sub/keep.py", "sub/gen/x.py", "yarn.lock", "logo.png"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "sub" / ".gitignore").write_text("gen/\n")
    (root / "src" / "new_dir").mkdir()
    f = EventFilter(root)
    relevant = {rel: f.relevant(str(root / rel)) for rel in (
        "src/app.py", "src/new_dir", "build/out.py", "node_modules/x/i.js", ".git/index",
        ".codeveil/daemon.json", "env/lib/site.py", "sub/keep.py", "sub/gen/x.py",
        "yarn.lock", "logo.png", "src/deleted.py", ".gitignore", ".git/HEAD",
    )}
    assert relevant == {
        "src/app.py": True, "src/new_dir": True, "build/out.py": False,
        "node_modules/x/i.js": False, ".git/index": False, ".codeveil/daemon.json": False,
        "env/lib/site.py": False, "sub/keep.py": True, "sub/gen/x.py": False,
        "yarn.lock": False, "logo.png": False, "src/deleted.py": True, ".gitignore": True,
        ".git/HEAD": True,  # the branch checked out names the ref a sync goes to
    }
    # A changed ignore file takes effect: the cached rules are dropped.
    (root / "sub" / ".gitignore").write_text("keep.py\n")
    assert f.relevant(str(root / "sub" / ".gitignore"))
    assert not f.relevant(str(root / "sub" / "keep.py"))
    assert f.watched_dir("src") and not f.watched_dir("build") and not f.watched_dir("env")


def test_event_filter_skips_assets_the_walk_skips_unless_brought_back(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel in ("docs/logo.svg", "docs/keep.svg", "tests/fixtures/a.json",
                "tests/fixtures/make.py", "vendor/x/y.go", "third_party/z.c", "app.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / ".codeveilignore").write_text("!docs/keep.svg\n!third_party/\n")
    f = EventFilter(root)
    relevant = {rel: f.relevant(str(root / rel)) for rel in (
        "docs/logo.svg", "docs/keep.svg", "tests/fixtures/a.json", "tests/fixtures/make.py",
        "vendor/x/y.go", "third_party/z.c", "app.py")}
    assert relevant == {
        "docs/logo.svg": False, "docs/keep.svg": True, "tests/fixtures/a.json": False,
        "tests/fixtures/make.py": True, "vendor/x/y.go": False, "third_party/z.c": True,
        "app.py": True,
    }
    assert not f.watched_dir("vendor") and f.watched_dir("third_party")


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    for failures, full in ((1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (30, 60.0)):
        delays = [_backoff(failures, 1.0, 60.0) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays)
        assert max(delays) - min(delays) > full / 10  # jittered, not lock-step
