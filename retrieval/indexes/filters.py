"""The filters of a search (`--path`, `--lang`, `--kind`) as one value that every side applies the
same way: on one hit (`HitFilter(doc)`), and as a mask over a column store of chunks
(`HitFilter.column_mask`), so that the lexical and the local vector index restrict their
candidates before scoring instead of dropping hits after it.

A mask is computed per distinct path and language (a repo has far fewer paths than
chunks) and gathered through the chunk's path and language ids.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from indexer.kinds import file_kind

if TYPE_CHECKING:
    from indexer.location import ChunkLocation


@dataclass(frozen=True)
class HitFilter:
    """Keep a chunk whose path matches the glob `path` (`src/*.py`, `*/tests/*`; `*`
    crosses `/` as in fnmatch), whose language is `language` and whose file is of one of
    `kinds` (`indexer.kinds.file_kind`: code, tests, docs, ...); None keeps all."""

    path: str | None = None
    language: str | None = None
    kinds: frozenset[str] | None = None
    _match: re.Pattern[str] | None = field(default=None, init=False, repr=False,
                                           compare=False)

    def __post_init__(self) -> None:
        if self.path is not None:
            # fnmatch.fnmatch, compiled once: case-sensitive on POSIX, like the paths.
            object.__setattr__(self, "_match", re.compile(fnmatch.translate(self.path)))

    @classmethod
    def of(cls, path: str | None = None, language: str | None = None,
           kinds: Collection[str] | None = None) -> HitFilter | None:
        """The filter of these options, or None when they filter nothing."""
        if path is None and language is None and kinds is None:
            return None
        return cls(path, language, None if kinds is None else frozenset(kinds))

    def __call__(self, doc: ChunkLocation) -> bool:
        return self.keeps_path(doc.path) and (self.language is None
                                              or doc.language == self.language)

    def keeps_path(self, path: str) -> bool:
        """Whether a chunk of `path` passes the path glob and the kinds."""
        return ((self._match is None or self._match.match(path) is not None)
                and (self.kinds is None or file_kind(path) in self.kinds))

    def column_mask(self, paths: Sequence[str], path_id: np.ndarray,
                    languages: Sequence[str], lang_id: np.ndarray) -> np.ndarray:
        """bool [n] over chunks given as ids into `paths` and `languages`."""
        keep = np.ones(len(path_id), dtype=bool)
        if not len(path_id):
            return keep
        if self._match is not None or self.kinds is not None:
            ok = np.fromiter((self.keeps_path(p) for p in paths), dtype=bool,
                             count=len(paths))
            keep &= ok[path_id]
        if self.language is not None:
            ok = np.fromiter((x == self.language for x in languages), dtype=bool,
                             count=len(languages))
            keep &= ok[lang_id]
        return keep


__all__ = ["HitFilter"]
