"""Byte trigrams of text, as the grep index keeps them.

A trigram is three consecutive bytes of the UTF-8 text with ASCII letters in lower case,
packed into one integer (`b0 << 16 | b1 << 8 | b2`), so one index answers case-sensitive
and case-insensitive patterns alike. Trigrams holding a newline are never kept: the
chunk table holds every non-blank line of a file exactly, but not the blank lines
between chunks, so only trigrams within one line are known exactly; a grep matches
within a line anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np

__all__ = ["literal_trigrams", "text_trigrams"]

_NEWLINE: Final = 10


def _lowered(data: bytes) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    upper = (raw >= 65) & (raw <= 90)
    return np.where(upper, raw + 32, raw).astype(np.uint32)


def text_trigrams(texts: Iterable[str]) -> np.ndarray:
    """The distinct trigrams of `texts` (the chunks of one file), sorted, as uint32."""
    parts = []
    for text in texts:
        data = _lowered(text.encode("utf-8"))
        if len(data) < 3:
            continue
        codes = (data[:-2] << 16) | (data[1:-1] << 8) | data[2:]
        newline = (data == _NEWLINE)
        spans = newline[:-2] | newline[1:-1] | newline[2:]
        parts.append(codes[~spans])
    if not parts:
        return np.zeros(0, dtype=np.uint32)
    return np.unique(np.concatenate(parts))


def literal_trigrams(literal: str) -> set[int]:
    """Trigrams every line holding `literal` must have in the index. Those of blank-line
    text (whitespace alone) are left out: such a line may sit between chunks, where
    the index does not see it."""
    data = literal.encode("utf-8")
    lowered = _lowered(data)
    # Which bytes belong to a character `str.strip` removes: the chunker's blank lines.
    blank = [c.isspace() for c in literal for _ in c.encode("utf-8")]
    out = set()
    for i in range(len(data) - 2):
        if _NEWLINE in data[i : i + 3] or all(blank[i : i + 3]):
            continue
        out.add(int(lowered[i]) << 16 | int(lowered[i + 1]) << 8 | int(lowered[i + 2]))
    return out
