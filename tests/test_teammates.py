"""Two teammates syncing different edits into one workspace at once, on a real server on
loopback. The interleavings are forced: teammate 2 runs a whole sync at a chosen point of
teammate 1's (during its diff, before its apply, before its directory values), and then
each teammate's next sync must leave the store equal to a clean sync of its own tree.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from indexer.embed_cache import CachedEmbedder, EmbeddingCache
from indexer.embedder import HashingEmbedder
from sync.client import StoreClient, TransferStats
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey, create_key
from sync.records import DirValue, FileUpdate, NodeInfo, SearchHit, WorkspaceInfo
from sync.syncer.search_rows import SearchRows
from sync.syncer.syncer import Syncer
from sync.transport.http_client import HttpClient
from tests.conftest import write_repo
from tests.test_sync import snapshot


class Interleaved:
    """A real client that, once, runs `between()` just before its first call of `at`."""

    def __init__(self, inner: StoreClient, at: str, between: Callable[[], None]) -> None:
        self.inner, self.at, self.between = inner, at, between
        self.stats: TransferStats = inner.stats
        self.fired = False

    def _point(self, name: str) -> None:
        if name == self.at and not self.fired:
            self.fired = True
            self.between()

    def info(self) -> WorkspaceInfo:
        return self.inner.info()

    def root(self) -> NodeInfo | None:
        return self.inner.root()

    def children(self, keys: list[bytes]) -> dict[bytes, list[NodeInfo]]:
        self._point("children")
        return self.inner.children(keys)

    def apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> None:
        self._point("apply")
        self.inner.apply(updates, deletes)

    def set_dir_values(self, values: list[DirValue]) -> NodeInfo | None:
        self._point("set_dir_values")
        return self.inner.set_dir_values(values)

    def search(self, vector: np.ndarray, k: int) -> list[SearchHit]:
        return self.inner.search(vector, k)

    def verify(self) -> None:
        self.inner.verify()

    def close(self) -> None:
        self.inner.close()


class Team:
    """One workspace on the server and the key its teammates share."""

    def __init__(self, url: str, data_dir: Path, tmp: Path) -> None:
        self.url, self.data_dir, self.tmp = url, data_dir, tmp
        self.embedder = CachedEmbedder(HashingEmbedder(), EmbeddingCache())
        self.workspace_id = "team-" + secrets.token_hex(4)
        self.key: WorkspaceKey = create_key(self.workspace_id)
        self.token = self.new_workspace(self.workspace_id)

    def new_workspace(self, workspace_id: str) -> str:
        return HttpClient.create_workspace(
            self.url, workspace_id, dim=self.embedder.dim, model_id=self.embedder.model_id,
            key_check=self.key.key_check,
        )

    def sync(self, repo: Path, client: StoreClient | None = None,
             workspace_id: str | None = None, token: str | None = None) -> None:
        ws = workspace_id or self.workspace_id
        client = client or HttpClient(self.url, ws, token or self.token)
        rows = SearchRows(self.key, ws, ciphers.VectorCipher(self.key, self.embedder.dim))
        syncer = Syncer(repo, repo.parent / f"{repo.name}.state.sqlite", client, self.key, ws,
                        self.embedder, rows)
        try:
            syncer.run()
        finally:
            syncer.close()
            client.close()

    def clean_state(self, repo: Path) -> tuple:
        """What a clean sync of `repo`'s files (same key, fresh workspace) stores."""
        copy = self.tmp / f"clean-{secrets.token_hex(3)}"
        shutil.copytree(repo, copy)
        ws = "clean-" + secrets.token_hex(4)
        self.sync(copy, workspace_id=ws, token=self.new_workspace(ws))
        return snapshot(self.data_dir, ws, self.key)


FILES = {f"pkg{i}/mod{j}.py": f"def f{i}_{j}(x):\n    return x + {i * 10 + j}\n"
         for i in range(3) for j in range(3)}


@pytest.mark.parametrize("at", ["children", "apply", "set_dir_values"])
def test_concurrent_teammates_each_converge_to_their_own_tree(
    tmp_path: Path, live_server, at: str
) -> None:
    team = Team(live_server.url, live_server.data_dir, tmp_path)
    one = write_repo(tmp_path / "one", FILES)
    team.sync(one)
    two = tmp_path / "two"
    shutil.copytree(one, two)
    (one / "pkg1/mod1.py").write_text("def edited_by_one():\n    return 1\n")
    (two / "pkg2/mod2.py").write_text("def edited_by_two():\n    return 2\n")

    # Teammate 2 syncs completely at the chosen point of teammate 1's sync.
    client = Interleaved(HttpClient(team.url, team.workspace_id, team.token), at,
                         lambda: team.sync(two))
    team.sync(one, client)
    assert client.fired

    state = lambda: snapshot(team.data_dir, team.workspace_id)  # noqa: E731
    team.sync(one)
    assert state() == team.clean_state(one)
    team.sync(two)
    assert state() == team.clean_state(two)
