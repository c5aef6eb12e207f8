"""What the PostgreSQL backend answers of refs and the blob pool (sync.store.pool): it
keeps one tree per workspace, the default ref's, and no pool, as the embedded store did
before refs; it says so (`extra["pool"]` is absent from its `info`), so a client syncs
its one tree there as before. A request for another ref, a link or a pull by blob is a
409 that says why."""

from __future__ import annotations

from collections.abc import Sequence

from sync.records import DEFAULT_REF, BlobRows, FileUpdate, RefInfo
from sync.store.checks import _key
from sync.wire import BadRequest, RefNotFound

ONE_TREE = ("this store (PostgreSQL) keeps one tree per workspace: it takes no ref of"
            " its own and has no blob pool")


def one_tree(ref: object) -> bytes:
    """The checked ref of a tree request: only the default ref."""
    checked = _key(ref, "ref")
    if checked != DEFAULT_REF:
        raise BadRequest(ONE_TREE, status=409)
    return checked


def refuse_links(updates: Sequence[FileUpdate]) -> None:
    if any(getattr(u, "link", False) for u in updates):
        raise BadRequest(ONE_TREE, status=409)


class PgSingleTree:
    """The ref and pool members of `WorkspaceBackend` for a store of one tree."""

    workspace_id: str

    def _one_tree_info(self) -> tuple[float, int, int] | None:  # pragma: no cover
        raise NotImplementedError

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        raise BadRequest(ONE_TREE, status=409)

    def refs(self) -> list[RefInfo]:
        found = self._one_tree_info()
        if found is None:
            return []
        return [RefInfo(DEFAULT_REF, *found)]

    def drop_ref(self, ref: bytes) -> None:
        one_tree(ref)
        raise RefNotFound(f"workspace {self.workspace_id}: {ONE_TREE}; delete its files"
                          " with a sync instead")

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        # One tree: a file's rows go with its leaf in the apply that drops it.
        return {"refs": 0, "blobs": 0, "rows": 0}
