"""A vote for the files a question names by their own names: the module's face.

"How does the pool work" is answered by `pool.ts`; "XLS support" by `formats/_xls.py`.
Such a file is often small (a header that includes the real one, a file that
re-exports an API, a module of ten lines) and its lines match few of the question's
words, so BM25 and the vectors, which rank chunks by their text, leave it out of the
top hundred. This vote ranks files by the question's words found in their own path:
the stem's words (`_xls` -> `xls`, `RetryPolicy.kt` -> `retry`, `policy`; compared by
their word stems, so "retries" names `retry.ts`) count fully,
the folders' words half, each weighted by how rare the word is among the repo's paths
(a word naming half the files names none of them). Among files that match alike, the
smaller leads: the face, not the implementation that shares its name. Each file
votes with one chunk: its best by BM25, else its first.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from indexer.lexical_tokens import split_identifier, stem, tokenize
from retrieval.search.query import STOPWORDS

# Words of paths that say nothing of what a file is for.
_PATH_NOISE: Final = frozenset({"src", "lib", "main", "java", "kotlin", "com", "org", "net",
                                "www", "pkg", "source", "sources", "include", "index", "mod",
                                "init"})
FOLDER_SHARE: Final = 0.5  # a folder's word counts half a stem's
MIN_WORD: Final = 3
COVERAGE_POWER: Final = 1.0  # how much a partly named stem is worth: share ** power
_EXT: Final = re.compile(r"\.[^.]*$")


def path_words(path: str) -> tuple[frozenset[str], frozenset[str]]:
    """The words of a file's stem and of its folders (lower case, identifier parts)."""
    folder, base = posixpath.split(path)
    stem = _EXT.sub("", base) if "." in base[1:] else base
    if stem.endswith(".d"):  # types.d.ts
        stem = stem[:-2]
    stem_words = {w for w in _words(stem)}
    folder_words = {w for part in folder.split("/") for w in _words(part)} - stem_words
    return frozenset(stem_words), frozenset(folder_words)


def _words(text: str) -> Iterable[str]:
    for word in re.split(r"[^A-Za-z0-9]+", text):
        if not word:
            continue
        parts = split_identifier(word) or [word.lower()]
        for w in {word.lower(), *parts}:
            if len(w) >= MIN_WORD and w not in _PATH_NOISE and not w.isdigit():
                yield stem(w)


def query_words(query: str) -> set[str]:
    """The question's words that could name a file."""
    return {stem(w) for w in tokenize(query)
            if len(w) >= MIN_WORD and w not in STOPWORDS and w not in _PATH_NOISE
            and not w.isdigit()}


class PathWords:
    """The repo's files by the words of their paths, built once per lexical index."""

    def __init__(self, paths: Sequence[str], docs_of: dict[str, list[int]], *,
                 max_chunks: int = 3) -> None:
        self.docs_of = docs_of
        self.max_chunks = max_chunks  # path -> its chunks' doc ids, in file order
        self.by_stem: dict[str, list[str]] = defaultdict(list)
        self.by_folder: dict[str, list[str]] = defaultdict(list)
        self.stem_size: dict[str, int] = {}
        self.folder_words: dict[str, frozenset[str]] = {}
        for path in paths:
            stem, folders = path_words(path)
            self.folder_words[path] = folders
            # Identifier parts, not the whole identifier too: `RetryPolicy` is 2 words.
            self.stem_size[path] = max(len(stem) - (len(stem) > 1), 1)
            for w in stem:
                self.by_stem[w].append(path)
            for w in folders:
                self.by_folder[w].append(path)
        self.files = max(len(paths), 1)

    def _idf(self, word: str) -> float:
        df = len(self.by_stem.get(word, ())) + len(self.by_folder.get(word, ()))
        return math.log(1.0 + self.files / max(df, 1))

    def rank(self, query: str, best_doc: dict[str, int], depth: int) -> list[int]:
        """Doc ids, one per file whose stem holds a word of `query`, best first.

        `best_doc`: path -> the doc to vote with (its best BM25 chunk), where known.
        """
        words = query_words(query)
        scores: dict[str, float] = defaultdict(float)
        matched: dict[str, int] = defaultdict(int)
        for w in words:
            idf = self._idf(w)
            for p in self.by_stem.get(w, ()):
                scores[p] += idf
                matched[p] += 1
        if not scores:
            return []
        # A stem the question names whole (`pool`, `_xls`) is a face; one that shares a
        # word with it (`IntrospectionProcessor` for "the processor") is a neighbour.
        for p in scores:
            scores[p] *= min(1.0, matched[p] / max(self.stem_size[p], 1)) ** COVERAGE_POWER
        for p in scores:  # folders only add to files the stem already named
            for w in words & self.folder_words[p]:
                scores[p] += self._idf(w) * FOLDER_SHARE
        # Only small files: a long one is found by its own lines when it answers.
        order = sorted((p for p in scores if len(self.docs_of[p]) <= self.max_chunks),
                       key=lambda p: (-scores[p], len(self.docs_of[p]), p))
        out = []
        for p in order[:depth]:
            doc = best_doc.get(p)
            out.append(doc if doc is not None else self.docs_of[p][0])
        return out
