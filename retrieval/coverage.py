"""How much of an index search by meaning covers, as `Index.coverage()` returns it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True, eq=False)
class Coverage(Mapping[str, int | bool]):
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

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    def __getitem__(self, key: str) -> int | bool:
        if key not in self._names():
            raise KeyError(key)
        value: int | bool = getattr(self, key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
