"""A dataclass read as a read-only mapping of its fields, for typed results that used
to be plain dicts: new code reads attributes, old code keeps reading keys."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, fields
from typing import Any


class FieldsMapping(Mapping[str, Any]):
    """Mixin for a dataclass (declared with `eq=False`, so that equality is the
    mapping's: equal to the dict of the same items): `record["name"]`, `.get`, `.items()`
    and `to_dict()`, its JSON, with the keys in the order the fields are declared."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
