"""The daemon's log: rotated at 1 MB, 3 old files kept, stdout and stderr captured
when it runs in the background."""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
import os
import sys
from pathlib import Path

from sync.daemon.control import DaemonFiles

log = logging.getLogger(__name__)

LOG_MAX_BYTES = 1_000_000
LOG_BACKUPS = 3


# -- logging --------------------------------------------------------------------------


class _LogHandler(logging.handlers.RotatingFileHandler):
    """A rotating log that, when detached, also receives the process's stdout/stderr.

    Output written straight to file descriptors 1 and 2 (a native library's warning, a
    traceback of a crash) would otherwise keep going to the rotated-away file.
    """

    def __init__(self, path: Path, *, capture_std: bool) -> None:
        super().__init__(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS,
                         encoding="utf-8")
        self.capture_std = capture_std
        self._redirect()

    def doRollover(self) -> None:
        super().doRollover()
        self._redirect()

    def _redirect(self) -> None:
        if self.capture_std and self.stream is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self.stream.fileno(), 1)
            os.dup2(self.stream.fileno(), 2)


def setup_logging(files: DaemonFiles, *, to_stderr: bool, capture_std: bool,
                  level: int = logging.INFO) -> None:
    """Send the process's logs to `.codeveil/daemon.log` (and stderr when in the foreground).

    `capture_std` points file descriptors 1 and 2 at the log too (for a detached daemon).
    """
    files.dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [_LogHandler(files.log, capture_std=capture_std)]
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    root_logger = logging.getLogger()
    for handler in handlers:
        handler.setFormatter(fmt)
        root_logger.addHandler(handler)
    root_logger.setLevel(level)
    # One line per HTTP request would bury the daemon's own story (a periodic sync is
    # three requests); failures still surface as the sync's error.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)
    if capture_std:
        # A crash in native code (faiss, LanceDB, the model) then leaves its Python
        # traceback in the log instead of nothing.
        faulthandler.enable()

