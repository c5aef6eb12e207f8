"""A server-search workspace's search snapshot (`search.index`) with bytes changed is
detected when it is opened (a digest per section), logged, rebuilt from the rows by the
store itself (the searches answer as before), and named by `codeveil doctor --data`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval.faces.doctor import check_data_dir
from sync.store import SNAPSHOT
from sync.store.embedded.vector_index import SnapshotError, read_snapshot, read_snapshot_info
from tests.test_store_index import POLICY, Workspace, names


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    ws = Workspace(tmp_path / "data")
    try:
        yield ws
    finally:
        ws.store.close()


def _garble(path: Path, section: str) -> None:
    offset, length = read_snapshot_info(path)["sections"][section]
    data = bytearray(path.read_bytes())
    middle = offset + length // 2
    for i in range(middle, middle + 16):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("section", ["faiss", "meta_data"])
def test_a_garbled_snapshot_is_detected_logged_and_rebuilt_from_the_rows(
        workspace: Workspace, caplog: pytest.LogCaptureFixture, section: str) -> None:
    workspace.put(names(0, 60), seed=21, batch=60)
    queries = workspace.queries(8, seed=22)
    before = [workspace.client.search(q, 10) for q in queries]
    workspace.store.close()  # saves the snapshot of this generation
    path = workspace.data_dir / "workspaces" / "ws" / SNAPSHOT
    read_snapshot(path, POLICY)  # whole, it reads
    _garble(path, section)
    with pytest.raises(SnapshotError, match=f"section {section} does not match its digest"):
        read_snapshot(path, POLICY)

    report = check_data_dir(workspace.data_dir)  # `codeveil doctor --data`
    assert not report.healthy
    assert any(SNAPSHOT in line and "digest" in line for line in report.lines()), \
        report.lines()

    with caplog.at_level(logging.WARNING, logger="sync.store"):
        workspace.reopen()
        after = [workspace.client.search(q, 10) for q in queries]
    assert after == before
    assert f"section {section} does not match its digest" in caplog.text
    events = workspace.ws.index_events
    assert (events["loaded"], events["built"]) == (0, 1)
