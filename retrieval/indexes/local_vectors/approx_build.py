"""The approximate index of a saved base, built in a process of its own.

Training the IVF-PQ quantizers of a 1M-chunk base peaks at ~550 MB and takes minutes.
Built on a thread of the process that searched, it added that to a process that should
stay small (a teammate's join peaked at 1.1 GB), and a one-shot process (`codeveil
index`, `codeveil search`) exited before the build was done, throwing it away to start
again at the next search. So the build runs as its own detached, low-priority process
(`python -m retrieval.indexes.local_vectors.approx_build DIR BASE_ID`) that outlives whoever
started it, reads the base's vectors from its memory-mapped file, and writes the index
beside them; every process that opens the store afterwards reads it from there.

Files in the store's folder, beside `base-<id>.npy`:

    approx-<id>.npy       the index (`ApproxPlanes.save`), written atomically
    approx-<id>.building  the builder's pid and attempt count while it runs: one
                          builder per base, whichever process claimed it first
    approx-<id>.failed    why a build failed: no further attempt for that base (a new
                          base, after a merge, tries again)
    approx-trained.npy    the trained quantizers with no rows, which the next base's
                          build reuses (`ApproxPlanes.build(like=...)`) instead of
                          training again

A builder that died without a word (killed, a power cut) leaves its `.building` file
naming a pid that is gone: the next process to look starts another, up to
`MAX_ATTEMPTS` in all, then records the failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import numpy as np

log = logging.getLogger("retrieval.indexes.local_vectors")

MAX_ATTEMPTS: Final = 3
TRAINED_FILE: Final = "approx-trained.npy"
# A marker this old whose pid is still alive is trusted; the age only guards the moment
# between a marker's creation and its pid being written.
_STARTING_S: Final = 30.0


def approx_path(directory: Path, base_id: bytes) -> Path:
    return directory / f"approx-{base_id.hex()}.npy"


def _marker(directory: Path, base_id: bytes) -> Path:
    return directory / f"approx-{base_id.hex()}.building"


def failure_path(directory: Path, base_id: bytes) -> Path:
    return directory / f"approx-{base_id.hex()}.failed"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read_marker(path: Path) -> tuple[int, int] | None:
    """(pid, attempts) of a build marker; None when there is none."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        # Being written, or garbled: young, it is a builder starting; old, a dead one.
        return (0, 1) if time.time() - mtime > _STARTING_S else (-1, 1)
    return int(parts[0]), int(parts[1])


def _held(marker: tuple[int, int] | None) -> bool:
    """Whether a marker (`_read_marker`) names a builder that is starting or alive."""
    return marker is not None and (marker[0] == -1 or (marker[0] > 0 and _alive(marker[0])))


def building(directory: Path, base_id: bytes) -> bool:
    """Whether a live process builds the approximate index of `base_id` now."""
    return _held(_read_marker(_marker(directory, base_id)))


def start_build(directory: Path, base_id: bytes) -> subprocess.Popen[bytes] | None:
    """Start the builder of `base_id`'s approximate index unless one runs, it failed,
    or every attempt is spent (then the failure is recorded). Returns the process
    started, or None."""
    from indexer.private_files import write_atomic

    marker = _marker(directory, base_id)
    held = _read_marker(marker)
    if failure_path(directory, base_id).exists() or _held(held):
        return None
    attempts = held[1] if held is not None else 0
    if attempts >= MAX_ATTEMPTS:
        _fail(directory, base_id, f"the build process died {attempts} times")
        return None
    marker.unlink(missing_ok=True)  # a dead builder's
    try:  # the claim: of two processes asking at once, one starts the builder
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return None
    root = str(Path(__file__).resolve().parents[2])  # the package's root, for -m
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        # Its own session: a Ctrl-C or the exit of whoever started it does not stop it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "retrieval.indexes.local_vectors.approx_build", str(directory),
             base_id.hex()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
        write_atomic(marker, f"{proc.pid} {attempts + 1}\n", durable=False)
    except OSError as exc:
        marker.unlink(missing_ok=True)
        log.warning("could not start the approximate vector index's build in %s: %s",
                    directory, exc)
        return None
    log.info("building the approximate vector index of %s in process %d", directory, proc.pid)
    return proc


def _fail(directory: Path, base_id: bytes, why: str) -> None:
    from indexer.private_files import write_atomic

    log.warning("could not build the approximate vector index in %s: %s", directory, why)
    with contextlib.suppress(OSError):
        write_atomic(failure_path(directory, base_id), why + "\n", durable=False)
        _marker(directory, base_id).unlink(missing_ok=True)


def build(directory: Path, base_id: bytes) -> bool:
    """Build and save the approximate index of the saved base `base_id` in `directory`
    (`start_build` runs this in a process of its own); whether it was saved."""
    from indexer.private_files import write_atomic
    from retrieval.indexes.local_vectors.approx import ApproxPlanes

    try:
        base = np.load(directory / f"base-{base_id.hex()}.npy", mmap_mode="r",
                       allow_pickle=False)
        like = None
        # None, damaged or of another dim: trained afresh.
        with contextlib.suppress(OSError, EOFError, ValueError, RuntimeError):
            like = ApproxPlanes.load(directory / TRAINED_FILE, 0, int(base.shape[2]))
        planes = ApproxPlanes.build(base, like=like)
        write_atomic(approx_path(directory, base_id), planes.save)
        if like is None or planes.trained_rows != like.trained_rows:  # trained afresh
            write_atomic(directory / TRAINED_FILE, planes.untrained_copy().save)
    except FileNotFoundError:
        return False  # the base was replaced meanwhile: its successor gets its own build
    except (OSError, ValueError, RuntimeError, MemoryError) as exc:  # faiss: RuntimeError
        _fail(directory, base_id, f"{type(exc).__name__}: {exc}")
        return False
    finally:
        marker = _marker(directory, base_id)
        held = _read_marker(marker)
        if held is not None and held[0] == os.getpid():
            marker.unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m retrieval.indexes.local_vectors.approx_build DIR BASE_ID",
              file=sys.stderr)
        return 2
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no nice() here
        os.nice(10)  # background work on a machine that also runs the editor
    return 0 if build(Path(args[0]), bytes.fromhex(args[1])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
