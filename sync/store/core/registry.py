"""A store's registry of workspaces and bearer tokens, written once for every backend:
`Registry` creates workspaces, authenticates tokens (the workspace's own, kept as SHA-256
only, and its invitee tokens, sync.store.core.invitees), manages invitee tokens, opens
and caches workspaces and closes them. Each backend keeps the rows in its own tables
with its own SQL behind a `RegistryTable` (sync.store.embedded.registry's SQLite,
sync.store.postgres.registry's PostgreSQL); the token rules live here alone.

Locking. A table that is one connection (`RegistryTable.serial`, SQLite) is read and
written under the registry's lock, held for the whole of a request (as the caches and
the open workspaces are); a table over a pool of connections (PostgreSQL) is read
without it, and the lock guards only the caches and the open workspaces.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

from sync.records import MODE_SERVER_SEARCH, MODES
from sync.store.core.backend import WorkspaceBackend, WorkspaceRecord
from sync.store.core.checks import WORKSPACE_ID_RE, new_workspace_id, token_hash
from sync.store.core.invitees import (
    OWNER_ONLY,
    Invitee,
    check_token_id,
    expired,
    expired_error,
    new_invitee,
)
from sync.wire import (
    AuthError,
    InviteeNotFound,
    Limits,
    PermissionDenied,
    StoreCorrupt,
    StoreError,
    WorkspaceExists,
    WorkspaceNotFound,
)

__all__ = ["Registry", "RegistryTable", "taken_error"]

log = logging.getLogger(__name__)



class OpenWorkspace(WorkspaceBackend, Protocol):
    """A workspace as a registry keeps it open: one it closes when it closes."""

    def close(self) -> None: ...


W_co = TypeVar("W_co", bound=OpenWorkspace, covariant=True)
W = TypeVar("W", bound=OpenWorkspace)


def taken_error(workspace_id: str) -> StoreError:
    """What `RegistryTable.create` raises for an id already taken (409)."""
    return WorkspaceExists(f"workspace {workspace_id} already exists")


class RegistryTable(Protocol[W_co]):
    """A backend's rows of workspaces and invitee tokens, each call its own SQL: what
    `Registry` reads and writes. Rows are tuples in the columns' order named below."""

    #: True for a table that is one connection, which the registry's lock guards.
    serial: bool
    #: The store as messages name it (a data dir, a database URL without its password).
    where: str
    #: Where the registry's rows are, with what to do, for a StoreCorrupt message.
    holder: str

    def create(self, workspace_id: str, token_sha256: bytes, dim: int, model_id: str,
               key_check: bytes, mode: str, max_workspaces: int | None) -> None:
        """Insert a workspace and make whatever it needs besides its row, atomically
        against creators in any process: `taken_error` for a taken id, and
        `quota_check` with `max_workspaces`, before anything is written."""
        ...

    def record_row(self, workspace_id: str) -> tuple[Any, ...] | None:
        """(id, dim, model_id, key_check, created_at, mode) of a workspace, or None."""
        ...

    def owner_row(self, digest: bytes) -> tuple[str, bytes] | None:
        """(id, token_sha256) of the workspace whose token has this SHA-256, or None."""
        ...

    def invitee_row(self, digest: bytes) -> tuple[str, float | None, bytes] | None:
        """(workspace id, expires_at, token_sha256) of an invitee token, or None."""
        ...

    def add_invitee(self, token_sha256: bytes, token_id: str, workspace_id: str,
                    created_at: float, expires_at: float | None) -> None: ...

    def invitee_rows(self, workspace_id: str) -> list[tuple[str, float, float | None]]:
        """(token_id, created_at, expires_at) of a workspace's invitee tokens, oldest
        first."""
        ...

    def remove_invitee(self, workspace_id: str, token_id: str) -> int:
        """Delete one invitee token; the rows deleted."""
        ...

    def ids(self) -> list[str]:
        """Every workspace's id, sorted."""
        ...

    def open_workspace(self, record: WorkspaceRecord) -> W_co:
        """The workspace of `record`, opened."""
        ...

    def close(self) -> None:
        """Close the connections (after every workspace is closed)."""
        ...


class Registry(Generic[W]):
    """All workspaces of one store, and their bearer tokens (kept as SHA-256 only), over
    the backend's `table`; the registry half of sync.store.core.backend.StoreBackend."""

    def __init__(self, table: RegistryTable[W], limits: Limits) -> None:
        self.limits = limits
        self._table = table
        self._lock = threading.RLock()  # guards the caches, _open, and a serial table
        self._open: dict[str, W] = {}
        self._owners: dict[bytes, str] = {}  # sha256(token) -> workspace id, once seen
        self._closed = False

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
        """Create an empty workspace of `mode` (one of sync.records.MODES); returns
        (workspace_id, bearer token). The token is shown this once: the store keeps only
        its SHA-256. With `max_workspaces`, refuse (PermissionDenied) once the store
        holds that many."""
        workspace_id = new_workspace_id(self.limits, dim, model_id, key_check, workspace_id,
                                        mode)
        token = secrets.token_urlsafe(32)
        with self._session():
            self._check_open()
            self._table.create(workspace_id, token_hash(token), dim, model_id, key_check,
                               mode, max_workspaces)
        log.info("created workspace %s (dim %d, %s)", workspace_id, dim, mode)
        return workspace_id, token

    def authenticate(self, workspace_id: str, token: str | None, *,
                     owner_only: bool = False) -> None:
        """Raise unless `token` is the bearer token of `workspace_id`, or one of its
        invitee tokens (sync.store.core.invitees) that has not expired; with `owner_only`,
        only the workspace's own token.

        AuthError (401) without a token or with one of no workspace, or an expired
        invitee token; WorkspaceNotFound (404) for an unknown workspace, and only then,
        so that the existence of a workspace is not revealed to callers holding no valid
        token; PermissionDenied (403) for the token of another workspace, or an invitee
        token where `owner_only`.
        """
        if not token:
            raise AuthError("missing bearer token (send 'Authorization: Bearer <token>')")
        digest = token_hash(token)
        with self._session():
            self._check_open()
            owner = self._owner(digest)
            invitee = owner is None
            if owner is None:
                owner = self._invitee_owner(digest)
            if owner is None:
                raise AuthError("invalid bearer token")
            record = self._record(workspace_id)  # raises WorkspaceNotFound
        if not hmac.compare_digest(owner.encode(), record.workspace_id.encode()):
            raise PermissionDenied("this token belongs to another workspace")
        if invitee and owner_only:
            raise PermissionDenied(OWNER_ONLY)

    def create_invitee(self, workspace_id: str, expires_in: float | None = None
                       ) -> tuple[str, str, float | None]:
        """A new invitee token of `workspace_id`: (token id, token, expires_at). The token
        is shown this once. The caller has authenticated the owner."""
        token_id, token, created, expires_at = new_invitee(expires_in)
        with self._session():
            self._check_open()
            self._record(workspace_id)
            self._table.add_invitee(token_hash(token), token_id, workspace_id, created,
                                    expires_at)
        log.info("workspace %s: invitee token %s made", workspace_id, token_id)
        return token_id, token, expires_at

    def invitees(self, workspace_id: str) -> list[Invitee]:
        """The invitee tokens of `workspace_id` not revoked (expired ones included), oldest
        first."""
        with self._session():
            self._check_open()
            rows = self._table.invitee_rows(workspace_id)
        return [Invitee(r[0], float(r[1]), None if r[2] is None else float(r[2]))
                for r in rows]

    def revoke_invitee(self, workspace_id: str, token_id: str) -> None:
        """Revoke one invitee token: refused from the next request on. InviteeNotFound
        (404) for an id the workspace does not have."""
        check_token_id(token_id)
        with self._session():
            self._check_open()
            gone = self._table.remove_invitee(workspace_id, token_id)
        if not gone:
            raise InviteeNotFound(f"workspace {workspace_id} has no invitee token {token_id}")
        log.info("workspace %s: invitee token %s revoked", workspace_id, token_id)

    def workspace(self, workspace_id: str) -> W:
        """The open store of a workspace (opened on first use, then shared)."""
        with self._session():
            self._check_open()
            with self._lock:
                ws = self._open.get(workspace_id)
            if ws is None:
                ws = self._table.open_workspace(self._record(workspace_id))
                with self._lock:
                    ws = self._open.setdefault(workspace_id, ws)
            return ws

    def record(self, workspace_id: str) -> WorkspaceRecord:
        """What the registry holds of `workspace_id` (its dim, model, key check, mode)."""
        with self._session():
            self._check_open()
            return self._record(workspace_id)

    def workspace_ids(self) -> list[str]:
        with self._session():
            self._check_open()
            return self._table.ids()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ws in self._open.values():
                ws.close()
            self._open.clear()
        self._table.close()

    # -- internals ------------------------------------------------------------------

    def _session(self) -> AbstractContextManager[object]:
        """Held around a request's use of the table: the lock for a serial table."""
        return self._lock if self._table.serial else nullcontext()

    def _record(self, workspace_id: str) -> WorkspaceRecord:
        if not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.match(workspace_id):
            raise WorkspaceNotFound(f"no workspace {str(workspace_id)[:80]!r}")
        row = self._table.record_row(workspace_id)
        if row is None:
            raise WorkspaceNotFound(f"no workspace {workspace_id!r}")
        if row[5] not in MODES:
            raise StoreCorrupt(f"workspace {workspace_id} has the unknown mode {row[5]!r} in"
                               f" {self._table.holder}")
        return WorkspaceRecord(row[0], int(row[1]), row[2], bytes(row[3]), float(row[4]), row[5])

    def _owner(self, digest: bytes) -> str | None:
        with self._lock:
            owner = self._owners.get(digest)
        if owner is not None:
            return owner
        # Not cached: a workspace created since, possibly by another process or replica.
        row = self._table.owner_row(digest)
        if row is None or not hmac.compare_digest(bytes(row[1]), digest):
            return None
        with self._lock:
            self._owners[digest] = row[0]
        return str(row[0])

    def _invitee_owner(self, digest: bytes) -> str | None:
        """The workspace of an invitee token, read every time (a revocation or an expiry
        takes effect at once, on every replica); AuthError once it has expired."""
        row = self._table.invitee_row(digest)
        if row is None or not hmac.compare_digest(bytes(row[2]), digest):
            return None
        if expired(row[1]):
            raise expired_error()
        return str(row[0])

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self._table.where} is closed")
