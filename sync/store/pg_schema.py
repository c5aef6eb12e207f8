"""The tables of the PostgreSQL store (sync.store.postgres), their version, and migrations.

Everything lives in the schema `codeveil`, so the database may hold other applications'
tables too::

    codeveil.schema_version   one row: the layout's version (SCHEMA_VERSION)
    codeveil.workspaces       id, sha256(token), dim, model id, key check, created_at, mode
    codeveil.nodes            the Merkle trees: (workspace, key) -> parent, value, is_dir
    codeveil.rows             chunk rows: rid, workspace, fid, chunk_id, meta, and the
                              encrypted vector (NULL in a sealed workspace)

As in the embedded store every column but dim, model id, mode and created_at holds a
keyed hash or ciphertext. The `vector` column has no declared dimension because
workspaces differ in dim; the store checks every vector against its workspace's.

A replica that finds a newer version than SCHEMA_VERSION refuses to start (an older
codeveil could misread the tables); an older one is migrated in one transaction under an
advisory lock, so replicas starting together migrate once.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from sync.wire import StoreCorrupt

SCHEMA = "codeveil"
SCHEMA_VERSION = 1
# pg_advisory_xact_lock keys: one for schema changes, one for creating workspaces.
SCHEMA_LOCK = 0x636F_6465_7665_0001
CREATE_LOCK = 0x636F_6465_7665_0002

_CREATE = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE {SCHEMA}.schema_version (version integer NOT NULL);
CREATE TABLE {SCHEMA}.workspaces (
    id text PRIMARY KEY,
    token_sha256 bytea NOT NULL UNIQUE,
    dim integer NOT NULL,
    model_id text NOT NULL,
    key_check bytea NOT NULL,
    created_at double precision NOT NULL,
    mode text NOT NULL
);
CREATE TABLE {SCHEMA}.nodes (
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    key bytea NOT NULL,
    parent bytea,            -- NULL for the root
    value bytea,             -- NULL while pending
    is_dir boolean NOT NULL,
    PRIMARY KEY (workspace, key)
);
CREATE INDEX nodes_parent ON {SCHEMA}.nodes (workspace, parent);
CREATE TABLE {SCHEMA}.rows (
    rid bigserial PRIMARY KEY,  -- in insertion order: a file's rows come back as sent
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    fid bigint NOT NULL,     -- the file key's first 8 bytes (sync.store.fid_of)
    chunk_id bytea NOT NULL,
    meta bytea NOT NULL,
    vector vector            -- NULL in a sealed workspace
);
CREATE INDEX rows_fid ON {SCHEMA}.rows (workspace, fid);
"""

# version n -> what takes a database from n to n + 1
MIGRATIONS: dict[int, Callable[[psycopg.Connection], None]] = {}


def ensure_schema(conn: psycopg.Connection, where: str) -> None:
    """Create the tables, or check and migrate them; `where` names the database (its
    password masked) in errors."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.errors.FeatureNotSupported as exc:
            raise StoreCorrupt(
                f"the database {where} lacks the pgvector extension ({exc}); install"
                " pgvector on its server (https://github.com/pgvector/pgvector)"
            ) from None
        except psycopg.errors.InsufficientPrivilege:
            raise StoreCorrupt(
                f"the database {where} has no pgvector extension and this user may not"
                " create it; run `CREATE EXTENSION vector` there as an administrator"
            ) from None
        row = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.schema_version",)).fetchone()
        if row is None or row[0] is None:
            conn.execute(_CREATE)
            conn.execute(f"INSERT INTO {SCHEMA}.schema_version VALUES (%s)", (SCHEMA_VERSION,))
            return
        found = conn.execute(f"SELECT version FROM {SCHEMA}.schema_version").fetchone()
        if found is None:
            raise StoreCorrupt(f"the database {where} has an empty {SCHEMA}.schema_version;"
                               " restore it from a backup (pg_dump)")
        version = int(found[0])
        if version > SCHEMA_VERSION:
            raise StoreCorrupt(
                f"the database {where} holds codeveil tables of version {version}, newer"
                f" than this codeveil knows ({SCHEMA_VERSION}): upgrade codeveil on every"
                " replica before starting this one"
            )
        while version < SCHEMA_VERSION:
            MIGRATIONS[version](conn)
            version += 1
            conn.execute(f"UPDATE {SCHEMA}.schema_version SET version = %s", (version,))
