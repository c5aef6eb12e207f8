"""The tables of the PostgreSQL store (sync.store.postgres), their version, and migrations.

Everything lives in the schema `codeveil`, so the database may hold other applications'
tables too::

    codeveil.schema_version   one row: the layout's version (SCHEMA_VERSION)
    codeveil.workspaces       id, sha256(token), dim, model id, key check, created_at, mode
    codeveil.nodes            the Merkle trees, one per ref: (workspace, ref, key) ->
                              parent, value, is_dir
    codeveil.refs             (workspace, ref) -> when the ref last wrote
    codeveil.rows             chunk rows: rid, workspace, fid, chunk_id, meta, and the
                              encrypted vector (NULL in a sealed workspace) or the blob
                              (fid, value) the row belongs to (sealed)
    codeveil.blobs            the pool of a sealed workspace: (workspace, fid, value) ->
                              when it was left without a ref (NULL while a leaf names it)
    codeveil.invitees         invitee tokens (sync.store.core.invitees): sha256(token), token
                              id, workspace, created_at, expires_at

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

from sync.records import DEFAULT_REF, MODE_SEALED
from sync.store.core.rows import fid_of
from sync.wire import StoreCorrupt

SCHEMA = "codeveil"
# 2: one tree per ref (nodes gain a ref column; the one tree became the default ref's)
# and a sealed workspace's rows grouped by blob (docs/architecture.md, "Refs and the
# blob pool").
# 3: invitee tokens (sync.store.core.invitees).
SCHEMA_VERSION = 3
# pg_advisory_xact_lock keys: one for schema changes, one for creating workspaces.
SCHEMA_LOCK = 0x636F_6465_7665_0001
CREATE_LOCK = 0x636F_6465_7665_0002
# The time in refs.synced and blobs.orphaned: the database's clock, one for every
# replica, so a grace period or a ref's age does not depend on which replica wrote it.
NOW = "extract(epoch FROM clock_timestamp())"

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
    ref bytea NOT NULL,      -- the tree's ref id (16 zero bytes: the default ref)
    key bytea NOT NULL,
    parent bytea,            -- NULL for the root
    value bytea,             -- NULL while pending
    is_dir boolean NOT NULL,
    PRIMARY KEY (workspace, ref, key)
);
CREATE INDEX nodes_parent ON {SCHEMA}.nodes (workspace, ref, parent);
"""
_ROWS = f"""
CREATE TABLE {SCHEMA}.rows (
    rid bigserial PRIMARY KEY,  -- in insertion order: a file's rows come back as sent
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    fid bigint NOT NULL,     -- the file key's first 8 bytes (sync.store.fid_of)
    chunk_id bytea NOT NULL,
    meta bytea NOT NULL,
    vector vector,           -- NULL in a sealed workspace
    value bytea              -- sealed: the blob's leaf value; NULL in server-search
);
"""
# A file's rows (server-search) and a blob's (sealed) by one index.
_ROWS_INDEX = f"CREATE INDEX rows_blob ON {SCHEMA}.rows (workspace, fid, value);"

# The parts of version 2 that version 1 lacked: created by a new database and by the
# migration alike.
_POOL = f"""
CREATE INDEX nodes_value ON {SCHEMA}.nodes (workspace, value);
CREATE TABLE {SCHEMA}.refs (
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    ref bytea NOT NULL,
    synced double precision NOT NULL,  -- seconds since the epoch, the database's clock
    PRIMARY KEY (workspace, ref)
);
CREATE TABLE {SCHEMA}.blobs (
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    fid bigint NOT NULL,
    value bytea NOT NULL,
    orphaned double precision,  -- when no leaf named it any more; NULL while one does
    PRIMARY KEY (workspace, fid, value)
);
-- every apply looks for the blobs whose grace period ran out
CREATE INDEX blobs_orphaned ON {SCHEMA}.blobs (workspace, orphaned)
    WHERE orphaned IS NOT NULL;
"""
_INVITEES = f"""
CREATE TABLE {SCHEMA}.invitees (
    token_sha256 bytea PRIMARY KEY,
    token_id text NOT NULL UNIQUE,
    workspace text NOT NULL REFERENCES {SCHEMA}.workspaces (id) ON DELETE CASCADE,
    created_at double precision NOT NULL,
    expires_at double precision  -- NULL: never
);
CREATE INDEX invitees_workspace ON {SCHEMA}.invitees (workspace);
"""


def _to_3(conn: psycopg.Connection) -> None:
    """Version 2 -> 3: the invitee tokens' table."""
    conn.execute(_INVITEES)


def _to_2(conn: psycopg.Connection) -> None:
    """Version 1 -> 2, inside `ensure_schema`'s transaction (a crash leaves version 1
    whole, and the next start migrates again): every workspace's one tree becomes its
    default ref's, and a sealed workspace's rows name their blob, the value of their
    file's committed leaf (rows of a pending leaf, whose file the next sync sends
    again, are dropped), as the embedded store's format 4 (sync.store.embedded.pool.tree_to_4)."""
    S = SCHEMA
    conn.execute(f"ALTER TABLE {S}.nodes ADD COLUMN ref bytea NOT NULL"
                 f" DEFAULT '\\x{DEFAULT_REF.hex()}'::bytea")
    conn.execute(f"ALTER TABLE {S}.nodes ALTER COLUMN ref DROP DEFAULT")
    conn.execute(f"ALTER TABLE {S}.nodes DROP CONSTRAINT nodes_pkey")
    conn.execute(f"ALTER TABLE {S}.nodes ADD PRIMARY KEY (workspace, ref, key)")
    conn.execute(f"DROP INDEX {S}.nodes_parent")
    conn.execute(f"CREATE INDEX nodes_parent ON {S}.nodes (workspace, ref, parent)")
    conn.execute(f"ALTER TABLE {S}.rows ADD COLUMN value bytea")
    conn.execute(_POOL)
    conn.execute(f"INSERT INTO {S}.refs (workspace, ref, synced)"
                 f" SELECT workspace, ref, {NOW} FROM {S}.nodes GROUP BY workspace, ref")
    leaves = conn.execute(
        f"SELECT n.workspace, n.key, n.value FROM {S}.nodes n"
        f" JOIN {S}.workspaces w ON w.id = n.workspace AND w.mode = %s"
        " WHERE NOT n.is_dir AND n.value IS NOT NULL", (MODE_SEALED,)).fetchall()
    params = ([w for w, _, _ in leaves], [fid_of(bytes(k)) for _, k, _ in leaves],
              [v for _, _, v in leaves])
    conn.execute(
        f"UPDATE {S}.rows r SET value = l.value"
        " FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) AS l (workspace, fid, value)"
        " WHERE r.workspace = l.workspace AND r.fid = l.fid", params)
    conn.execute(f"DELETE FROM {S}.rows r USING {S}.workspaces w WHERE w.id = r.workspace"
                 " AND w.mode = %s AND r.value IS NULL", (MODE_SEALED,))
    conn.execute(
        f"INSERT INTO {S}.blobs (workspace, fid, value)"
        " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[])"
        " ON CONFLICT DO NOTHING", params)
    conn.execute(f"DROP INDEX {S}.rows_fid")
    conn.execute(_ROWS_INDEX)


# version n -> what takes a database from n to n + 1
MIGRATIONS: dict[int, Callable[[psycopg.Connection], None]] = {1: _to_2, 2: _to_3}


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
            conn.execute(_CREATE + _ROWS + _ROWS_INDEX + _POOL + _INVITEES)
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
