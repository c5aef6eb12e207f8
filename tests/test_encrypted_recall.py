"""Searching encrypted vectors finds what searching plain vectors finds.

On this project's own chunks with the real model: for each query, the top 10 by L2 in
encrypted space (what the server computes) against the top 10 by cosine on plain vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from indexer.chunker import chunk_file
from sync.crypto import VectorCipher, chunk_id
from sync.keys import WorkspaceKey

PROJECT = Path(__file__).resolve().parent.parent


def project_chunks():
    chunks = []
    for folder in ("indexer", "sync", "retrieval"):
        for path in sorted((PROJECT / folder).glob("*.py")):
            rel = path.relative_to(PROJECT).as_posix()
            chunks.extend(chunk_file(rel, path.read_text()))
    return chunks


def test_encrypted_top10_matches_plain_top10(real_embedder) -> None:
    chunks = project_chunks()
    assert len(chunks) > 100
    vectors = real_embedder.embed([c.embed_text for c in chunks])
    # Queries a developer would type: the symbol names and module docstrings' words.
    queries = sorted({c.symbol.replace(" > ", " ").replace("_", " ") for c in chunks
                      if c.symbol})[:80]
    queries += ["where are vectors encrypted", "merkle tree diff", "load the workspace key",
                "walk the repository honouring gitignore", "embedding cache lookup"]
    qvecs = real_embedder.embed(queries)

    key = WorkspaceKey.generate()
    cipher = VectorCipher(key, real_embedder.dim)
    ids = [chunk_id(key, c.path, c.chunk_hash, i) for i, c in enumerate(chunks)]
    enc = cipher.encrypt(vectors, ids)

    overlaps = []
    for q in qvecs:
        plain = set(np.argsort(-(vectors @ q))[:10])
        eq = cipher.encrypt_query(q)
        secret = set(np.argsort(((enc - eq) ** 2).sum(axis=1))[:10])
        overlaps.append(len(plain & secret) / 10)
    recall = float(np.mean(overlaps))
    print(f"encrypted vs plain recall@10 over {len(queries)} queries, {len(chunks)} chunks:"
          f" {recall:.4f}")
    assert recall >= 0.99
