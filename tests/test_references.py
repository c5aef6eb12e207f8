"""References: the chunks that use a name, from identifier nodes where a grammar exists."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder
from retrieval import Index
from retrieval.agent.symbols import ToolInputError
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
    Index(root, embedder=HashingEmbedder()).index(wait=True)
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


IMPORTING = {
    # Python: one module defines `backoff`; three files import it from there, one takes
    # a `backoff` of a package this repository does not hold.
    "lib/retry.py": "def backoff(n):\n    return n * 2\n",
    "lib/inner.py": "from .retry import backoff\n\nWAIT = backoff(3)\n",
    "app/uses.py": "from lib.retry import backoff\n\n\ndef go():\n    return backoff(1)\n",
    "app/aliased.py": "import lib.retry as r\n\n\ndef go():\n    return r.backoff(2)\n",
    "app/aaa_other.py": (
        "from tenacity import backoff\n\n\ndef go():\n    return backoff(3) + backoff(4)\n"),
    # TypeScript / JavaScript: relative imports resolve; a package's does not.
    "web/util.ts": "export function debounce(f: number) {\n  return f;\n}\n",
    "web/a.ts": "import { debounce } from './util';\nexport const x = debounce(1);\n",
    "web/b.js": "import * as u from './util.js';\nexport const y = u.debounce(2);\n",
    "web/aaa.ts": (
        "import { debounce } from 'lodash';\nexport const z = debounce(1) + debounce(2);\n"),
    # Go: the same package unqualified, another package through its import path.
    "pkg/clock/clock.go": "package clock\n\nfunc Tick() int { return 1 }\n",
    "pkg/clock/later.go": "package clock\n\nfunc later() int { return Tick() + 1 }\n",
    "cmd/main.go": ("package main\n\nimport (\n\t\"example.com/m/pkg/clock\"\n)\n\n"
                    "func main() { _ = clock.Tick() }\n"),
    "cmd/aaa.go": ("package main\n\nimport \"example.com/other/metronome\"\n\n"
                   "func a() { _ = metronome.Tick(); _ = metronome.Tick() }\n"),
}


@pytest.mark.parametrize(("name", "bound", "unbound"), [
    ("backoff", {"lib/retry.py", "lib/inner.py", "app/uses.py", "app/aliased.py"},
     {"app/aaa_other.py"}),
    ("debounce", {"web/a.ts", "web/b.js"}, {"web/aaa.ts"}),
    ("Tick", {"pkg/clock/later.go", "cmd/main.go"}, {"cmd/aaa.go"}),
])
def test_uses_imported_from_the_defining_file_are_resolved_and_rank_first(
        tmp_path: Path, name: str, bound: set[str], unbound: set[str]) -> None:
    root = write_repo(tmp_path / "repo", IMPORTING)
    Index(root, embedder=HashingEmbedder()).index(wait=True)
    hits = Index(root, embedder=HashingEmbedder()).references(name)
    resolved = {h.path for h in hits if h.resolved}
    assert resolved == bound - {"lib/retry.py"}  # the definition itself is no use
    assert {h.path for h in hits if not h.resolved} == unbound
    flags = [h.resolved for h in hits]
    assert flags == sorted(flags, reverse=True)  # every resolved use before the others
