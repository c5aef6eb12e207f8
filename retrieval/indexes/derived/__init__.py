"""What the client's local indexes (lexical, vectors, grep) share: one way of being
derived from the chunk table and kept in step with it.

Modules, one job each::

    columns.py   ChunkColumns: where each row's chunk sits, as numpy columns, packed,
                 saved, loaded and joined the same way by every index
    store.py     DerivedStore: stamp -> file diff -> rebuild or update -> merge ->
                 atomic save, each index supplying what it covers and how it builds

Each index keeps only what is its own: `retrieval.indexes.lexical` (BM25 segments),
`retrieval.indexes.local_vectors` (vector planes), `retrieval.indexes.trigram_index` (postings).
"""
