"""BM25 over the client's own chunk table: the lexical half of hybrid search.

The index covers exactly the chunks of `indexer.local_chunks` (the ones whose vectors the
store holds), each read as the text the model embeds (`path > symbol` header, then the
code) and tokenized by `indexer.lexical_tokens.tokenize` (identifiers split on case and
underscores, the whole identifier kept). It holds code tokens, so it lives only under
`.codeveil/lexical/` and never goes to a server.

Scores are Lucene's BM25, the `bm25s` "lucene" variant (a test pins equality with
`bm25s.BM25(method="lucene")` on the same tokens):

    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
    w(t, d)  = idf(t) * tf / (tf + k1 * (1 - b + b * len(d) / avglen))

Keeping it current: segments. `bm25s` only builds from scratch, and at 100k chunks a
build costs about 16 s inside `bm25s` plus over a minute of tokenizing on this project's
2-core machine; an edit to one file must not cost that. So the index is a large
immutable *base* segment plus a small *delta* segment and a mask of deleted base chunks,
as in Lucene: a refresh compares the chunk table's file list (path -> content digest)
with the one the index was built from, masks the chunks of changed and deleted files,
and tokenizes only the changed files' chunks into a new delta. Segments keep term
frequencies, so when the delta outgrows a tenth of the base the two are merged without
tokenizing again, a term-hash range at a time (`combine.py`: memory bounded by a part,
whatever the index's size); the saved base's postings are mapped, not read. Until a
merge, base weights keep the statistics of their build, as Lucene's do; the delta is
weighted with the combined ones.

How terms are kept: retrieval.indexes.lexical.segments. Knowing when to refresh, and the
refresh itself, shared with the vector and grep indexes: retrieval.indexes.derived.store.

Modules, one job each::

    tokens.py     Tokenizer: a chunk's embedded text as code tokens, as term hashes
    segments.py   a segment: term-major term counts and BM25 weights, doc columns,
                  the arrays a segment is saved as
    combine.py    building segments a batch of docs at a time and merging them a
                  term range at a time, large ones in spill files (bounded memory)
    index.py      LexicalIndex: base + delta + deleted mask; chunk and file scores,
                  filters, updating and merging the segments
    store.py      LexicalStore: `.codeveil/lexical/` on disk, kept in step with the chunk
                  table (a retrieval.indexes.derived DerivedStore: what it covers, how it builds)

The names below are imported on first use (indexer.lazy): importing the package loads
none of its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.lazy import lazy_exports

if TYPE_CHECKING:
    from retrieval.indexes.lexical.index import LexicalIndex
    from retrieval.indexes.lexical.store import LexicalStore
    from retrieval.indexes.lexical.tokens import Tokenizer, lexical_text

__all__ = ["LexicalIndex", "LexicalStore", "Tokenizer", "lexical_text"]

_HOMES = {
    "LexicalIndex": "retrieval.indexes.lexical.index",
    "LexicalStore": "retrieval.indexes.lexical.store",
    "Tokenizer": "retrieval.indexes.lexical.tokens",
    "lexical_text": "retrieval.indexes.lexical.tokens",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
