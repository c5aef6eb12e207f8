"""How many results each operation returns, by default and at most: written once, read
by every face (the CLI, the Python API's callers, the MCP tools), so that an agent and a
person asking the same question get the same answer.

grep is the one operation that differs by face on purpose: a person's `codeveil grep`
prints every line it finds, as grep does, unless `--limit` says otherwise; an agent's call
is capped at `GREP` lines, since each line costs it tokens (the result says `truncated`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ResultCount:
    """An operation's number of results: its default and its most."""

    default: int
    most: int

    def clamp(self, n: int) -> int:
        """`n` brought into 1..most (an agent's out-of-range value is not an error)."""
        return max(1, min(int(n), self.most))


SEARCH: Final = ResultCount(default=10, most=200)
DEFINITIONS: Final = ResultCount(default=10, most=200)
REFERENCES: Final = ResultCount(default=20, most=500)
GREP: Final = ResultCount(default=100, most=1000)  # an agent's grep (see above)
