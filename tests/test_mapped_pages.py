"""A memory-mapped base's pages handed back: the data unchanged, the process's resident
pages of the file gone, its checksum read without mapping it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from retrieval.indexes.local_vectors.mapped import file_checksum, gather_rows, release


def _mapped_kb(path: Path) -> int:
    """kB of `path` resident in this process (its mappings' Rss in /proc/self/smaps)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            ours = len(head) >= 6 and head[-1] == str(path)
        elif ours and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.fixture
def mapped(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    data = np.random.default_rng(0).standard_normal((2, 4096, 64)).astype(np.float32)
    path = tmp_path / "base.npy"
    np.save(path, data)
    return path, data, np.load(path, mmap_mode="r")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_release_unmaps_the_pages_and_keeps_the_data(mapped) -> None:
    path, data, base = mapped
    assert float(np.asarray(base[1]).sum()) == pytest.approx(float(data[1].sum()), rel=1e-5)
    before = _mapped_kb(path)
    assert before >= 900  # one plane read: 1 MB of it resident
    assert release(base[1])  # a view releases its whole map
    assert _mapped_kb(path) < before / 4
    np.testing.assert_array_equal(base[1][[5, 4000]], data[1][[5, 4000]])


def test_release_of_an_array_in_memory_does_nothing() -> None:
    assert not release(np.zeros((2, 3), dtype=np.float32))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_gather_rows_reads_the_rows_and_leaves_no_page_behind(mapped) -> None:
    path, data, base = mapped
    rows = np.random.default_rng(1).choice(4096, size=600, replace=False)
    release(base)
    got = gather_rows(base[1], rows)
    np.testing.assert_array_equal(got, data[1][rows])
    assert _mapped_kb(path) < 64  # every slice's pages handed back after it
    small = gather_rows(base[0], rows[:5])  # one slice: read, then handed back too
    np.testing.assert_array_equal(small, data[0][rows[:5]])
    assert _mapped_kb(path) < 64
    in_memory = gather_rows(data[0], rows)  # an array in memory: a plain read
    np.testing.assert_array_equal(in_memory, data[0][rows])


def test_file_checksum_is_the_checksum_of_the_data(mapped, tmp_path: Path) -> None:
    path, data, base = mapped
    want = xxhash.xxh3_64_intdigest(np.ascontiguousarray(data).tobytes())
    assert file_checksum(path, int(base.offset)) == want
    assert file_checksum(path, 0) != want  # the header is not data
