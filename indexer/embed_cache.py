"""A persistent cache of embeddings, shared by every repo of the user.

Key: xxh3-128(len(model id) as 4 bytes LE || model id || embedded text), the length
prefix making the split between the two unambiguous. Value: the vector as little-endian
float32 bytes. A text that was ever embedded by a model is never embedded by it again.
SQLite in WAL mode, so an indexer and a daemon of another repo can share the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from indexer import sqlite_files
from indexer.embedder import Embedder
from indexer.formats import check_sqlite_format
from indexer.paths import cache_dir

CACHE_ADVICE = (
    "it is only a cache: delete it (vectors are recomputed) or run `codeveil doctor --repair`"
)
# SQLite limits host parameters per statement; stay well below it.
_LOOKUP_BATCH = 900


def cache_key(model_id: str, text: str) -> bytes:
    """The cache key of one text under one model (overridable in one place)."""
    model = model_id.encode()
    return xxhash.xxh3_128_digest(len(model).to_bytes(4, "little") + model + text.encode())


# The layout of embeddings.sqlite; raise it, with a migration, when it changes.
CACHE_FORMAT = 1


class EmbeddingCache:
    """key -> float32 vector, on disk."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "embeddings.sqlite"
        self._db = sqlite_files.connect(self.path, CACHE_ADVICE, private=True, timeout=30,
                                        check_same_thread=False)
        try:
            check_sqlite_format(
                self._db, self.path, what="the embedding cache", version=CACHE_FORMAT,
                remedy="delete it (vectors are embedded again as needed)")
        except BaseException:
            self._db.close()
            raise
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS embeddings (key BLOB PRIMARY KEY, vector BLOB NOT NULL)"
            " WITHOUT ROWID"
        )
        self._db.commit()

    def get_many(self, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        for key, blob in self._select("key, vector", keys):
            vec = np.frombuffer(blob, dtype="<f4")
            if vec.shape == (dim,):
                found[key] = vec
        return found

    def known(self, keys: Sequence[bytes]) -> set[bytes]:
        """The keys of `keys` that have a vector (without reading the vectors)."""
        return {key for (key,) in self._select("key", keys)}

    def _select(self, columns: str, keys: Sequence[bytes]) -> Iterator[tuple]:
        """`columns` of the rows of `keys`, as many keys a statement as SQLite allows."""
        for start in range(0, len(keys), _LOOKUP_BATCH):
            part = list(keys[start : start + _LOOKUP_BATCH])
            marks = ",".join("?" * len(part))
            yield from self._db.execute(
                f"SELECT {columns} FROM embeddings WHERE key IN ({marks})", part)

    def put_many(self, items: Sequence[tuple[bytes, np.ndarray]]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO embeddings (key, vector) VALUES (?, ?)",
                [(k, np.asarray(v, dtype="<f4").tobytes()) for k, v in items],
            )

    def vectors_of_size(self, dim: int) -> Iterator[np.ndarray]:
        """Every stored vector of `dim` values (`codeveil doctor` checks them)."""
        for (blob,) in self._db.execute(
            "SELECT vector FROM embeddings WHERE length(vector) = ?", (dim * 4,)
        ):
            yield np.frombuffer(blob, dtype="<f4")

    def __len__(self) -> int:
        return self._db.execute("SELECT count(*) FROM embeddings").fetchone()[0]

    def close(self) -> None:
        self._db.close()


@dataclass
class EmbedResult:
    vectors: np.ndarray
    from_cache: int
    embedded: int


class CachedEmbedder:
    """An embedder in front of the cache: one lookup for the batch, the model for the rest."""

    def __init__(self, embedder: Embedder, cache: EmbeddingCache) -> None:
        self.embedder = embedder
        self.cache = cache

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def embed(
        self,
        texts: Sequence[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> EmbedResult:
        """Vectors of `texts`; `progress(embedded, cached)` is told as texts get vectors."""
        keys = [cache_key(self.embedder.model_id, t) for t in texts]
        cached = self.cache.get_many(keys, self.embedder.dim)
        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        missing: list[int] = []
        for i, key in enumerate(keys):
            vec = cached.get(key)
            if vec is None:
                missing.append(i)
            else:
                out[i] = vec
        if progress is not None and len(texts) > len(missing):
            progress(0, len(texts) - len(missing))
        unique_missing = len({texts[i] for i in missing})
        if missing:
            on_batch = (lambda n: progress(n, 0)) if progress is not None else None
            vecs = self.embedder.embed([texts[i] for i in missing], progress=on_batch)
            out[missing] = vecs
            self.cache.put_many([(keys[i], vecs[j]) for j, i in enumerate(missing)])
        # Duplicates within the batch went through the model once: count them as cached.
        return EmbedResult(out, from_cache=len(texts) - unique_missing, embedded=unique_missing)
