"""Questions about this repository's own code, written by reading it, answered in the
top three by the words tier: what a first `codeveil index` serves before any vector is
built. The hashing embedder indexes (no meaning: the vectors' vote is switched off, as
while none is built); the second tier's answers are measured in bench/questions.py."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from indexer.embedder import HashingEmbedder
from retrieval import Index

ROOT = Path(__file__).resolve().parent.parent

# (question, the files that answer it)
# The README's own question: its words name no file's; the words tier ranks the opt-in
# mode's `VectorCipher.encrypt` 4th (the sealed envelope, `sync/crypto/sealed_rows.py`, says
# "seal"): a question for meaning, held here to the top five.
README_QUESTION = ("where are vectors encrypted before they leave the client",
                   {"sync/crypto/sealed_rows.py", "sync/crypto/ciphers.py"})
QUESTIONS = [
    ("how are identifiers split into words for keyword search", {"indexer/lexical_tokens.py"}),
    ("how does a long query get cut to fit the model's window", {"retrieval/search/query.py"}),
    ("how are minified files recognised and skipped", {"indexer/walk.py"}),
    ("how does the daemon wait for a burst of file changes to settle",
     {"sync/daemon/loop.py", "sync/daemon/watch.py"}),
    ("where is the reciprocal rank fusion of the rankings computed",
     {"retrieval/search/options.py"}),
]


def test_the_words_tier_answers_in_the_top_three(tmp_path: Path) -> None:
    repo = tmp_path / "codeveil"
    for part in ("indexer", "sync", "retrieval", "docs", "README.md"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, repo / part)
    with Index(repo, embedder=HashingEmbedder()) as idx:
        idx.index(wait=True)
        idx.search_options = replace(idx.search_options, w_vector=0.0, w_header_vector=0.0,
                                     meaning_share=0.0)
        missed = {}
        for (question, gold), k in [*((q, 3) for q in QUESTIONS), (README_QUESTION, 5)]:
            top = [h.path for h in idx.search(question, k=k)]
            if not gold & set(top):
                missed[question] = top
    assert not missed, missed
