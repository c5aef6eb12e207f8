"""The store backend interface: what the server (sync.server.app) and `LocalClient` need from
a store, written down once. The embedded store (sync.store.embedded.registry and
sync.store.embedded.workspace: SQLite + LanceDB in a data dir) and sync.store.postgres
(PostgreSQL + pgvector) implement it; mypy holds both to it (the end of this module),
and tests/test_store.py, tests/test_sealed_store.py and tests/test_sync.py run the same
contract against each, in-process and behind `codeveil serve`. Both open a workspace
from its `WorkspaceRecord`.

`StoreBackend` is a set of workspaces and their tokens; `WorkspaceBackend` is one
workspace: its Merkle tree (nodes of key, parent, value, is_dir; a NULL value is
*pending*) and its chunk rows (chunk id, file, sealed metadata, and in a server-search
workspace an encrypted vector). Every argument and result is ciphertext or a keyed hash.

Two invariants make a sync converge whatever point a writer dies at, and a backend
must keep both (docs/architecture.md, "Write order"):

- Write order. A non-NULL leaf value only ever stands beside the rows it was applied
  with; a non-NULL directory value only ever describes the children the store holds.
  `apply` therefore sets pending every node above a change before any row moves, and a
  leaf's value only once its rows are stored: in steps that each commit durably (the
  embedded store), or in one transaction (PostgreSQL). A reader, or the store after a
  crash, sees a touched path either pending or complete, never a value over missing
  or stale rows.
- Compare-and-set. `set_dir_values` sets a directory only where its children, as stored
  at that moment, digest to the digest the client computed the value from.

Writes to one workspace are serialised by the backend across every process that opens
it (an flock; a row lock in the database). Requests are checked by the same code in
both (sync.store.core.checks), so the same input is refused with the same `StoreError`
(sync.wire) and message; the server maps each to its HTTP status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sync.records import (
    DEFAULT_REF,
    MODE_SERVER_SEARCH,
    BlobRows,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.wire import Limits

if TYPE_CHECKING:
    from sync.store.core.invitees import Invitee


@dataclass(frozen=True, slots=True)
class WorkspaceRecord:
    """A workspace as its store's registry holds it (either backend's): what a
    `WorkspaceBackend` is opened from."""

    workspace_id: str
    dim: int
    model_id: str
    key_check: bytes
    created_at: float
    mode: str = MODE_SERVER_SEARCH


class WorkspaceBackend(Protocol):
    """One workspace of a store. Thread-safe: the server calls it from many threads."""

    def info(self) -> WorkspaceInfo:
        """The workspace's record (id, dim, model id, key check, mode) with its row count
        (`chunks`) and node count (`nodes`); `extra` holds `created_at`, the `limits`
        (`Limits.as_dict`) and, in a server-search workspace, `distance` ("l2") and a
        description of the search `index` where there is one. Never builds an index."""
        ...

    def root(self, ref: bytes = DEFAULT_REF) -> NodeInfo | None:
        """The node without a parent (pending or not) of `ref`'s tree, or None for an
        empty tree (a ref that never synced). Every tree method takes the ref whose tree
        it reads or writes (16 bytes; BadRequest otherwise): a sealed workspace holds
        one tree per ref, which never touch each other; a server-search one only the
        default ref's (BadRequest 409 for another)."""
        ...

    def children(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF
                 ) -> dict[bytes, list[NodeInfo]]:
        """Every key of `keys` (duplicates once) -> its children, in key order, read from
        one committed state; [] for a key that is unknown or a file. BadRequest for a
        key that is not 16 bytes or for more than `Limits.max_keys` keys."""
        ...

    def file_rows(self, keys: Sequence[bytes], ref: bytes = DEFAULT_REF) -> FileRows:
        """(chunk id, meta) of every row of each key that is a committed leaf (non-NULL
        value, not a directory), in the order the rows were sent; [] for a key that is
        unknown, pending or a directory. In both modes. A leaf's value and its rows are
        read as one apply committed them. The answer stops before the key that would
        take it past `Limits.max_row_bytes` (the first key always comes whole): the
        caller asks again for the keys left out. BadRequest past `Limits.max_row_files`
        keys or for a key that is not 16 bytes."""
        ...

    def blob_rows(self, items: Sequence[tuple[bytes, bytes]], *, rows: bool = True
                  ) -> BlobRows:
        """A pull by content: for each (file key, leaf value), the rows of that version
        of that file if the pool holds it, whichever ref sent it, in send order; the
        keys of the blobs it lacks in `missing`. Bounded like `file_rows` (a key in
        neither part was left out). With `rows` false, only which blobs it holds (each
        with []). BadRequest as `file_rows`; 409 in a server-search workspace (no pool)."""
        ...

    def refs(self) -> list[RefInfo]:
        """Every ref with a tree, by id: when it last wrote, its files and the rows of
        their blobs."""
        ...

    def drop_ref(self, ref: bytes) -> None:
        """Delete `ref`'s tree; blobs no other ref names are orphaned (deleted at once
        when no ref is left to name them). RefNotFound (404) for a ref without a tree."""
        ...

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        """Drop the refs not synced for `max_ref_age_days`, then delete the blobs no ref
        has named for `grace_s` seconds (None: the store's settings); returns how many
        refs, blobs and rows went. A blob an apply is about to name is never deleted:
        the GC runs under the same per-workspace serialisation as `apply`, and a blob
        orphaned less than `grace_s` ago stays."""
        ...

    def search(self, vector: object, k: int) -> list[SearchHit]:
        """The `k` rows nearest to `vector` by Euclidean (not squared) distance, nearest
        first; fewer when the workspace holds fewer. Exact while the workspace is small;
        a backend may rank a large one with an approximate index (IVF, HNSW) of measured
        recall (docs/benchmarks.md). SealedWorkspaceError in a sealed
        workspace (its client searches). BadRequest for a vector that is not `dim`
        finite numbers of norm at most `Limits.max_vector_norm`, or a `k` that is not an
        integer from 1 to `Limits.max_k`."""
        ...

    def apply(self, updates: Sequence[FileUpdate], deletes: Sequence[bytes],
              ref: bytes = DEFAULT_REF) -> list[bytes]:
        """Replace the rows and leaf of each file of `updates`; remove the subtrees of
        `deletes` with their rows.

        The whole request is checked first (`validate_apply`): BadRequest and nothing
        written. Deletes take effect before updates, so one call turns a file into a
        directory of the same key or back; a key that changes kind without a delete
        loses its old subtree or rows all the same. Missing ancestors are created; the
        root key is fixed (BadRequest for an update under another root: delete the old
        root in an apply of its own first). Unknown deletes are no-ops.

        Afterwards every updated leaf holds its value and exactly its new rows, and every
        ancestor of an updated or deleted node is pending until `set_dir_values`.
        Write order (the module docstring): no value is ever visible, nor left by a
        crash at any point, over rows other than its own. Re-applying a batch is
        harmless (rows are replaced per file). Writers to one workspace run one at a
        time, whichever process or replica they are in.

        Sealed, rows belong to blobs (file, value) shared by every ref: an update with
        `link` names a blob the pool holds and carries no rows; a link to a blob the
        pool lacks leaves its leaf pending, and the keys of those links are returned
        (the client sends those files). Blobs left without a ref are deleted at once in
        a workspace of one ref, after the grace period in one of several."""
        ...

    def set_dir_values(self, values: Sequence[DirValue | tuple[bytes, bytes, bytes]],
                       ref: bytes = DEFAULT_REF) -> None:
        """Set directory values, each (key, value, children digest) a compare-and-set:
        the value is taken only if the directory's children, as stored when it is
        checked, are none of them pending and digest (`children_digest`) to the one
        given. Checked bottom-up whatever the order given: a directory after the values
        the same call gives its children, so a parent is never set over a child's old
        value while the call replaces it. A refused value leaves the directory as it was
        (pending, or another writer's consistent value), silently: the client's next
        diff descends there. Keys that are unknown or files are ignored. Under the same
        per-workspace serialisation as `apply`. BadRequest for an item that is not a
        triple of 16-byte keys, or past `Limits.max_dir_values` items. (The embedded
        store checks in the order given, which is the same for a client's bottom-up
        values; tests/test_store.py marks where a request that lists a parent first
        tells the two apart.)"""
        ...

    def verify(self, *, deep: bool = True) -> None:
        """Raise StoreCorrupt if the workspace plainly cannot read what it holds, and
        StoreUnavailable if its storage cannot be reached (both 503 on a server). Cheap:
        the server runs it (`deep=False`) before every root request, so a client never
        reports an index as up to date over a damaged store; `deep` may compare counts
        that are already at hand, never more."""
        ...

    def check(self) -> list[str]:
        """Every problem found in the workspace's storage, one line each naming what is
        damaged and what to do (empty: none); reads it all (`codeveil doctor`)."""
        ...


class StoreBackend(Protocol):
    """Many workspaces and their bearer tokens, of which only SHA-256 is kept. Any number
    of processes may open one store at once (the daemon and the CLI on an embedded one;
    replicas on one database)."""

    @property
    def limits(self) -> Limits:
        """The bounds every request to its workspaces is held to (sync.wire.Limits)."""
        ...

    def create_workspace(
        self,
        dim: int,
        model_id: str,
        key_check: bytes,
        workspace_id: str | None = None,
        *,
        mode: str = MODE_SERVER_SEARCH,
        max_workspaces: int | None = None,
    ) -> tuple[str, str]:
        """Create an empty workspace of `mode` (sync.records.MODES); return its id (a
        random one when none is given) and its bearer token, shown this once.
        BadRequest for an invalid field or mode (`new_workspace_id`), WorkspaceExists
        for a taken id, PermissionDenied once the store holds `max_workspaces`. The
        check and the creation are atomic against concurrent creators in any process."""
        ...

    def authenticate(self, workspace_id: str, token: str | None, *,
                     owner_only: bool = False) -> None:
        """Return if `token` is the bearer token of `workspace_id` or one of its invitee
        tokens that has not expired (sync.store.core.invitees); with `owner_only`, only the
        workspace's own token. AuthError (401) without a token, for one of no workspace
        or for an expired invitee token; WorkspaceNotFound (404) for an unknown
        workspace, and only to a valid token, so that a caller without one learns
        nothing of which workspaces exist; PermissionDenied (403) for another
        workspace's token, or an invitee token where `owner_only`. Tokens are compared
        in constant time."""
        ...

    def create_invitee(self, workspace_id: str, expires_in: float | None = None
                       ) -> tuple[str, str, float | None]:
        """A new invitee token of `workspace_id`, valid for `expires_in` seconds (None:
        until revoked): (token id, token, expires_at); the token is shown this once.
        BadRequest for an expiry out of bounds. Does not authenticate."""
        ...

    def invitees(self, workspace_id: str) -> list[Invitee]:
        """The workspace's invitee tokens not revoked, expired ones included, oldest
        first."""
        ...

    def revoke_invitee(self, workspace_id: str, token_id: str) -> None:
        """Revoke one invitee token, from the next request on, on every process and
        replica. InviteeNotFound (404) for an id the workspace does not have."""
        ...

    def workspace(self, workspace_id: str) -> WorkspaceBackend:
        """The workspace (opened on first use, then the same object); WorkspaceNotFound
        if there is none. Does not authenticate: a server calls `authenticate` first."""
        ...

    def workspace_ids(self) -> list[str]:
        """Every workspace's id, sorted."""
        ...

    def close(self) -> None:
        """Close every open workspace and the store; a second close does nothing, and
        any other call afterwards raises StoreError."""
        ...

