"""What the two backends' workspaces share beyond their interface: what every part of
an open workspace reads of it (`WorkspaceHead`), and the answers and log lines both
assemble the same way: the request checked, the rows asked of the workspace's mode
(sync.store.core.mode_rows), the answer bounded."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sync.records import MODE_SEALED, BlobRows, FileRows, NodeInfo, WorkspaceInfo
from sync.store.core.backend import WorkspaceRecord
from sync.store.core.blobs import blob_answer, blob_items
from sync.store.core.checks import ref_id
from sync.store.core.mode_rows import ModeRows
from sync.store.core.rows import bounded_answer, file_keys
from sync.wire import Limits

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkspaceHead:
    """One open workspace's record, its store's limits and crash hook (StoreOptions,
    PgOptions). Keeps `sync.store.core.checks.ApplyTarget`."""

    record: WorkspaceRecord
    limits: Limits
    crash_hook: Callable[[str], None] | None = None

    @property
    def workspace_id(self) -> str:
        return self.record.workspace_id

    @property
    def dim(self) -> int:
        return self.record.dim

    @property
    def mode(self) -> str:
        return self.record.mode

    @property
    def sealed(self) -> bool:
        return self.record.mode == MODE_SEALED

    def reached(self, point: str) -> None:
        """Tell the crash hook that the apply passed `point`."""
        if self.crash_hook is not None:
            self.crash_hook(point)

    def info(self, chunks: int, nodes: int, mode_extra: dict[str, Any]) -> WorkspaceInfo:
        """The workspace's `info()`: its record, its counts, and in `extra` its creation
        time, its limits and what its mode adds (sync.store.core.mode_rows)."""
        r = self.record
        extra: dict[str, Any] = {"created_at": r.created_at, "limits": self.limits.as_dict()}
        extra.update(mode_extra)
        return WorkspaceInfo(
            workspace_id=r.workspace_id, dim=r.dim, model_id=r.model_id,
            key_check=r.key_check, chunks=chunks, nodes=nodes, extra=extra, mode=r.mode,
        )

    def file_rows(self, rows: ModeRows[Any], keys: object, ref: object) -> FileRows:
        """A `file_rows` request answered from the mode's `rows`: (chunk id, meta) of
        every row of each file of `keys` in the order they were sent, a key that is not
        a committed leaf mapping to [], bounded by `limits.max_row_bytes` (the keys after
        the bound are left out, and the caller asks for them again)."""
        ref = ref_id(ref, self.sealed)
        wanted = file_keys(keys, self.limits)
        if not wanted:
            return {}
        return bounded_answer(wanted, rows.file_rows(wanted, ref), self.limits.max_row_bytes)

    def blob_rows(self, rows: ModeRows[Any], items: object, *, with_rows: bool) -> BlobRows:
        """A `blob_rows` request answered from the mode's `rows`: the rows of each blob
        (file key, value) the pool holds, whichever ref sent it, the keys of those it
        lacks in `missing`; bounded like `file_rows`."""
        wanted = blob_items(items, self.limits)
        return blob_answer(wanted, rows.blob_rows(wanted, rows=with_rows),
                           self.limits.max_row_bytes)

    def root(self, roots: list[NodeInfo]) -> NodeInfo | None:
        """The root among the parentless nodes of a tree, `roots` (one at most)."""
        if len(roots) > 1:  # apply() refuses a second root; this would be a bug
            log.error("workspace %s has %d root nodes", self.workspace_id, len(roots))
        return roots[0] if roots else None

    def refused(self, count: int) -> None:
        """Log the directory values a `set_dir_values` refused."""
        if count:
            log.info(
                "workspace %s: %d directory values refused: computed over other children"
                " (another writer, or a pending node below)", self.workspace_id, count,
            )
