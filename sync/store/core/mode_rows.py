"""A workspace's mode as one member, chosen when the workspace opens.

A workspace is sealed or server-search (sync.records.MODES). A sealed workspace's rows
are a chunk id and one envelope each, kept in a pool of blobs that its refs share; a
server-search workspace's rows also hold an encrypted vector the server ranks, kept in
a search index. Every difference the mode makes to the rows is a hook of one member,
so that neither backend's workspace branches on the mode: the workspace calls the
hooks at each step of its operations, and each backend has one implementation per mode
(sync.store.embedded.sealed_rows and .search_rows; sync.store.postgres.sealed_rows and
.search_rows), picked from the workspace's record when it opens.

`ModeRows` holds the hooks both backends share; each backend's protocol adds the steps
of its own write order (sync.store.embedded.mode_rows, sync.store.postgres.mode_rows).
`C` is the backend's connection, of the transaction an apply's values are set in.
"""

from __future__ import annotations

from typing import Any, Generic, NoReturn, Protocol, TypeVar

from sync.records import SearchHit
from sync.store.core.checks import Update
from sync.wire import BadRequest, SealedWorkspaceError

#: A stored row: (rid, chunk id, meta).
Row = tuple[int, bytes, bytes]
#: Rows found per file key, in any order (sync.store.core.rows.bounded_answer and
#: sync.store.core.blobs.blob_answer order and bound them).
FoundRows = dict[bytes, list[Row]]

C = TypeVar("C", contravariant=True)


class ModeRows(Protocol[C]):
    """The rows of one workspace as its mode keeps them."""

    def file_rows(self, wanted: list[bytes], ref: bytes) -> FoundRows:
        """The rows of the committed leaves of `wanted` in `ref`'s tree, read so that
        each leaf's value and its rows are the ones one apply committed together."""
        ...

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector`; SealedWorkspaceError (409) in a sealed
        workspace, whose client searches."""
        ...

    def blob_rows(self, wanted: list[tuple[bytes, bytes]], *, rows: bool) -> FoundRows:
        """The rows of each blob (file key, value) the pool holds (only which it holds
        unless `rows`); BadRequest 409 in a server-search workspace, which has no pool."""
        ...

    def held(self, conn: C, updates: list[Update]) -> tuple[list[bytes], list[Update]]:
        """An apply's last step, before the values are set: the keys of the links whose
        blob the pool lacks (their leaves stay pending, the client sends those files),
        and the updates whose values may be set."""
        ...

    def settle(self, conn: C, ref: bytes, updates: list[Update]) -> int:
        """An apply's last step, after the values are set: what the pool does with the
        blobs the leaves name now and those orphaned; returns the rows deleted."""
        ...

    def touch(self, conn: C, ref: bytes) -> None:
        """`ref` was written to: marked synced (the GC drops refs nobody syncs)."""
        ...

    def close(self) -> None:
        """The workspace closes (under its write lock where it has one)."""
        ...


def refuse_search(workspace_id: str) -> NoReturn:
    """A sealed workspace's answer to a search."""
    raise SealedWorkspaceError(f"workspace {workspace_id} is sealed: search runs on the client")


class NoPool(Generic[C]):
    """The pool's hooks in a server-search workspace, which has no pool (and one ref,
    never dropped): both backends' server-search rows build on them."""

    def blob_rows(self, wanted: list[tuple[bytes, bytes]], *, rows: bool) -> FoundRows:
        raise BadRequest("a server-search workspace has no blob pool", status=409)

    def held(self, conn: C, updates: list[Update]) -> tuple[list[bytes], list[Update]]:
        return [], updates  # no links: every update sends its rows

    def settle(self, conn: C, ref: bytes, updates: list[Update]) -> int:
        return 0

    def touch(self, conn: C, ref: bytes) -> None:
        pass

    def released(self, conn: C, blobs: list[tuple[int, bytes]]) -> int:
        return 0

    def collect(self, conn: C, grace_s: float) -> tuple[int, int]:
        return 0, 0


def search_extra(index: dict[str, Any] | None) -> dict[str, Any]:
    """A server-search workspace's part of `info().extra`: its distance, and its index
    where it can be described."""
    extra: dict[str, Any] = {"distance": "l2"}
    if index is not None:
        extra["index"] = index
    return extra


#: A sealed workspace's part of `info().extra`: one tree per ref over a pool of blobs.
SEALED_EXTRA: dict[str, Any] = {"pool": True}
