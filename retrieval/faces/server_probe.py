"""Whether a lookup's server answers, asked beside the lookup: def, outline, uses and grep
answer from this machine's copy alone, and only say, as search and status do, when its
server could not be reached and when the copy last synced (`sync.server_contact`).

The question runs in a thread while the lookup runs, so a server that answers costs the
lookup nothing it can notice; an embedded workspace asks nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path

from indexer.errors import CodeveilError
from sync.config import find_root, load_config
from sync.server_contact import PROBE_TIMEOUT, Unreachable, probe

__all__ = ["ServerProbe"]


class ServerProbe:
    """Started on the folder of a lookup; `result()` is the `Unreachable` to report, or
    None (the server answered, there is none, or the folder is no index: the lookup
    says so itself)."""

    def __init__(self, path: str | Path) -> None:
        self._result: Unreachable | None = None
        self._thread: threading.Thread | None = None
        try:
            root = find_root(Path(path))
            config = load_config(root)
        except CodeveilError:
            return
        server = config.server
        if server is None:
            return

        def ask() -> None:
            self._result = probe(server, config.workspace_id, root)

        self._thread = threading.Thread(target=ask, name="codeveil-probe", daemon=True)
        self._thread.start()

    def result(self) -> Unreachable | None:
        if self._thread is not None:
            self._thread.join(PROBE_TIMEOUT + 1.0)
        return self._result
