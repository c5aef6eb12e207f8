"""The embedded store's registry: all workspaces of one data dir (registry.sqlite: id,
sha256(token), dim, model id, key check, created_at, mode; and the invitee tokens,
sync.store.core.invitees), creating them, checking their tokens and opening them
(sync.store.embedded.workspace). The rules are sync.store.core.registry's; this module
is their SQL over registry.sqlite (`RegistryFile`) and the workspaces' folders.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from sync.records import MODE_SERVER_SEARCH
from sync.store.core.backend import WorkspaceRecord
from sync.store.core.checks import quota_check
from sync.store.core.registry import Registry, taken_error
from sync.store.embedded.options import StoreOptions
from sync.store.embedded.sqlite_tree import (
    REGISTRY_ADVICE,
    REGISTRY_MIGRATIONS,
    connect,
    transaction,
)
from sync.store.embedded.workspace import WorkspaceStore


class RegistryFile:
    """registry.sqlite and the workspaces' folders of one data dir: the
    `RegistryTable` of the embedded store (one connection, so `serial`)."""

    serial = True

    def __init__(self, data_dir: Path, options: StoreOptions) -> None:
        self.data_dir = data_dir
        self.options = options
        self.where = str(data_dir)
        self.holder = f"the registry {data_dir / 'registry.sqlite'}; {REGISTRY_ADVICE}"
        self._registry = connect(data_dir / "registry.sqlite", REGISTRY_ADVICE,
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

    def create(self, workspace_id: str, token_sha256: bytes, dim: int, model_id: str,
               key_check: bytes, mode: str, max_workspaces: int | None) -> None:
        path = self._workspace_path(workspace_id)
        # The registry's write lock, held from the check to the insert, serialises
        # creators in other processes too.
        with transaction(self._registry) as conn:
            taken = conn.execute("SELECT 1 FROM workspaces WHERE id = ?", (workspace_id,))
            if taken.fetchone():
                raise taken_error(workspace_id)
            if max_workspaces is not None:
                (count,) = conn.execute("SELECT count(*) FROM workspaces").fetchone()
                quota_check(count, max_workspaces)
            if path.exists():  # left by a create that died before registering it
                shutil.rmtree(path)
            WorkspaceStore.initialize(path, dim, mode)
            conn.execute(
                "INSERT INTO workspaces (id, token_sha256, dim, model_id, key_check,"
                " created_at, mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (workspace_id, token_sha256, dim, model_id, key_check, time.time(), mode),
            )

    def record_row(self, workspace_id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._registry.execute(
            "SELECT id, dim, model_id, key_check, created_at, mode FROM workspaces"
            " WHERE id = ?",
            (workspace_id,),
        ).fetchone()
        return row

    def owner_row(self, digest: bytes) -> tuple[str, bytes] | None:
        row: tuple[str, bytes] | None = self._registry.execute(
            "SELECT id, token_sha256 FROM workspaces WHERE token_sha256 = ?", (digest,)
        ).fetchone()
        return row

    def invitee_row(self, digest: bytes) -> tuple[str, float | None, bytes] | None:
        row: tuple[str, float | None, bytes] | None = self._registry.execute(
            "SELECT workspace_id, expires_at, token_sha256 FROM invitees"
            " WHERE token_sha256 = ?", (digest,)).fetchone()
        return row

    def add_invitee(self, token_sha256: bytes, token_id: str, workspace_id: str,
                    created_at: float, expires_at: float | None) -> None:
        with transaction(self._registry) as conn:
            conn.execute(
                "INSERT INTO invitees (token_sha256, token_id, workspace_id, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?)",
                (token_sha256, token_id, workspace_id, created_at, expires_at))

    def invitee_rows(self, workspace_id: str) -> list[tuple[str, float, float | None]]:
        rows: list[tuple[str, float, float | None]] = self._registry.execute(
            "SELECT token_id, created_at, expires_at FROM invitees WHERE workspace_id = ?"
            " ORDER BY created_at", (workspace_id,)).fetchall()
        return rows

    def remove_invitee(self, workspace_id: str, token_id: str) -> int:
        with transaction(self._registry) as conn:
            gone: int = conn.execute(
                "DELETE FROM invitees WHERE workspace_id = ? AND token_id = ?",
                (workspace_id, token_id)).rowcount
        return gone

    def ids(self) -> list[str]:
        return [r for (r,) in self._registry.execute("SELECT id FROM workspaces ORDER BY id")]

    def open_workspace(self, record: WorkspaceRecord) -> WorkspaceStore:
        return WorkspaceStore(self._workspace_path(record.workspace_id), record, self.options)

    def close(self) -> None:
        self._registry.close()

    def _workspace_path(self, workspace_id: str) -> Path:
        return self.data_dir / "workspaces" / workspace_id


class Store(Registry[WorkspaceStore]):
    """All workspaces of one data dir, and their bearer tokens (kept as SHA-256 only).
    `options` tunes the store and every workspace it opens (`StoreOptions`)."""

    def __init__(
        self, data_dir: str | os.PathLike[str], *, options: StoreOptions | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.options = StoreOptions() if options is None else options
        (self.data_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        super().__init__(RegistryFile(self.data_dir, self.options), self.options.limits)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
