"""References: the chunks that use a name, from identifier nodes where a grammar exists."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from retrieval.symbols import ToolInputError
from tests.conftest import write_repo

FILES = {
    "app/session.py": (
        "class Session:\n"
        "    def send(self, request):\n"
        "        return self.transport.send(request)\n"
        "\n"
        "\n"
        "def send(payload):\n"
        "    # send is documented here, but this comment is no use of it\n"
        "    return Session().send(payload)\n"
    ),
    "app/client.py": (
        "from app.session import send\n"
        "\n"
        "\n"
        "def notify(user):\n"
        "    label = 'send'\n"
        "    return send(user)\n"
    ),
    "tests/test_client.py": "from app.session import send\n\n\ndef test_it():\n    send(1)\n",
    "docs/usage.md": "# Usage\n\nCall send with a payload.\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = write_repo(tmp_path / "repo", FILES)
    past = time.time() - 60
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))
    Index(root, embedder=HashingEmbedder()).index()
    return root


def test_uses_are_identifier_nodes_and_definitions_are_not_uses(repo: Path) -> None:
    hits = Index(repo, embedder=HashingEmbedder()).references("send")
    by_path = {(h.path, tuple(h.lines)) for h in hits}
    # session.py: line 3 (self.transport.send) and line 8 (a call); not the two `def send`
    # lines, not the comment on line 7.
    session_lines = sorted(n for h in hits if h.path == "app/session.py" for n in h.lines)
    assert session_lines == [3, 8]
    # client.py: the import and the call, not the string 'send' on line 5.
    assert sorted(n for h in hits if h.path == "app/client.py" for n in h.lines) == [1, 6]
    assert ("docs/usage.md", (3,)) in by_path
    exactness = {h.path: h.approximate for h in hits}
    assert exactness["docs/usage.md"] is True and exactness["app/client.py"] is False
    # Source before tests before docs.
    order = [h.path for h in hits]
    assert order.index("tests/test_client.py") > max(order.index("app/client.py"),
                                                     order.index("app/session.py"))
    assert order[-1] == "docs/usage.md"
    assert all(f"{n}:" in h.text for h in hits for n in h.lines[:3])


def test_a_qualified_name_ranks_chunks_naming_its_qualifier_first(repo: Path) -> None:
    hits = Index(repo, embedder=HashingEmbedder()).references("Session.send")
    assert hits[0].path == "app/session.py"


def test_an_edit_since_indexing_is_seen(repo: Path) -> None:
    (repo / "app/client.py").write_text("def other():\n    return send(2)\n")
    hits = Index(repo, embedder=HashingEmbedder()).references("send")
    assert [n for h in hits if h.path == "app/client.py" for n in h.lines] == [2]


def test_a_non_identifier_is_refused(repo: Path) -> None:
    with pytest.raises(ToolInputError, match="not an identifier"):
        Index(repo, embedder=HashingEmbedder()).references("a-b")
