"""Ranking signals beside the fused votes: what kind of file a query is after.

Most questions ask for the code that does something; tests, docs, examples and config
files share its words (a test names what it tests, a README names every feature) and
outrank it on words alone. A query that names such a kind ("the tests of the retry
policy", "docs for routing") asks for it, and then it is not held back.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Final, TypeVar

from indexer.kinds import FileKind, file_kind
from indexer.location import ChunkLocation

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


def prefer_code(fused: dict[K, float], scaled: dict[K, float],
                docs: Mapping[K, ChunkLocation], query: str, factor: float
                ) -> dict[K, float]:
    """`fused` scores with the part `scaled` of them (the votes the fusion chose: every
    vote's, or only the word votes') scaled by `factor` for chunks of tests, docs,
    examples and config files (below 1: code first), except the kinds the query asks
    for. The word votes alone leave what the vectors say of those files standing."""
    asked = kinds_asked(query) | {FileKind.CODE}
    out = dict(fused)
    for key, part in scaled.items():
        if file_kind(docs[key].path) not in asked:
            out[key] -= (1.0 - factor) * part
    return out
