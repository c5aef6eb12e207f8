"""The vector builder's process: `python -m retrieval.indexes.vector_builder ROOT`.

`sync.daemon.builder.Builder.start` runs it, detached and niced, after `codeveil index` has
indexed the words (its files, lock and states are described there). It runs the one
sync there is, `Workspace.sync`, with the search side kept built beside it
(`retrieval.indexes.search_ready`), so vectors join the ranking of other processes' searches as
files stop being pending, and sealed rows reach the store as batches complete. When an
`index` asked for another pass meanwhile, it syncs again before it exits.

SIGTERM (`codeveil daemon stop`, a foreground `index --wait`) stops it between two
statements; the sync's write order makes that safe and the next run resumes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from sync.daemon.builder import Builder, BuilderState, ProgressFile, chunks_waiting

log = logging.getLogger("retrieval.indexes.vector_builder")


class _Stopped(BaseException):
    """SIGTERM: stop syncing. A BaseException so that no `except Exception` swallows it."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def run(root: Path) -> int:
    """Build the vectors of the index at `root` (sync it) under its builder lock; the
    exit status: 0 done (or stopped, or another builder has it), 1 failed."""
    from retrieval.indexes.search_ready import SearchReady
    from sync.workspace.workspace import Workspace

    builder = Builder(root)
    with builder.hold(wait=2.0) as held:
        if not held:  # another builder has this index: it does the work
            return 0
        st = builder.begin(os.getpid())
        try:
            while True:
                st.chunks_todo = chunks_waiting(builder.root)
                st.chunks_done = st.files_done = 0
                builder.write(st)
                ws = Workspace(builder.root)
                try:
                    report = ws.sync(progress=ProgressFile(builder, st),
                                     follower=SearchReady(ws))
                finally:
                    ws.close()
                log.info("synced: %s", report.to_dict() | {"skipped": len(report.skipped)})
                end = BuilderState(**{**vars(st), "attempts": 0, "offline": report.offline,
                                      "state": "offline" if report.offline else "done"})
                if not builder.finish_or_again(end):
                    return 0
                log.info("another pass was asked for")
        except _Stopped:
            st.state, st.attempts = "stopped", 0
            builder.write(st)
            log.info("stopped")
            return 0
        except Exception as exc:  # recorded for `status` and `doctor`, then counted
            st.state, st.error = "failed", f"{type(exc).__name__}: {exc}"
            builder.write(st)
            log.exception("the vector build failed")
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m retrieval.indexes.vector_builder ROOT", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no nice() here
        os.nice(10)  # background work on a machine that also runs the editor
    signal.signal(signal.SIGTERM, _stop)
    return run(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
