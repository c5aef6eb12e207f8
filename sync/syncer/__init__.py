"""One sync run: the diff against the store's tree, the rows sent (in pages, or to a
server that searches), the pool, progress and the report."""
