"""The store on PostgreSQL with pgvector: what many stateless `codeveil serve` replicas
share. Same operations, limits, errors and answers as the embedded store (sync.store):
`PgStore` is its registry of workspaces and tokens, tuned by one `PgOptions`; a
workspace's tree, rows and search: sync.store.postgres.workspace; the tables:
sync.store.postgres.schema; connections: sync.store.postgres.conn.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time

from sync.db_url import is_database_url, mask_url
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
from sync.store.postgres.conn import Pool
from sync.store.postgres.options import PgOptions
from sync.store.postgres.schema import CREATE_LOCK, ensure_schema
from sync.store.postgres.workspace import PgWorkspace, W
from sync.wire import (
    AuthError,
    InviteeNotFound,
    PermissionDenied,
    StoreCorrupt,
    StoreError,
    WorkspaceExists,
    WorkspaceNotFound,
)

__all__ = ["PgStore"]

log = logging.getLogger(__name__)


class PgStore:
    """All workspaces in one PostgreSQL database, and their bearer tokens (kept as
    SHA-256 only); the operations of `sync.store.Store`. Any number of processes may
    open the same database at once. `options` tunes the store and every workspace it
    opens (`PgOptions`)."""

    def __init__(self, url: str, *, options: PgOptions | None = None) -> None:
        if not is_database_url(url):
            raise StoreError(f"{mask_url(url)} is not a PostgreSQL URL (postgresql://...)")
        self.url = url
        self.where = mask_url(url)
        self.options = PgOptions() if options is None else options
        self.limits = self.options.limits
        self._pool = Pool(url, self.options.pool_size)
        with self._pool.connection() as conn:
            ensure_schema(conn, self.where)
        self._lock = threading.Lock()
        self._open: dict[str, PgWorkspace] = {}
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
        """As `Store.create_workspace`: returns (workspace_id, bearer token)."""
        self._check_open()
        workspace_id = new_workspace_id(self.limits, dim, model_id, key_check, workspace_id,
                                        mode)
        token = secrets.token_urlsafe(32)
        with self._pool.connection() as conn, conn.transaction():
            # Held to the commit: the count and the insert of concurrent creators, on
            # any replica, do not interleave.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
            if conn.execute(f"SELECT 1 FROM {W}.workspaces WHERE id = %s",
                            (workspace_id,)).fetchone():
                raise WorkspaceExists(f"workspace {workspace_id} already exists")
            if max_workspaces is not None:
                row = conn.execute(f"SELECT count(*) FROM {W}.workspaces").fetchone()
                assert row is not None
                quota_check(row[0], max_workspaces)
            conn.execute(
                f"INSERT INTO {W}.workspaces (id, token_sha256, dim, model_id, key_check,"
                " created_at, mode) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (workspace_id, token_hash(token), dim, model_id, key_check, time.time(),
                 mode),
            )
        log.info("created workspace %s (dim %d, %s)", workspace_id, dim, mode)
        return workspace_id, token

    def authenticate(self, workspace_id: str, token: str | None, *,
                     owner_only: bool = False) -> None:
        """As `Store.authenticate`: 401 without a valid token (or with an expired invitee
        token), 404 for an unknown workspace (only then), 403 for the token of another
        workspace, or an invitee token where `owner_only`."""
        if not token:
            raise AuthError("missing bearer token (send 'Authorization: Bearer <token>')")
        self._check_open()
        digest = token_hash(token)
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
        """As `Store.create_invitee`."""
        self._check_open()
        token_id, token, created, expires_at = new_invitee(expires_in)
        self._record(workspace_id)
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                f"INSERT INTO {W}.invitees (token_sha256, token_id, workspace, created_at,"
                " expires_at) VALUES (%s, %s, %s, %s, %s)",
                (token_hash(token), token_id, workspace_id, created, expires_at))
        log.info("workspace %s: invitee token %s made", workspace_id, token_id)
        return token_id, token, expires_at

    def invitees(self, workspace_id: str) -> list[Invitee]:
        """As `Store.invitees`."""
        self._check_open()
        with self._pool.connection() as conn:
            rows = conn.execute(
                f"SELECT token_id, created_at, expires_at FROM {W}.invitees"
                " WHERE workspace = %s ORDER BY created_at", (workspace_id,)).fetchall()
        return [Invitee(r[0], float(r[1]), None if r[2] is None else float(r[2]))
                for r in rows]

    def revoke_invitee(self, workspace_id: str, token_id: str) -> None:
        """As `Store.revoke_invitee`."""
        check_token_id(token_id)
        self._check_open()
        with self._pool.connection() as conn, conn.transaction():
            gone = conn.execute(
                f"DELETE FROM {W}.invitees WHERE workspace = %s AND token_id = %s",
                (workspace_id, token_id)).rowcount
        if not gone:
            raise InviteeNotFound(f"workspace {workspace_id} has no invitee token {token_id}")
        log.info("workspace %s: invitee token %s revoked", workspace_id, token_id)

    def workspace(self, workspace_id: str) -> PgWorkspace:
        """The store of a workspace (made on first use, then shared)."""
        self._check_open()
        with self._lock:
            ws = self._open.get(workspace_id)
        if ws is None:
            ws = PgWorkspace(self._pool, self._record(workspace_id), self.options)
            with self._lock:
                ws = self._open.setdefault(workspace_id, ws)
        return ws

    def workspace_ids(self) -> list[str]:
        self._check_open()
        with self._pool.connection() as conn:
            return [r for (r,) in conn.execute(f"SELECT id FROM {W}.workspaces ORDER BY id")]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ws in self._open.values():
                ws.close()
            self._open.clear()
        self._pool.close()

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, workspace_id: str) -> WorkspaceRecord:
        if not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.match(workspace_id):
            raise WorkspaceNotFound(f"no workspace {str(workspace_id)[:80]!r}")
        with self._pool.connection() as conn:
            row = conn.execute(
                f"SELECT id, dim, model_id, key_check, created_at, mode FROM {W}.workspaces"
                " WHERE id = %s", (workspace_id,),
            ).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"no workspace {workspace_id!r}")
        if row[5] not in MODES:
            raise StoreCorrupt(f"workspace {workspace_id} has the unknown mode {row[5]!r} in"
                               f" the database {self.where}")
        return WorkspaceRecord(row[0], int(row[1]), row[2], bytes(row[3]), float(row[4]), row[5])

    def _owner(self, digest: bytes) -> str | None:
        with self._lock:
            owner = self._owners.get(digest)
        if owner is not None:
            return owner
        # Not cached: a workspace created since, possibly by another replica.
        with self._pool.connection() as conn:
            row = conn.execute(
                f"SELECT id, token_sha256 FROM {W}.workspaces WHERE token_sha256 = %s",
                (digest,),
            ).fetchone()
        if row is None or not hmac.compare_digest(bytes(row[1]), digest):
            return None
        with self._lock:
            self._owners[digest] = row[0]
        return str(row[0])

    def _invitee_owner(self, digest: bytes) -> str | None:
        """As `Store._invitee_owner`: read every time, so that a revocation on any
        replica takes effect at once on all."""
        with self._pool.connection() as conn:
            row = conn.execute(
                f"SELECT workspace, expires_at, token_sha256 FROM {W}.invitees"
                " WHERE token_sha256 = %s", (digest,)).fetchone()
        if row is None or not hmac.compare_digest(bytes(row[2]), digest):
            return None
        if expired(row[1]):
            raise expired_error()
        return str(row[0])

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.where} is closed")
