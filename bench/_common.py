"""Helpers shared by the benchmarks: isolated dirs, tables, JSON output."""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def isolate() -> Path:
    """Point codeveil's config and cache dirs at a fresh temp dir; returns it."""
    base = Path(tempfile.mkdtemp(prefix="codeveil-bench-"))
    os.environ["CODEVEIL_CONFIG_DIR"] = str(base / "config")
    os.environ["CODEVEIL_CACHE_DIR"] = str(base / "cache")
    return base


MIRRORS = Path("/work/.mirror")  # where `fetch` puts git mirrors: <owner>+<name>/repo


def mirror_git_dir(name: str, mirrors: Path = MIRRORS) -> Path:
    """The git directory of the mirror of `name` (owner/repo): `repo`, or `repo/.git`
    where the snapshot is a clone with a work tree."""
    base = mirrors / name.replace("/", "+") / "repo"
    return base / ".git" if (base / ".git").is_dir() else base


def unpack_mirror(name: str, dest: Path, mirrors: Path = MIRRORS, commit: str = "HEAD") -> str:
    """The tree of the git mirror of `name` (owner/repo) at `commit` unpacked into `dest`
    (made here); returns the commit's hash, for the result file."""
    git_dir = mirror_git_dir(name, mirrors)
    if not git_dir.is_dir():
        raise SystemExit(f"no mirror of {name} at {git_dir}: fetch github:{name} first")
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "--git-dir", str(git_dir), "archive", commit],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive of {git_dir} at {commit} failed")
    return subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", commit],
                          capture_output=True, text=True, check=True).stdout.strip()


def proc_status_kb(pid: int | str, field: str) -> int | None:
    """A /proc/<pid>/status field in kB (`pid` may be "self"), None once the process is
    gone. VmHWM, not ru_maxrss, for a peak: a forked child's ru_maxrss starts at its
    parent's."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def bench_cache(name: str) -> Path:
    """Point codeveil's cache and config dirs at bench/.cache/<name> (kept between runs,
    so that a rerun embeds nothing it embedded before); returns that folder."""
    cache = ROOT / "bench" / ".cache" / name
    os.environ["CODEVEIL_CACHE_DIR"] = str(cache / "cache")
    os.environ["CODEVEIL_CONFIG_DIR"] = str(cache / "config")
    return cache


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


# The installed versions that can move a benchmark's numbers (the int8 model is exported
# and quantized on this machine; BM25 and tokenizing come from libraries), kept with them.
VERSIONED = ("torch", "onnx", "onnxruntime", "sentence-transformers", "transformers",
             "tokenizers", "numpy", "faiss-cpu", "bm25s", "lancedb")


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _tree() -> tuple[str | None, bool]:
    # Tracked files only: results and caches written by the run itself do not count.
    return _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain",
                                                "--untracked-files=no"))


def provenance() -> dict[str, object]:
    """Where a result comes from: the commit (and whether the tree had uncommitted
    changes) when the run started, the command line, the date (UTC), the machine and its
    load when written. The machine is shared, so the load says how far a figure can be
    trusted. The tree is the one the run started on: a result file another run writes
    meanwhile does not make this one's tree look changed."""
    commit, dirty = _TREE_AT_START
    return {
        "commit": commit,
        "dirty": dirty,
        "command": shlex.join(["python", *sys.argv]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "load": dict(zip(("1min", "5min", "15min"), os.getloadavg(), strict=True)),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "packages": package_versions()},
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a checkout (an sdist), or no git: recorded as unknown
    return out.stdout.strip()


_TREE_AT_START = _tree()  # a benchmark imports this module as it starts


def write_json(name: str, payload: dict) -> Path:
    """Write `payload` to bench/results/<name>.json with its `provenance` first."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"provenance": provenance(), **payload}, indent=2))
    return path


def save_figure(fig: object, name: str) -> Path:
    """Save a matplotlib figure as bench/results/<name>.png, its provenance in the PNG's
    text chunks (`python -c "from PIL import Image; print(Image.open(p).text)"`)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.png"
    meta = {"Description": json.dumps(provenance()), "Software": "codeveil bench"}
    fig.savefig(path, dpi=110, metadata=meta)  # type: ignore[attr-defined]
    return path


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


class Server:
    """A `codeveil serve` subprocess on a free loopback port, for benchmarks."""

    def __init__(self, data_dir: Path) -> None:
        import socket
        import subprocess
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.log = open(data_dir.parent / "server.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, *self.arguments()], stdout=self.log, stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )
        self._wait()

    def arguments(self) -> list[str]:
        """What follows `python` on the server's command line."""
        return ["-m", "retrieval", "serve", "--data", str(self.data_dir),
                "--port", str(self.port)]

    def _wait(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"server did not start; see {self.log.name}")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def static_embedder():
    """The static model the static tier ranks by (indexer.static_embedder), None where
    it cannot be read."""
    from indexer.errors import EmbedderError
    from indexer.static_embedder import StaticEmbedder

    try:
        return StaticEmbedder()
    except EmbedderError as exc:
        logging.getLogger("bench").warning("no static tier: %s", exc)
        return None
