"""How much of an index search by meaning covers, as `Index.coverage()` returns it."""

from __future__ import annotations

from dataclasses import dataclass

from indexer.record_view import FieldsMapping


@dataclass(frozen=True, eq=False)
class Coverage(FieldsMapping):
    """`chunks` (all, searchable by name and words), `chunks_with_vectors` (also by
    meaning) and `partial` (True while an index, say a first one, has not sent every
    vector yet).

    Read as attributes; also as the mapping it used to be (`coverage["partial"]`,
    `.get`, equal to the dict of the same items), and `to_dict()` is its JSON.
    """

    partial: bool
    chunks: int
    chunks_with_vectors: int

    @classmethod
    def of(cls, chunks: int, chunks_with_vectors: int) -> Coverage:
        return cls(chunks_with_vectors < chunks, chunks, chunks_with_vectors)
