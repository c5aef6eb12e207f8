"""The stat cache and the scan that uses it, on real files and a real SQLite file."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from indexer.statcache import CacheEntry, StatCache, scan
from indexer.walk import FileStat, Skipped, SkipReason, SourceFile, read_source, walk_repo

AN_HOUR_AGO_NS = time.time_ns() - 3600 * 1_000_000_000


class CountingReader:
    """read_source, remembering which paths it was asked to read."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, root: Path, path: str) -> SourceFile | Skipped:
        self.paths.append(path)
        return read_source(root, path)


def write(root: Path, rel: str, content: bytes | str, *, mtime_ns: int | None = None) -> Path:
    """Write a file; by default date it an hour back, well clear of the racy window."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    mtime_ns = AN_HOUR_AGO_NS if mtime_ns is None else mtime_ns
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def stat_of(path: Path) -> FileStat:
    return FileStat.from_os(os.stat(path))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(root, "a.py", "a = 1\n")
    write(root, "pkg/b.py", "b = 2\n")
    write(root, "pkg/c.md", "# c\n")
    return root


@pytest.fixture
def cache(repo: Path) -> Iterator[StatCache]:
    # Inside the repo, as in real use: the walk must skip .codeveil/.
    with StatCache(repo / ".codeveil" / "state.sqlite") as stat_cache:
        yield stat_cache


def rescan(repo: Path, cache: StatCache) -> tuple[CountingReader, dict[str, bytes]]:
    reader = CountingReader()
    result = scan(repo, walk_repo(repo), cache, read=reader)
    return reader, result.digests


# --- the table ------------------------------------------------------------------------


def test_record_lookup_forget_and_reopen(tmp_path: Path) -> None:
    db = tmp_path / "state" / "state.sqlite"
    entries = [
        CacheEntry("a.py", 10, AN_HOUR_AGO_NS, 7, b"\x01" * 16, time.time_ns()),
        CacheEntry("b.bin", 3, AN_HOUR_AGO_NS, 8, b"", time.time_ns(), "binary"),
    ]
    with StatCache(db) as cache:
        cache.record_many(entries)
        assert cache.all_paths() == {"a.py", "b.bin"}
        assert [path for path, _ in cache.items()] == ["a.py", "b.bin"]
        assert cache.lookup("a.py", FileStat(10, AN_HOUR_AGO_NS, 7)) == entries[0]

    with StatCache(db) as cache:  # persisted
        assert cache.snapshot() == {entry.path: entry for entry in entries}
        cache.forget_many(["a.py", "never-there.py"])
        assert cache.all_paths() == {"b.bin"}


def test_lookup_needs_size_mtime_and_inode_to_match(tmp_path: Path) -> None:
    with StatCache(tmp_path / "s.sqlite") as cache:
        cache.record_many([CacheEntry("a.py", 10, AN_HOUR_AGO_NS, 7, b"d" * 16, time.time_ns())])
        assert cache.lookup("a.py", FileStat(10, AN_HOUR_AGO_NS, 7)) is not None
        assert cache.lookup("a.py", FileStat(11, AN_HOUR_AGO_NS, 7)) is None
        assert cache.lookup("a.py", FileStat(10, AN_HOUR_AGO_NS + 1, 7)) is None
        assert cache.lookup("a.py", FileStat(10, AN_HOUR_AGO_NS, 8)) is None
        assert cache.lookup("other.py", FileStat(10, AN_HOUR_AGO_NS, 7)) is None


def test_racy_margin_rule(tmp_path: Path) -> None:
    second = 1_000_000_000
    mtime = AN_HOUR_AGO_NS
    stat = FileStat(10, mtime, 7)
    with StatCache(tmp_path / "s.sqlite", racy_margin_ns=2 * second) as cache:
        cache.record_many([CacheEntry("old.py", 10, mtime, 7, b"d" * 16, mtime + 3 * second)])
        cache.record_many([CacheEntry("racy.py", 10, mtime, 7, b"d" * 16, mtime + 1 * second)])
        cache.record_many([CacheEntry("future.py", 10, mtime, 7, b"d" * 16, mtime - second)])
        assert cache.lookup("old.py", stat) is not None
        assert cache.lookup("racy.py", stat) is None
        assert cache.lookup("future.py", stat) is None


def test_inode_above_signed_64_bits_round_trips(tmp_path: Path) -> None:
    inode = 2**64 - 5
    entry = CacheEntry("a.py", 1, AN_HOUR_AGO_NS, inode, b"d" * 16, time.time_ns())
    with StatCache(tmp_path / "s.sqlite") as cache:
        cache.record_many([entry])
        assert cache.snapshot()["a.py"].inode == inode
        assert cache.lookup("a.py", FileStat(1, AN_HOUR_AGO_NS, inode)) == entry


def test_shares_the_file_with_other_tables(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite"
    other = sqlite3.connect(db)
    other.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY, text TEXT)")
    other.execute("INSERT INTO chunks (text) VALUES ('kept')")
    other.commit()

    with StatCache(db) as cache:
        cache.record_many([CacheEntry("a.py", 1, 2, 3, b"d" * 16, 4)])
        cache.forget_many(["a.py"])
        cache.clear()

    assert other.execute("SELECT text FROM chunks").fetchall() == [("kept",)]
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    other.close()


# --- scans ----------------------------------------------------------------------------


def test_first_scan_reads_everything_second_reads_nothing(repo: Path, cache: StatCache) -> None:
    first, digests = rescan(repo, cache)
    assert sorted(first.paths) == ["a.py", "pkg/b.py", "pkg/c.md"]
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 1\n")

    second, again = rescan(repo, cache)
    assert second.paths == []
    assert again == digests


def test_unchanged_scan_calls_no_reader(repo: Path, cache: StatCache) -> None:
    # See also test_old_file_with_identical_stat_is_trusted: the stale digest it gets
    # back shows that no bytes were read.
    rescan(repo, cache)

    def refuse(root: Path, path: str) -> SourceFile | Skipped:
        raise AssertionError(f"read {path}")

    result = scan(repo, walk_repo(repo), cache, read=refuse)
    assert sorted(result.digests) == ["a.py", "pkg/b.py", "pkg/c.md"]
    assert result.read == []


def test_size_change_is_detected(repo: Path, cache: StatCache) -> None:
    rescan(repo, cache)
    write(repo, "a.py", "a = 100\n")  # same (old) mtime, different size

    reader, digests = rescan(repo, cache)
    assert reader.paths == ["a.py"]
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 100\n")


def test_mtime_change_is_detected(repo: Path, cache: StatCache) -> None:
    rescan(repo, cache)
    write(repo, "a.py", "a = 2\n", mtime_ns=AN_HOUR_AGO_NS + 1_000)  # same size

    reader, digests = rescan(repo, cache)
    assert reader.paths == ["a.py"]
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 2\n")


def test_inode_change_is_detected(repo: Path, cache: StatCache) -> None:
    rescan(repo, cache)
    before = stat_of(repo / "a.py")
    # An editor's atomic save: write a new file, then rename it over the old one.
    write(repo, "a.py.tmp", "a = 3\n")
    os.replace(repo / "a.py.tmp", repo / "a.py")
    after = stat_of(repo / "a.py")
    assert (after.size, after.mtime_ns) == (before.size, before.mtime_ns)
    assert after.inode != before.inode

    reader, digests = rescan(repo, cache)
    assert reader.paths == ["a.py"]
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 3\n")


def test_racily_clean_file_is_rehashed(repo: Path, cache: StatCache) -> None:
    # A file written just now: its mtime is not safely older than the moment it is read.
    now_ns = time.time_ns()
    write(repo, "hot.py", "v = 1\n", mtime_ns=now_ns)
    rescan(repo, cache)
    before = stat_of(repo / "hot.py")

    # Changed within the same timestamp tick: same size, same mtime, same inode.
    write(repo, "hot.py", "v = 2\n", mtime_ns=now_ns)
    assert stat_of(repo / "hot.py") == before

    reader, digests = rescan(repo, cache)
    assert "hot.py" in reader.paths
    assert digests["hot.py"] == xxhash.xxh3_128_digest(b"v = 2\n")


def test_old_file_with_identical_stat_is_trusted(repo: Path, cache: StatCache) -> None:
    # The flip side of the racy rule, and the reason it exists: a stat that did not change
    # is taken at its word once the file is old enough.
    rescan(repo, cache)
    write(repo, "a.py", "a = 9\n")  # same size, same (old) mtime, same inode

    reader, digests = rescan(repo, cache)
    assert reader.paths == []
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 1\n")


def test_deleted_and_newly_ignored_files_are_removed(repo: Path, cache: StatCache) -> None:
    rescan(repo, cache)
    (repo / "pkg" / "b.py").unlink()
    write(repo, ".gitignore", "*.md\n")

    reader = CountingReader()
    result = scan(repo, walk_repo(repo), cache, read=reader)
    assert result.removed == ["pkg/b.py", "pkg/c.md"]
    assert reader.paths == [".gitignore"]
    assert cache.all_paths() == {".gitignore", "a.py"}


def test_rejected_contents_are_remembered(repo: Path, cache: StatCache) -> None:
    write(repo, "blob.dat", b"\x00\x01\x02")
    write(repo, "latin.txt", "café\n".encode("latin-1"))

    reader = CountingReader()
    first = scan(repo, walk_repo(repo), cache, read=reader)
    assert {"blob.dat", "latin.txt"} <= set(reader.paths)
    expected = {"blob.dat": SkipReason.BINARY, "latin.txt": SkipReason.NOT_UTF8}
    assert {s.path: s.reason for s in first.skipped} == expected

    reader = CountingReader()
    second = scan(repo, walk_repo(repo), cache, read=reader)
    assert reader.paths == []
    assert {s.path: s.reason for s in second.skipped} == expected
    assert "blob.dat" not in second.digests

    # Fixed: read again, indexed again.
    write(repo, "latin.txt", "café\n")
    reader, digests = rescan(repo, cache)
    assert reader.paths == ["latin.txt"]
    assert "latin.txt" in digests


def test_file_vanishing_mid_scan_is_skipped_and_forgotten(repo: Path, cache: StatCache) -> None:
    rescan(repo, cache)
    write(repo, "a.py", "a = 10\n")  # changed, so it will be read ...
    walked = walk_repo(repo)
    (repo / "a.py").unlink()  # ... but it is gone by then

    result = scan(repo, walked, cache)
    assert [(s.path, s.reason) for s in result.skipped] == [("a.py", SkipReason.UNREADABLE)]
    assert result.removed == ["a.py"]
    assert "a.py" not in cache.all_paths()


def test_on_source_sees_each_file_read(repo: Path, cache: StatCache) -> None:
    seen: dict[str, str] = {}
    scan(repo, walk_repo(repo), cache, on_source=lambda src: seen.__setitem__(src.path, src.text))
    assert seen == {"a.py": "a = 1\n", "pkg/b.py": "b = 2\n", "pkg/c.md": "# c\n"}


def test_records_the_stat_of_the_bytes_read(repo: Path, cache: StatCache) -> None:
    # The walk saw the old stat; the file changed before it was read. The cache must
    # pair the digest with the stat of what was read, so the next scan trusts it.
    walked = walk_repo(repo)
    write(repo, "a.py", "a = 1000\n")
    scan(repo, walked, cache)

    reader, digests = rescan(repo, cache)
    assert reader.paths == []
    assert digests["a.py"] == xxhash.xxh3_128_digest(b"a = 1000\n")
