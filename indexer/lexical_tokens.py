"""Code-aware word splitting shared by the lexical index and the hashing embedder.

Identifiers are split on case changes, digits and underscores (`parseHTTPResponse2` ->
`parse`, `http`, `response`, `2`) and the whole identifier is kept too, so both the
exact name and its parts match.

Words are compared by their stems (`stem`: Snowball's English stemmer) where a question
in plain words meets code: "how are retries scheduled" names `retry`/`schedule`, and
"parsing responses" the `parse_response` it means. A question's words are rarely the
code's exact forms, and the lexical tier is all a first index answers with.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


_STEMMER = Stemmer.Stemmer("english")


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """The stem of a lower-case word (`retries` -> `retri`, `parsing` -> `pars`); a word
    of digits, or shorter than four letters, is its own stem (`io`, `id`, `ssl`)."""
    if len(word) < 4 or not word.isalpha():
        return word
    return str(_STEMMER.stemWord(word))


def split_identifier(word: str) -> list[str]:
    """`parseHTTPResponse_v2` -> ['parse', 'http', 'response', 'v', '2']."""
    return [p.lower() for p in _PART.findall(word)]


def tokenize(text: str) -> list[str]:
    """Lower-cased words and identifier parts of a text, in order."""
    out: list[str] = []
    for word in _WORD.findall(text):
        lower = word.lower()
        parts = split_identifier(word)
        if len(parts) > 1 or (parts and parts[0] != lower.strip("_")):
            out.append(lower.strip("_") or lower)
            out.extend(parts)
        elif parts:
            out.append(parts[0])
    return out
