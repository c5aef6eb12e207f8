"""Files -> chunks -> vectors: the walk, the chunker and the embedders. No network, no
crypto. The names below are imported on first use (see indexer.lazy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from indexer.chunk import Chunk
    from indexer.chunker import chunk_file
    from indexer.embed_cache import CachedEmbedder, EmbeddingCache
    from indexer.embedder import Embedder
    from indexer.embedder_registry import default_embedder
    from indexer.errors import CodeveilError, EmbedderError, IndexerError
    from indexer.location import ChunkLocation
    from indexer.walk import WalkResult, walk_repo

__all__ = [
    "CachedEmbedder",
    "Chunk",
    "ChunkLocation",
    "CodeveilError",
    "Embedder",
    "EmbedderError",
    "EmbeddingCache",
    "IndexerError",
    "WalkResult",
    "chunk_file",
    "default_embedder",
    "walk_repo",
]

_HOMES = {
    "CachedEmbedder": "indexer.embed_cache",
    "Chunk": "indexer.chunk",
    "ChunkLocation": "indexer.location",
    "CodeveilError": "indexer.errors",
    "Embedder": "indexer.embedder",
    "EmbedderError": "indexer.errors",
    "EmbeddingCache": "indexer.embed_cache",
    "IndexerError": "indexer.errors",
    "WalkResult": "indexer.walk",
    "chunk_file": "indexer.chunker",
    "default_embedder": "indexer.embedder_registry",
    "walk_repo": "indexer.walk",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
