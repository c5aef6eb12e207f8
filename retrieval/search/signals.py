"""Ranking signals beside the fused votes: what kind of file a query is after.

Most questions ask for the code that does something; tests, docs, examples and config
files share its words (a test names what it tests, a README names every feature) and
outrank it on words alone. A query that names such a kind ("the tests of the retry
policy", "docs for routing") asks for it, and then it is not held back.
"""

from __future__ import annotations

import functools
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

# Files that stand beside the implementation: an old copy kept for compatibility, type
# declarations, code-level configuration and constants, and barrels that re-export.
# A name defined in both (`v1/client.ts`, `client.ts`) is asked of the implementation.
_COPY_DIRS: Final = frozenset({"legacy", "compat", "deprecated", "_deprecated", "old",
                               "v0", "v1", "obsolete", "backport", "backports"})
_DECLARATION_DIRS: Final = frozenset({"types", "typings", "@types"})
_SECONDARY_STEMS: Final = frozenset({"types", "typings", "config", "configuration", "settings",
                                     "constants", "consts", "defaults", "index", "_deprecated",
                                     "deprecated", "legacy", "compat"})
_BARREL_EXTENSIONS: Final = (".ts", ".tsx", ".js", ".mjs", ".cjs", ".mts")
# Words that ask for such a file.
_ASKS_SECONDARY: Final = frozenset({"legacy", "compat", "compatibility", "deprecated", "old",
                                    "type", "types", "typing", "typings", "declaration",
                                    "declarations", "config", "configuration", "settings",
                                    "constant", "constants", "defaults", "default", "index",
                                    "export", "exports", "v1", "v0"})


@functools.lru_cache(maxsize=1 << 16)  # asked for every fused chunk of every query
def is_secondary(path: str) -> bool:
    """Whether `path` stands beside an implementation rather than being one (see above)."""
    folder, _, name = path.rpartition("/")
    lower = name.lower()
    if lower.endswith((".d.ts", ".d.mts", ".d.cts")):
        return True
    folders = set(folder.lower().split("/")) if folder else set()
    if not folders.isdisjoint(_COPY_DIRS) or not folders.isdisjoint(_DECLARATION_DIRS):
        return True
    stem = lower.rsplit(".", 1)[0]
    if stem == "index":
        return lower.endswith(_BARREL_EXTENSIONS)
    return stem in _SECONDARY_STEMS


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


def prefer_primary(fused: dict[K, float], docs: Mapping[K, ChunkLocation], query: str,
                   factor: float) -> dict[K, float]:
    """`fused` with the scores of chunks of secondary files (`is_secondary`) scaled by
    `factor`, unless the query asks for such a file by name."""
    if factor == 1.0 or not _ASKS_SECONDARY.isdisjoint(_WORD.findall(query.lower())):
        return fused
    return {key: score * factor if is_secondary(docs[key].path) else score
            for key, score in fused.items()}
