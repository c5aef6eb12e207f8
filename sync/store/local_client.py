"""`LocalClient`: the `StoreClient` of the embedded default, running the store in-process.

The store lives under the repo's `.codeveil/store/`, laid out exactly as a server's data
dir (see sync.store), so the code under test is the code a server runs. Any other
`StoreBackend` (sync.store.core.backend; a `PgStore`, say) can be passed in instead. No
tokens: the process that can open the store owns it. Bad input raises the same
`StoreError` subclasses (sync.wire) that `HttpClient` raises for a server's 4xx answers.
"""

from __future__ import annotations

import os

import numpy as np

from sync.client import TransferStats
from sync.records import (
    DEFAULT_REF,
    MODE_SERVER_SEARCH,
    BlobRows,
    DirValue,
    FileRows,
    FileUpdate,
    NodeInfo,
    RefInfo,
    SearchHit,
    WorkspaceInfo,
)
from sync.store.core.backend import StoreBackend, WorkspaceBackend
from sync.store.embedded.registry import Store
from sync.wire import gather_blob_rows, gather_rows


class LocalClient:
    """Operations on one workspace of a store in this process.

    Built on a path, the client owns the `Store` it opens there and closes it; built on
    a store, it leaves the store open for its other users. `stats` counts calls; no byte
    crosses a wire, so its byte counts stay 0.
    """

    def __init__(self, store: StoreBackend | str | os.PathLike[str], workspace_id: str,
                 *, ref: bytes = DEFAULT_REF) -> None:
        self._owns_store = isinstance(store, str | os.PathLike)
        self._store: StoreBackend = (Store(store) if isinstance(store, str | os.PathLike)
                                     else store)
        try:
            self._ws: WorkspaceBackend = self._store.workspace(workspace_id)
        except BaseException:
            if self._owns_store:
                self._store.close()
            raise
        self.workspace_id = workspace_id
        self.ref = ref
        self.stats = TransferStats()

    @classmethod
    def open(cls, store: StoreBackend | str | os.PathLike[str], workspace_id: str,
             *, ref: bytes = DEFAULT_REF) -> LocalClient:
        """A client of an existing workspace (of `ref`'s tree in it); WorkspaceNotFound
        if there is none."""
        return cls(store, workspace_id, ref=ref)

    @classmethod
    def create_workspace(
        cls,
        store: StoreBackend | str | os.PathLike[str],
        workspace_id: str | None = None,
        *,
        dim: int,
        model_id: str,
        key_check: bytes,
        mode: str = MODE_SERVER_SEARCH,
    ) -> LocalClient:
        """Create a workspace of `mode` (in `store`, a store or a data dir) and return
        its client.

        WorkspaceExists if `workspace_id` is taken. The bearer token a server would hand
        out is not needed in-process and is dropped.
        """
        owned = isinstance(store, str | os.PathLike)
        opened: StoreBackend = Store(store) if isinstance(store, str | os.PathLike) else store
        try:
            workspace_id, _token = opened.create_workspace(
                dim, model_id, key_check, workspace_id=workspace_id, mode=mode
            )
            client = cls(opened, workspace_id)
        except BaseException:
            if owned:
                opened.close()
            raise
        client._owns_store = owned
        return client

    @property
    def store(self) -> StoreBackend:
        return self._store

    # -- StoreClient ------------------------------------------------------------------

    def info(self) -> WorkspaceInfo:
        self.stats.requests += 1
        return self._ws.info()

    def root(self) -> NodeInfo | None:
        self.stats.requests += 1
        return self._ws.root(self.ref)

    def children(self, keys: list[bytes]) -> dict[bytes, list[NodeInfo]]:
        self.stats.requests += 1
        return self._ws.children(keys, self.ref)

    def apply(self, updates: list[FileUpdate], deletes: list[bytes]) -> list[bytes]:
        self.stats.requests += 1
        return self._ws.apply(updates, deletes, self.ref)

    def set_dir_values(self, values: list[DirValue]) -> NodeInfo | None:
        self.stats.requests += 1
        self._ws.set_dir_values(values, self.ref)
        return self._ws.root(self.ref)

    def search(self, vector: np.ndarray, k: int) -> list[SearchHit]:
        self.stats.requests += 1
        return self._ws.search(vector, k)

    def file_rows(self, file_keys: list[bytes]) -> FileRows:
        def fetch(part: list[bytes]) -> FileRows:
            self.stats.requests += 1
            return self._ws.file_rows(part, self.ref)

        return gather_rows(file_keys, self._store.limits.max_row_files, fetch)

    def blob_rows(self, blobs: list[tuple[bytes, bytes]], *, rows: bool = True) -> BlobRows:
        def fetch(part: list[tuple[bytes, bytes]]) -> BlobRows:
            self.stats.requests += 1
            return self._ws.blob_rows(part, rows=rows)

        return gather_blob_rows(blobs, self._store.limits.max_row_files, fetch)

    def refs(self) -> list[RefInfo]:
        self.stats.requests += 1
        return self._ws.refs()

    def drop_ref(self, ref: bytes) -> None:
        self.stats.requests += 1
        self._ws.drop_ref(ref)

    def collect_garbage(self, *, max_ref_age_days: float | None = None,
                        grace_s: float | None = None) -> dict[str, int]:
        self.stats.requests += 1
        return self._ws.collect_garbage(max_ref_age_days=max_ref_age_days, grace_s=grace_s)

    def verify(self) -> None:
        self._ws.verify()

    def check(self) -> list[str]:
        """Every problem found in the workspace's storage (`WorkspaceBackend.check`)."""
        return self._ws.check()

    def close(self) -> None:
        if self._owns_store:
            self._store.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

