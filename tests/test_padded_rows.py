"""What a sealed store holds is padded: every envelope in a few length buckets, rows in
pages of PAGE_ROWS rows whatever their files' sizes (sync.crypto.pages), rows in random order
(a server-search store's rows too, though they are not padded). The padding rows never
reach a search hit, a pull, doctor or the status counts."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from indexer.chunker import chunk_file
from indexer.embedder import HashingEmbedder
from retrieval import Index
from retrieval.faces.doctor import doctor
from sync.checkout.config import load_config, state_path, store_path
from sync.crypto.keys import load_key
from sync.crypto.pages import PAGE_ROWS
from sync.crypto.sealed_rows import META_BUCKETS
from tests.conftest import write_repo
from tests.server_rows import opened_rows


def _repo(root: Path) -> Path:
    files = {}
    for i in range(12):
        # 1 to 12 functions a file: chunk counts of every size up to a bucket's.
        body = "\n\n".join(f"def f{i}_{j}(x):\n    '''Step {j} of {i}.'''\n"
                           + "\n".join(f"    x = x * {j} + {k}" for k in range(40))
                           + "\n    return x" for j in range(i + 1))
        files[f"pkg{i % 3}/mod_{i}.py"] = body + "\n"
    return write_repo(root, files)


def _stored(repo: Path) -> list[tuple[int, int, bytes, bytes]]:
    """(rid, fid, chunk id, envelope) of every row, as the data dir holds them."""
    (ws,) = (store_path(repo) / "workspaces").iterdir()
    with sqlite3.connect(ws / "tree.sqlite") as db:
        return [(r, f, bytes(c), bytes(m)) for r, f, c, m in db.execute(
            "SELECT rid, fid, chunk_id, meta FROM rows ORDER BY rid")]


def test_envelopes_fall_in_buckets_and_every_page_holds_as_many_rows(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
        status = idx.status()
    config = load_config(repo)
    rows = _stored(repo)
    # version, nonce, tag, dim, the vector, the file version a page row names.
    envelope = 1 + 12 + 16 + 2 + 2 * config.dim + 16
    assert {len(m) for *_, m in rows} <= {envelope + b for b in META_BUCKETS}
    per_leaf = Counter(fid for _, fid, _, _ in rows)
    assert set(per_leaf.values()) == {PAGE_ROWS}  # no file's size shows
    chunks = {p.relative_to(repo).as_posix(): len(chunk_file(p.relative_to(repo).as_posix(),
                                                             p.read_text()))
              for p in repo.rglob("*.py")}
    assert len(set(chunks.values())) == 12  # files of 12 sizes, stored alike
    assert status["server_rows"] == len(rows) > status["chunks"]
    assert status["server_chunks"] == status["chunks"] == sum(chunks.values())


def test_rows_are_stored_out_of_chunk_order(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
    config = load_config(repo)
    lines: dict[str, list[int]] = {}
    for _, _, row in opened_rows(store_path(repo), config.workspace_id, config.dim):
        lines.setdefault(row.meta.path, []).append(row.meta.start_line)
    # In chunk order, every file's rows would come by start line.
    many = [ls for ls in lines.values() if len(ls) >= 3]
    assert len(many) >= 6
    assert sum(1 for ls in many if ls == sorted(ls)) < len(many) / 2


def test_server_search_rows_are_stored_out_of_chunk_order(tmp_path: Path) -> None:
    # The store numbers rows as they come: rows sent in chunk order would say which row
    # of a file is which chunk (server-search rows are not padded, their count is exact).
    import lancedb

    from sync.crypto.ciphers import open_meta

    repo = _repo(tmp_path / "repo")
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.init(server_search=True)
        idx.index(wait=True)
    config = load_config(repo)
    key = load_key(config.workspace_id)
    (ws,) = (store_path(repo) / "workspaces").iterdir()
    table = lancedb.connect(ws).open_table("chunks").to_arrow()
    stored = sorted(zip(table.column("rid").to_pylist(), table.column("fid").to_pylist(),
                        table.column("chunk_id").to_pylist(), table.column("meta").to_pylist(),
                        strict=True))
    lines: dict[int, list[int]] = {}
    for _, fid, cid, blob in stored:
        meta = open_meta(key, config.workspace_id, bytes(cid), bytes(blob))
        lines.setdefault(fid, []).append(meta.start_line)
    many = [ls for ls in lines.values() if len(ls) >= 4]
    assert len(many) >= 6
    assert sum(1 for ls in many if ls == sorted(ls)) < len(many) / 2


@pytest.mark.parametrize("server", [False, True])
def test_padding_rows_never_reach_a_pull_a_hit_or_doctor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, request) -> None:
    repo = _repo(tmp_path / "repo")
    url = request.getfixturevalue("live_server").url if server else None
    with Index(repo, embedder=HashingEmbedder()) as idx:
        if url:
            idx.init(server=url)
        first = idx.index(wait=True)
    # Another machine: no vectors, no local state; its vectors come from the rows.
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(tmp_path / "empty-cache"))
    state_path(repo).unlink()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        report = idx.index(wait=True)
        assert report.chunks_embedded == 0
        assert report.chunks_pulled == report.chunks_total == first.chunks_total
        hits = idx.search("step of x", k=200)
        assert len(hits) == first.chunks_total  # every chunk, none twice, nothing else
        assert all(h.path.startswith("pkg") and h.end_line >= h.start_line for h in hits)
        status = idx.status(server=True)  # the store's own count: asked
        assert status["server_chunks"] == status["chunks"] < status["server_rows"]
    if not server:
        found = doctor(repo, embedder=HashingEmbedder())
        assert found.healthy, found.lines()


def test_the_store_sees_files_in_a_random_order_not_by_category(tmp_path: Path) -> None:
    from indexer.priority import category

    files = {}
    for i in range(20):
        files[f"lib/mod_{i}.py"] = f"def source_{i}(x):\n    return x + {i}\n"
        files[f"tests/test_mod_{i}.py"] = f"def test_{i}():\n    assert source_{i}(1)\n"
        files[f"docs/page_{i}.md"] = f"# Page {i}\n\nHow to call source_{i}.\n"
    repo = write_repo(tmp_path / "repo", files)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
    config = load_config(repo)
    first_row: dict[str, int] = {}
    for rid, _, row in opened_rows(store_path(repo), config.workspace_id, config.dim):
        first_row.setdefault(row.meta.path, rid)
    order = [category(p) for p in sorted(first_row, key=first_row.__getitem__)]
    # In priority order the 20 source files would take the first 20 places.
    assert sum(1 for c in order[:20] if c == category("lib/mod_0.py")) < 15
