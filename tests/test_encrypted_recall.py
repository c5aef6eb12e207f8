"""Searching encrypted vectors finds what searching plain vectors finds.

On this project's own chunks with the real model: for each query, the top 10 by cosine on
plain vectors against (a) the top 10 by L2 in encrypted space, the server's own order, and
(b) what search shows: the server's top 40 (k times the overfetch factor) re-ranked by the
client with its plain vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.chunker import chunk_file
from retrieval.faces.api import OVERFETCH
from sync.crypto.ciphers import VectorCipher, chunk_id
from sync.crypto.keys import KEY_SIZE, WorkspaceKey

PROJECT = Path(__file__).resolve().parent.parent


def project_chunks():
    chunks = []
    for folder in ("indexer", "sync", "retrieval"):
        for path in sorted((PROJECT / folder).glob("*.py")):
            rel = path.relative_to(PROJECT).as_posix()
            chunks.extend(chunk_file(rel, path.read_text()))
    return chunks


def project_queries(chunks) -> list[str]:
    """Queries a developer would type: the symbol names and module docstrings' words."""
    queries = sorted({c.symbol.replace(" > ", " ").replace("_", " ") for c in chunks
                      if c.symbol})[:80]
    return [*queries, "where are vectors encrypted", "merkle tree diff",
            "load the workspace key", "walk the repository honouring gitignore",
            "embedding cache lookup"]


def assert_encrypted_recall(real_embedder, chunks, queries: list[str]) -> None:
    vectors = real_embedder.embed([c.embed_text for c in chunks])
    qvecs = real_embedder.embed(queries)

    # Recall depends on the key's noise draw: measured over three fixed keys, so that one
    # unlucky random key cannot fail the test and a real loss of recall still does.
    depth = 10 * OVERFETCH
    server_only, reranked = [], []
    for n in (1, 2, 3):
        key = WorkspaceKey(bytes([n]) * KEY_SIZE)
        cipher = VectorCipher(key, real_embedder.dim)
        ids = [chunk_id(key, c.path, c.chunk_hash, i) for i, c in enumerate(chunks)]
        enc = cipher.encrypt(vectors, ids)
        for q in qvecs:
            plain = np.argsort(-(vectors @ q))[:10]
            eq = cipher.encrypt_query(q)
            by_server = np.argsort(((enc - eq) ** 2).sum(axis=1))[:depth]
            rescored = by_server[np.argsort(-(vectors[by_server] @ q))][:10]
            server_only.append(len(set(plain) & set(by_server[:10])) / 10)
            reranked.append(len(set(plain) & set(rescored)) / 10)
    raw, shown = float(np.mean(server_only)), float(np.mean(reranked))
    print(f"recall@10 vs plain over {len(queries)} queries x 3 keys, {len(chunks)} chunks, beta"
          f" {cipher.beta}: server order {raw:.4f}, re-ranked top-{depth} {shown:.4f}")
    assert shown >= 0.99  # within 1 point of plain search
    # The server's own order is already close. Its recall moves with the project's own
    # chunks, which are this test's data (0.80 and 0.797 on two recent trees), so the
    # bound leaves it room; the re-ranked bound above is the promise.
    assert raw >= 0.75


def test_encrypted_top10_matches_plain_top10_on_a_sample_of_the_project(
        real_embedder) -> None:
    # Every fourth chunk, the same queries: the model's cost is most of this test's time.
    # Recall on such a sample follows the whole project's within a point or two at every
    # beta (1.25 or more fails here as it does there), so this still catches a loss.
    chunks = project_chunks()
    sample = chunks[::4]
    assert len(sample) > 100
    assert_encrypted_recall(real_embedder, sample, project_queries(chunks))


@pytest.mark.slow  # every chunk of the project through the model: minutes on two cores
def test_encrypted_top10_matches_plain_top10(real_embedder) -> None:
    chunks = project_chunks()
    assert len(chunks) > 100
    assert_encrypted_recall(real_embedder, chunks, project_queries(chunks))
