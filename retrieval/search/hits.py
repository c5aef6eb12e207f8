"""What a search returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Hit:
    """One ranked code location, read from the local disk.

    `stale` is True when the file changed since it was indexed and the chunk could not be
    found in it any more: then `text` is empty rather than showing wrong lines. `kind` is
    what the file is for: code, tests, docs, examples or config (`indexer.kinds`). `repo`
    is the repository's folder in a search over several (`MultiIndex`), else None; `path`
    is relative to it.
    """

    path: str
    start_line: int
    end_line: int
    symbol: str
    language: str
    kind: str
    score: float
    text: str
    stale: bool = False
    repo: str | None = None

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.repo is None:
            del out["repo"]  # a one-repository search's JSON stays as it was
        return out
