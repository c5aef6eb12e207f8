"""This machine's derived indexes: words (BM25), vectors, trigrams, the filter they mask by,
and the processes that keep them built (the search side, the vector builder)."""
