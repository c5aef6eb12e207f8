"""The trigrams a line must hold to match a regular expression, read from its syntax.

Python's own regex parser (`re._parser`) gives the pattern's tree; the walk keeps the
runs of literal characters every match must contain and turns them into a query over
the grep index: AND over the runs of a sequence, OR over the branches of an
alternation, nothing required of what may repeat zero times, of classes, anchors,
backreferences or lookarounds. The query can only ever be weaker than the pattern (a
file it rules out cannot match), which is what keeps grep's results exact.

Case: the index folds ASCII letters, so a case-sensitive literal is looked up folded.
Under IGNORECASE a literal that Unicode folds onto a non-ASCII letter (`k` matches
KELVIN SIGN, `s` LONG S, `i` DOTTED CAPITAL I) or a non-ASCII one breaks the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Final

from indexer.trigrams import literal_trigrams

__all__ = ["ALL", "TrigramQuery", "required_trigrams"]

# ASCII letters IGNORECASE also matches to a non-ASCII character (checked over all of
# Unicode with `re`).
_FOLDS_BEYOND_ASCII: Final = frozenset("iksIKS")
_REPEATS: Final = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None))


@dataclass(frozen=True, slots=True)
class TrigramQuery:
    """`op` is "all" (anything may match), "tri" (`code`), "and" or "or" (of `parts`)."""

    op: str
    code: int = 0
    parts: tuple[TrigramQuery, ...] = ()


ALL: Final = TrigramQuery("all")


def _and(parts: Sequence[TrigramQuery]) -> TrigramQuery:
    kept = tuple(dict.fromkeys(p for p in parts if p.op != "all"))
    if not kept:
        return ALL
    return kept[0] if len(kept) == 1 else TrigramQuery("and", parts=kept)


def _or(parts: Sequence[TrigramQuery]) -> TrigramQuery:
    if not parts or any(p.op == "all" for p in parts):
        return ALL
    kept = tuple(dict.fromkeys(parts))
    return kept[0] if len(kept) == 1 else TrigramQuery("or", parts=kept)


def required_trigrams(pattern: str, flags: int = 0) -> TrigramQuery:
    """What a line must hold to match `pattern` under `flags` (re.error if invalid)."""
    parsed = sre_parse.parse(pattern, flags)
    ignore_case = bool(parsed.state.flags & re.IGNORECASE)
    return _Walk().sequence(parsed, ignore_case)


class _Walk:
    def sequence(self, items: Any, ignore_case: bool) -> TrigramQuery:
        self._run: list[str] = []
        self._parts: list[TrigramQuery] = []
        self._items(items, ignore_case)
        self._flush()
        return _and(self._parts)

    def _flush(self) -> None:
        if self._run:
            codes = literal_trigrams("".join(self._run))
            self._parts.append(_and([TrigramQuery("tri", code=c) for c in sorted(codes)]))
            self._run = []

    def _nested(self, items: Any, ignore_case: bool) -> TrigramQuery:
        return _Walk().sequence(items, ignore_case)

    def _items(self, items: Any, ignore_case: bool) -> None:
        for op, arg in items:
            if op is sre.LITERAL:
                char = chr(arg)
                if ignore_case and (ord(char) > 127 or char in _FOLDS_BEYOND_ASCII):
                    self._flush()
                else:
                    self._run.append(char)
            elif op is sre.SUBPATTERN:
                _group, add, remove, inner = arg
                nested_case = (ignore_case or bool(add & re.IGNORECASE)) and not (
                    remove & re.IGNORECASE)
                self._items(inner, nested_case)  # a group matches what its content does
            elif op is getattr(sre, "ATOMIC_GROUP", None):
                self._items(arg, ignore_case)
            elif op in _REPEATS:
                low, _high, inner = arg
                self._flush()
                if low >= 1:
                    self._parts.append(self._nested(inner, ignore_case))
            elif op is sre.BRANCH:
                self._flush()
                self._parts.append(_or([self._nested(b, ignore_case) for b in arg[1]]))
            elif op is sre.IN and len(arg) == 1 and arg[0][0] is sre.LITERAL:
                self._items([arg[0]], ignore_case)  # `[x]`: the literal x
            else:
                self._flush()  # classes, anchors, backreferences, lookarounds, `.`
