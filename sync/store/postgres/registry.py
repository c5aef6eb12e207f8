"""The store on PostgreSQL with pgvector: what many stateless `codeveil serve` replicas
share. Same operations, limits, errors and answers as the embedded store (sync.store):
`PgStore` is its registry of workspaces and tokens (the rules of
sync.store.core.registry over the SQL of `RegistryTables`), tuned by one `PgOptions`; a
workspace's tree, rows and search: sync.store.postgres.workspace; the tables:
sync.store.postgres.schema; connections: sync.store.postgres.conn.
"""

from __future__ import annotations

import time
from typing import Any

from sync.store.core.backend import WorkspaceRecord
from sync.store.core.checks import quota_check
from sync.store.core.registry import Registry, taken_error
from sync.store.db_url import is_database_url, mask_url
from sync.store.postgres.conn import Pool
from sync.store.postgres.options import PgOptions
from sync.store.postgres.schema import CREATE_LOCK, ensure_schema
from sync.store.postgres.workspace import PgWorkspace, W
from sync.wire import StoreError

__all__ = ["PgStore"]


class RegistryTables:
    """The workspaces and invitees tables of one database: the `RegistryTable` of the
    PostgreSQL store (a pool of connections, so not `serial`)."""

    serial = False

    def __init__(self, pool: Pool, where: str, options: PgOptions) -> None:
        self._pool = pool
        self.where = where
        self.options = options
        self.holder = f"the database {where}"

    def create(self, workspace_id: str, token_sha256: bytes, dim: int, model_id: str,
               key_check: bytes, mode: str, max_workspaces: int | None) -> None:
        with self._pool.connection() as conn, conn.transaction():
            # Held to the commit: the count and the insert of concurrent creators, on
            # any replica, do not interleave.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
            if conn.execute(f"SELECT 1 FROM {W}.workspaces WHERE id = %s",
                            (workspace_id,)).fetchone():
                raise taken_error(workspace_id)
            if max_workspaces is not None:
                row = conn.execute(f"SELECT count(*) FROM {W}.workspaces").fetchone()
                assert row is not None
                quota_check(row[0], max_workspaces)
            conn.execute(
                f"INSERT INTO {W}.workspaces (id, token_sha256, dim, model_id, key_check,"
                " created_at, mode) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (workspace_id, token_sha256, dim, model_id, key_check, time.time(), mode),
            )

    def record_row(self, workspace_id: str) -> tuple[Any, ...] | None:
        with self._pool.connection() as conn:
            return conn.execute(
                f"SELECT id, dim, model_id, key_check, created_at, mode FROM {W}.workspaces"
                " WHERE id = %s", (workspace_id,),
            ).fetchone()

    def owner_row(self, digest: bytes) -> tuple[str, bytes] | None:
        with self._pool.connection() as conn:
            return conn.execute(
                f"SELECT id, token_sha256 FROM {W}.workspaces WHERE token_sha256 = %s",
                (digest,),
            ).fetchone()

    def invitee_row(self, digest: bytes) -> tuple[str, float | None, bytes] | None:
        with self._pool.connection() as conn:
            return conn.execute(
                f"SELECT workspace, expires_at, token_sha256 FROM {W}.invitees"
                " WHERE token_sha256 = %s", (digest,)).fetchone()

    def add_invitee(self, token_sha256: bytes, token_id: str, workspace_id: str,
                    created_at: float, expires_at: float | None) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                f"INSERT INTO {W}.invitees (token_sha256, token_id, workspace, created_at,"
                " expires_at) VALUES (%s, %s, %s, %s, %s)",
                (token_sha256, token_id, workspace_id, created_at, expires_at))

    def invitee_rows(self, workspace_id: str) -> list[tuple[str, float, float | None]]:
        with self._pool.connection() as conn:
            return conn.execute(
                f"SELECT token_id, created_at, expires_at FROM {W}.invitees"
                " WHERE workspace = %s ORDER BY created_at", (workspace_id,)).fetchall()

    def remove_invitee(self, workspace_id: str, token_id: str) -> int:
        with self._pool.connection() as conn, conn.transaction():
            return conn.execute(
                f"DELETE FROM {W}.invitees WHERE workspace = %s AND token_id = %s",
                (workspace_id, token_id)).rowcount

    def ids(self) -> list[str]:
        with self._pool.connection() as conn:
            return [r for (r,) in conn.execute(f"SELECT id FROM {W}.workspaces ORDER BY id")]

    def open_workspace(self, record: WorkspaceRecord) -> PgWorkspace:
        return PgWorkspace(self._pool, record, self.options)

    def close(self) -> None:
        self._pool.close()


class PgStore(Registry[PgWorkspace]):
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
        self._pool = Pool(url, self.options.pool_size)
        with self._pool.connection() as conn:
            ensure_schema(conn, self.where)
        super().__init__(RegistryTables(self._pool, self.where, self.options),
                         self.options.limits)

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
