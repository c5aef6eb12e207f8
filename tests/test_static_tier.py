"""The static tier: every chunk ranked by meaning from the moment `index` returns.

The real static model (`indexer/static_model/`, shipped in the package); real files in
temp dirs; the words tier as `codeveil index` leaves it (`Workspace.index_words`, then
the search side brought in step) with no MiniLM vector built, the hashing embedder
standing in for MiniLM where the model is not what is tested."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer.embedder import HashingEmbedder
from indexer.embedder_registry import embedder_for_model_id
from indexer.errors import EmbedderError
from indexer.static_embedder import EMBEDDINGS_FILE, MODEL_DIR, StaticEmbedder
from retrieval import Index
from retrieval.indexes.search_ready import SearchReady
from retrieval.indexes.static_vectors import StaticVectorStore
from sync.workspace.workspace import Workspace
from tests.conftest import write_repo


def test_a_static_vector_is_the_unit_mean_of_its_word_pieces() -> None:
    model = StaticEmbedder()
    texts = ["def retry_upload(attempts): pass", "retry failed uploads", ""]
    vectors = model.embed(texts)
    assert vectors.shape == (3, model.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[:2], axis=1), 1.0, atol=1e-5)
    assert not vectors[2].any()  # no word piece, no direction
    # By hand: the table's rows of the pieces MiniLM's tokenizer cuts the text into.
    table = np.load(MODEL_DIR / EMBEDDINGS_FILE).astype(np.float32)
    ids = model._tokenizer.encode(texts[1], add_special_tokens=False).ids
    mean = table[ids].sum(axis=0)
    assert np.allclose(vectors[1], mean / np.linalg.norm(mean), atol=1e-5)
    # Related words lie nearer than unrelated ones.
    near, far = model.embed(["upload again after a failure", "parse a date from a string"])
    assert vectors[1] @ near > vectors[1] @ far


def test_the_model_id_names_the_table(tmp_path: Path) -> None:
    other = tmp_path / "model"
    shutil.copytree(MODEL_DIR, other)
    table = np.load(other / EMBEDDINGS_FILE)
    table[0, 0] += 1
    np.save(other / EMBEDDINGS_FILE, table)
    shipped, changed = StaticEmbedder(), StaticEmbedder(other)
    assert shipped.model_id != changed.model_id  # vectors of two tables never mix
    assert embedder_for_model_id(shipped.model_id).model_id == shipped.model_id
    assert embedder_for_model_id(changed.model_id) is None
    (other / EMBEDDINGS_FILE).write_bytes(b"not a table")
    with pytest.raises(EmbedderError, match="static model"):
        StaticEmbedder(other)


FILES = {
    # The answer shares no word with the question below.
    "storage/housekeeping.py": (
        "import time\n\n\n"
        "def purge_expired_entries(table):\n"
        "    \"\"\"Remove every entry whose deadline has passed.\"\"\"\n"
        "    now = time.time()\n"
        "    for key, entry in list(table.items()):\n"
        "        if entry.deadline < now:\n"
        "            del table[key]\n"
    ),
    "net/http_get.py": (
        "import urllib.request\n\n\n"
        "def fetch_page(url, timeout=10):\n"
        "    with urllib.request.urlopen(url, timeout=timeout) as response:\n"
        "        return response.read().decode()\n"
    ),
    "ui/colors.py": (
        "def blend(a, b, t):\n"
        "    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))\n"
    ),
    "text/slug.py": (
        "import re\n\n\n"
        "def slugify(title):\n"
        "    return re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')\n"
    ),
    "math/stats.py": (
        "def median(values):\n"
        "    ordered = sorted(values)\n"
        "    middle = len(ordered) // 2\n"
        "    return ordered[middle]\n"
    ),
}
QUESTION = "drop outdated records"


def _words_tier(repo: Path) -> None:
    """What `codeveil index` leaves before its builder runs: the chunk table, every file
    pending, and the lexical, static and grep indexes in step."""
    ws = Workspace(repo, embedder=HashingEmbedder())
    try:
        ws.index_words()
        SearchReady(ws).words()
    finally:
        ws.close()


def test_the_first_answer_ranks_by_meaning_before_any_vector_is_built(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", FILES)
    _words_tier(repo)
    assert (repo / ".codeveil" / "static" / "delta.npz").exists()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert idx.coverage().chunks_with_vectors == 0
        hits = idx.search(QUESTION, k=3)
        assert hits[0].path == "storage/housekeeping.py", [h.path for h in hits]
        # Without the static vote the words have nothing to go on.
        idx.search_options = replace(idx.search_options, w_static=0.0)
        words_only = idx.search(QUESTION, k=3)
    assert not words_only or words_only[0].path != "storage/housekeeping.py"


def test_the_static_index_follows_edits_and_rebuilds_when_damaged(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", FILES)
    _words_tier(repo)
    folder = repo / ".codeveil" / "static"
    (repo / "storage" / "housekeeping.py").unlink()
    (repo / "jobs").mkdir()
    (repo / "jobs" / "cleanup.py").write_text(
        "def evict_stale_rows(rows, cutoff):\n"
        "    return [r for r in rows if r.updated >= cutoff]\n")
    _words_tier(repo)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        assert [h.path for h in idx.search(QUESTION, k=1)] == ["jobs/cleanup.py"]
    store = StaticVectorStore(folder)
    assert store.problem() is None
    (base,) = folder.glob("base-*.npy")
    data = bytearray(base.read_bytes())
    data[-64:] = bytes(b ^ 0xFF for b in data[-64:])  # bits flipped: the checksum fails
    base.write_bytes(bytes(data))
    assert "checksum" in (store.problem() or "")
    with Index(repo, embedder=HashingEmbedder()) as idx:  # rebuilt on read, same answer
        assert [h.path for h in idx.search(QUESTION, k=1)] == ["jobs/cleanup.py"]
    assert StaticVectorStore(folder).problem() is None


def test_once_every_vector_is_built_the_static_index_is_not_read(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", FILES)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)  # every chunk has its vector: the static vote has no weight
        assert idx.search(QUESTION, k=3)
    assert not (repo / ".codeveil" / "static").exists()
    with Index(repo, embedder=HashingEmbedder()) as idx:
        # Asked for a static vote beside the vectors, the search builds the index.
        idx.search_options = replace(idx.search_options, w_static_meaning=0.5)
        assert idx.search(QUESTION, k=3)
    assert (repo / ".codeveil" / "static" / "delta.npz").exists()
