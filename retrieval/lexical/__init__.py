"""BM25 over the client's own chunk table: the lexical half of hybrid search
(retrieval.lexical.index).

The names below are imported on first use (indexer.lazy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from retrieval.lexical.index import (
        LexDoc,
        LexicalIndex,
        LexicalStore,
        Tokenizer,
        lexical_text,
    )

__all__ = ["LexDoc", "LexicalIndex", "LexicalStore", "Tokenizer", "lexical_text"]

_HOMES = {
    "LexDoc": "retrieval.lexical.index",
    "LexicalIndex": "retrieval.lexical.index",
    "LexicalStore": "retrieval.lexical.index",
    "Tokenizer": "retrieval.lexical.index",
    "lexical_text": "retrieval.lexical.index",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
