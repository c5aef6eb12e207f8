"""Ranking signals beside the fused votes: what kind of file a query is after.

Most questions ask for the code that does something; tests, docs, examples and config
files share its words (a test names what it tests, a README names every feature) and
outrank it on words alone. A query that names such a kind ("the tests of the retry
policy", "docs for routing") asks for it, and then it is not held back.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Final, TypeVar

from indexer.kinds import FileKind, file_kind

K = TypeVar("K", bound=Hashable)

# Words that ask for a kind of file other than code.
_ASKS: Final[dict[FileKind, frozenset[str]]] = {
    FileKind.TESTS: frozenset({"test", "tests", "tested", "testing", "spec", "specs",
                               "unittest", "unittests", "fixture", "fixtures", "mock",
                               "mocks", "assert", "assertion", "assertions"}),
    FileKind.DOCS: frozenset({"doc", "docs", "documentation", "documented", "readme",
                              "guide", "tutorial", "changelog", "manual", "docstring"}),
    FileKind.EXAMPLES: frozenset({"example", "examples", "sample", "samples", "demo",
                                  "demos", "usage"}),
    FileKind.CONFIG: frozenset({"config", "configuration", "settings", "yaml", "yml",
                                "toml", "json", "ini", "workflow", "ci", "dockerfile"}),
}
_WORD: Final = re.compile(r"[a-z]+")


def kinds_asked(query: str) -> frozenset[FileKind]:
    """The kinds of file besides code that `query` asks for by name."""
    words = set(_WORD.findall(query.lower()))
    return frozenset(kind for kind, asks in _ASKS.items() if not words.isdisjoint(asks))


def prefer_code(fused: dict[K, float], words: dict[K, float], paths: dict[K, str],
                query: str, factor: float) -> dict[K, float]:
    """`fused` scores with the part that the votes in `words` gave chunks of tests, docs,
    examples and config files scaled by `factor` (below 1: code first), except for the
    kinds the query asks for. `words` is what the fusion passes: the word votes' part
    (BM25, names), so that what the vectors say of those files stands, or every vote's."""
    asked = kinds_asked(query) | {FileKind.CODE}
    out = dict(fused)
    for key, part in words.items():
        if file_kind(paths[key]) not in asked:
            out[key] -= (1.0 - factor) * part
    return out
