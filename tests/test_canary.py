"""The store never holds plaintext: plant unique strings in a repo, index it, then look
for them in every byte of every store file and every column of every table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import lancedb
import pytest

from retrieval import Index
from tests.conftest import write_repo

CANARIES = {
    "dir": "qzvdirnamecanary4417",
    "file": "qzvfilenamecanary9023",
    "ident": "qzvIdentifierCanary5561",
    "comment": "qzvcommentcanary3318",
    "string": "qzvstringliteralcanary7702",
    "doc": "qzvmarkdowncanary1180",
}


def planted_repo(root: Path) -> Path:
    c = CANARIES
    return write_repo(root, {
        f"{c['dir']}/{c['file']}.py": f'''
            # {c['comment']}: this comment must never reach the store
            class {c['ident']}:
                """Holds a secret."""

                def reveal(self):
                    return "{c['string']}"
            ''',
        "src/app.js": f'''
            // {c['comment']} in javascript
            function {c['ident']}Js() {{ return "{c['string']}"; }}
            ''',
        "README.md": f"# Notes\n\n{c['doc']} appears in prose.\n",
    })


def needles(repo: Path) -> list[bytes]:
    """Every canary, every indexed path and path component, in utf-8 and utf-16."""
    out = set(CANARIES.values())
    for path in repo.rglob("*"):
        if ".codeveil" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(repo).as_posix()
        out.add(rel)
        out.update(p for p in rel.split("/") if len(p) >= 6)
    encoded = []
    for s in out:
        encoded += [s.encode(), s.encode("utf-16-le"), s.lower().encode()]
    return encoded


def assert_no_plaintext(data_dir: Path, repo: Path) -> int:
    """Scan files byte by byte and tables cell by cell; returns how many cells were read."""
    targets = needles(repo)
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    assert files, f"nothing stored under {data_dir}"
    for path in files:
        blob = path.read_bytes()
        for needle in targets:
            assert needle not in blob, f"{needle!r} found in {path}"
        assert not any(n in path.as_posix().encode() for n in targets), path
    cells = 0
    for db_path in [p for p in files if p.suffix in (".sqlite", ".db")]:
        db = sqlite3.connect(db_path)
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            for row in db.execute(f'SELECT * FROM "{table}"'):
                for cell in row:
                    cells += 1
                    raw = cell if isinstance(cell, bytes) else str(cell).encode()
                    assert not any(n in raw for n in targets), (db_path, table)
        db.close()
    for lance_parent in {p.parent.parent for p in data_dir.rglob("*.lance") if p.is_dir()} | {
        p.parent for p in data_dir.rglob("*.lance") if p.is_dir()
    }:
        db = lancedb.connect(lance_parent)
        for name in db.list_tables().tables if hasattr(db, "list_tables") else db.table_names():
            table = db.open_table(name).to_arrow()
            for column in table.column_names:
                for cell in table.column(column).to_pylist():
                    cells += 1
                    raw = cell if isinstance(cell, bytes) else repr(cell).encode()
                    assert not any(n in raw for n in targets), (name, column)
    return cells


def test_embedded_store_holds_no_plaintext(tmp_path: Path, real_embedder) -> None:
    repo = planted_repo(tmp_path / "repo")
    idx = Index(repo, embedder=real_embedder)
    report = idx.index(wait=True)
    assert report.chunks_total >= 3
    # The index works: the planted class is found...
    assert any(CANARIES["ident"] in h.text for h in idx.search("class that holds a secret"))
    idx.close()
    # ...yet nothing of it is in the store (the client state file legitimately holds code).
    cells = assert_no_plaintext(repo / ".codeveil" / "store", repo)
    assert cells > report.chunks_total


def test_server_data_dir_holds_no_plaintext(tmp_path: Path, real_embedder, live_server) -> None:
    repo = planted_repo(tmp_path / "repo")
    idx = Index(repo, embedder=real_embedder)
    idx.init(server=live_server.url)
    report = idx.index(wait=True)
    assert report.chunks_total >= 3
    assert any(CANARIES["ident"] in h.text for h in idx.search("class that holds a secret"))
    idx.close()
    assert not (repo / ".codeveil" / "store").exists()
    cells = assert_no_plaintext(live_server.data_dir, repo)
    assert cells > report.chunks_total


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_canaries_really_are_in_the_repo(tmp_path: Path, name: str) -> None:
    # Guards the test above against planting nothing.
    repo = planted_repo(tmp_path / "repo")
    text = b"".join(
        p.read_bytes() + p.as_posix().encode() for p in repo.rglob("*") if p.is_file()
    )
    assert CANARIES[name].encode() in text
