"""The embedded store's registry: all workspaces of one data dir (registry.sqlite: id,
sha256(token), dim, model id, key check, created_at, mode; and the invitee tokens,
sync.store.core.invitees), creating them, checking their tokens and opening them
(sync.store.embedded.workspace).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from sync.records import MODE_SERVER_SEARCH, MODES
from sync.store.core.backend import WorkspaceRecord
from sync.store.core.checks import WORKSPACE_ID_RE, new_workspace_id, quota_check, token_hash
from sync.store.core.invitees import (
    OWNER_ONLY,
    Invitee,
    check_token_id,
    expired,
    expired_error,
    new_invitee,
)
from sync.store.embedded.options import StoreOptions
from sync.store.embedded.sqlite_tree import (
    REGISTRY_ADVICE,
    REGISTRY_MIGRATIONS,
    connect,
    transaction,
)
from sync.store.embedded.workspace import WorkspaceStore
from sync.wire import (
    AuthError,
    InviteeNotFound,
    PermissionDenied,
    StoreCorrupt,
    StoreError,
    WorkspaceExists,
    WorkspaceNotFound,
)

log = logging.getLogger(__name__)



class Store:
    """All workspaces of one data dir, and their bearer tokens (kept as SHA-256 only).
    `options` tunes the store and every workspace it opens (`StoreOptions`)."""

    def __init__(
        self, data_dir: str | os.PathLike[str], *, options: StoreOptions | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.options = StoreOptions() if options is None else options
        self.limits = self.options.limits
        (self.data_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()  # guards the registry connection and _open
        self._registry = connect(self.data_dir / "registry.sqlite", REGISTRY_ADVICE,
                                 "the workspace registry", REGISTRY_MIGRATIONS)
        self._registry.executescript(
            f"""
            CREATE TABLE IF NOT EXISTS workspaces (
                id TEXT PRIMARY KEY,
                token_sha256 BLOB NOT NULL UNIQUE,
                dim INTEGER NOT NULL,
                model_id TEXT NOT NULL,
                key_check BLOB NOT NULL,
                created_at REAL NOT NULL,
                mode TEXT NOT NULL DEFAULT '{MODE_SERVER_SEARCH}'
            );
            -- Added beside the workspaces without a format change: a codeveil that
            -- predates it never reads it, and refuses its tokens as unknown ones.
            CREATE TABLE IF NOT EXISTS invitees (
                token_sha256 BLOB PRIMARY KEY,
                token_id TEXT NOT NULL UNIQUE,
                workspace_id TEXT NOT NULL,
                created_at REAL NOT NULL,
                expires_at REAL
            );
            CREATE INDEX IF NOT EXISTS invitees_workspace ON invitees (workspace_id);
            """
        )
        self._open: dict[str, WorkspaceStore] = {}
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
        path = self._workspace_path(workspace_id)
        with self._lock:
            self._check_open()
            # The registry's write lock, held from the check to the insert, serialises
            # creators in other processes too.
            with transaction(self._registry) as conn:
                taken = conn.execute("SELECT 1 FROM workspaces WHERE id = ?", (workspace_id,))
                if taken.fetchone():
                    raise WorkspaceExists(f"workspace {workspace_id} already exists")
                if max_workspaces is not None:
                    (count,) = conn.execute("SELECT count(*) FROM workspaces").fetchone()
                    quota_check(count, max_workspaces)
                if path.exists():  # left by a create that died before registering it
                    shutil.rmtree(path)
                WorkspaceStore.initialize(path, dim, mode)
                conn.execute(
                    "INSERT INTO workspaces (id, token_sha256, dim, model_id, key_check,"
                    " created_at, mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (workspace_id, token_hash(token), dim, model_id, key_check, time.time(),
                     mode),
                )
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
        with self._lock:
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
        with self._lock:
            self._check_open()
            self._record(workspace_id)
            with transaction(self._registry) as conn:
                conn.execute(
                    "INSERT INTO invitees (token_sha256, token_id, workspace_id, created_at,"
                    " expires_at) VALUES (?, ?, ?, ?, ?)",
                    (token_hash(token), token_id, workspace_id, created, expires_at))
        log.info("workspace %s: invitee token %s made", workspace_id, token_id)
        return token_id, token, expires_at

    def invitees(self, workspace_id: str) -> list[Invitee]:
        """The invitee tokens of `workspace_id` not revoked (expired ones included), oldest
        first."""
        with self._lock:
            self._check_open()
            rows = self._registry.execute(
                "SELECT token_id, created_at, expires_at FROM invitees WHERE workspace_id = ?"
                " ORDER BY created_at", (workspace_id,)).fetchall()
        return [Invitee(r[0], float(r[1]), None if r[2] is None else float(r[2]))
                for r in rows]

    def revoke_invitee(self, workspace_id: str, token_id: str) -> None:
        """Revoke one invitee token: refused from the next request on. InviteeNotFound
        (404) for an id the workspace does not have."""
        check_token_id(token_id)
        with self._lock:
            self._check_open()
            with transaction(self._registry) as conn:
                gone = conn.execute(
                    "DELETE FROM invitees WHERE workspace_id = ? AND token_id = ?",
                    (workspace_id, token_id)).rowcount
        if not gone:
            raise InviteeNotFound(f"workspace {workspace_id} has no invitee token {token_id}")
        log.info("workspace %s: invitee token %s revoked", workspace_id, token_id)

    def workspace(self, workspace_id: str) -> WorkspaceStore:
        """The open store of a workspace (opened on first use, then shared)."""
        with self._lock:
            self._check_open()
            ws = self._open.get(workspace_id)
            if ws is None:
                record = self._record(workspace_id)
                ws = WorkspaceStore(self._workspace_path(workspace_id), record, self.options)
                self._open[workspace_id] = ws
            return ws

    def record(self, workspace_id: str) -> WorkspaceRecord:
        """What the registry holds of `workspace_id` (its dim, model, key check, mode)."""
        with self._lock:
            self._check_open()
            return self._record(workspace_id)

    def workspace_ids(self) -> list[str]:
        with self._lock:
            self._check_open()
            return [r for (r,) in self._registry.execute("SELECT id FROM workspaces ORDER BY id")]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ws in self._open.values():
                ws.close()
            self._open.clear()
            self._registry.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _workspace_path(self, workspace_id: str) -> Path:
        return self.data_dir / "workspaces" / workspace_id

    def _record(self, workspace_id: str) -> WorkspaceRecord:
        """Caller holds _lock."""
        if not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.match(workspace_id):
            raise WorkspaceNotFound(f"no workspace {str(workspace_id)[:80]!r}")
        row = self._registry.execute(
            "SELECT id, dim, model_id, key_check, created_at, mode FROM workspaces"
            " WHERE id = ?",
            (workspace_id,),
        ).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"no workspace {workspace_id!r}")
        if row[5] not in MODES:
            raise StoreCorrupt(f"workspace {workspace_id} has the unknown mode {row[5]!r} in"
                               f" the registry {self.data_dir / 'registry.sqlite'};"
                               f" {REGISTRY_ADVICE}")
        return WorkspaceRecord(row[0], int(row[1]), row[2], bytes(row[3]), float(row[4]), row[5])

    def _owner(self, digest: bytes) -> str | None:
        """Caller holds _lock."""
        owner = self._owners.get(digest)
        if owner is None:
            # Not cached: a workspace created since, possibly by another process.
            row = self._registry.execute(
                "SELECT id, token_sha256 FROM workspaces WHERE token_sha256 = ?", (digest,)
            ).fetchone()
            if row is None or not hmac.compare_digest(bytes(row[1]), digest):
                return None
            owner = self._owners[digest] = row[0]
        return owner

    def _invitee_owner(self, digest: bytes) -> str | None:
        """The workspace of an invitee token, read every time (a revocation or an expiry
        takes effect at once); AuthError once it has expired. Caller holds _lock."""
        row = self._registry.execute(
            "SELECT workspace_id, expires_at, token_sha256 FROM invitees"
            " WHERE token_sha256 = ?", (digest,)).fetchone()
        if row is None or not hmac.compare_digest(bytes(row[2]), digest):
            return None
        if expired(row[1]):
            raise expired_error()
        return str(row[0])

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.data_dir} is closed")
