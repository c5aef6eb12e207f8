"""The server's half of search in a server-search workspace, seen from the client.

Encrypt the query with fresh noise, ask the store for its nearest encrypted rows, open
their sealed metadata, and estimate each row's cosine from its encrypted distance. The
caller re-ranks with its own plain vectors where it has them (`retrieval.search.rerank`). A
sealed workspace never comes here: its search runs on the client
(`retrieval.indexes.local_vectors`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from sync.client import StoreClient
from sync.crypto import ciphers
from sync.crypto.keys import WorkspaceKey
from sync.wire import LIMITS

# Opened metadata of recently seen rows: the parts of a long query share most
# neighbours, and an agent repeats searches.
META_CACHE_SIZE = 20_000


class ServerSearch:
    """Nearest chunks of a query vector, as the server of one workspace ranks them."""

    def __init__(self, client: StoreClient, key: WorkspaceKey, workspace_id: str,
                 dim: int) -> None:
        self.client = client
        self.key = key
        self.workspace_id = workspace_id
        self.cipher = ciphers.VectorCipher(key, dim)
        self._metas: OrderedDict[bytes, ciphers.ChunkMeta] = OrderedDict()

    def nearest(self, vector: np.ndarray, n: int) -> list[tuple[ciphers.ChunkMeta, float]]:
        """(metadata, estimated cosine) of the store's `n` nearest rows, nearest first."""
        out = []
        query = self.cipher.encrypt_query(vector)
        for found in self.client.search(query, min(n, LIMITS.max_k)):
            out.append((self._open(found.chunk_id, found.meta),
                        self.cipher.distance_to_cosine(found.distance)))
        return out

    def _open(self, row_id: bytes, blob: bytes) -> ciphers.ChunkMeta:
        meta = self._metas.get(row_id)
        if meta is None:
            meta = ciphers.open_meta(self.key, self.workspace_id, row_id, blob)
            self._metas[row_id] = meta
            if len(self._metas) > META_CACHE_SIZE:
                self._metas.popitem(last=False)
        else:
            self._metas.move_to_end(row_id)
        return meta
