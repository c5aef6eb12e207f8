"""The lookups an agent reaches for beside search: definition, outline, references, grep.

`AgentTools(root)` answers them from the client state and the grep index alone: no
model, no store, no key, so the CLI imports only this (and numpy) to answer them.
`retrieval.faces.api.Index` offers the same methods.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from indexer.local_chunks import open_state_db
from retrieval.agent.grep import Freshness, GrepResult, grep_files
from retrieval.agent.references import ReferenceHit, find_references
from retrieval.agent.symbols import (
    DefinitionHit,
    Outline,
    ToolInputError,
    find_definitions,
    outline_of,
)
from retrieval.indexes.trigram_index import TrigramStore
from retrieval.search.limits import DEFINITIONS, REFERENCES
from sync.checkout.config import codeveil_dir, find_root, state_path
from sync.checkout.index_state import check_built

__all__ = ["AgentTools"]


class AgentTools:
    """The agent lookups of the index around `path` (found upward like `.git/`)."""

    def __init__(self, path: str | Path = ".", *, watch: bool = True) -> None:
        """`watch`: keep inotify watches between greps, so that a later grep stats only
        the files changed since (retrieval.agent.grep.Freshness); off for a one-call process,
        which would only pay for arming them."""
        self._path = Path(path)
        self._trigram_store: TrigramStore | None = None
        self._freshness = Freshness(watch=watch)

    def definition(self, name: str, *,
                   limit: int = DEFINITIONS.default) -> list[DefinitionHit]:
        """Where `name` (`send`, `Session.send`, `Sinatra::Base`, `pkg.Func`) is defined,
        from the syntax trees read at index time, best first (`retrieval.agent.symbols`)."""
        root, db = self._state()
        try:
            return find_definitions(db, root, name, limit=_positive(limit))
        finally:
            db.close()

    def outline(self, path: str | Path) -> Outline:
        """The symbols of one file (repo-relative, or absolute under the root) with their
        lines and one-line signatures, from the index; a file changed since it was
        indexed is parsed as it is now (`reparsed`)."""
        root, db = self._state()
        try:
            return outline_of(db, root, repo_path(root, path))
        finally:
            db.close()

    def grep(self, pattern: str, *, path: str | None = None, ignore_case: bool = False,
             limit: int | None = None) -> GrepResult:
        """The lines of the indexed files matching the regular expression `pattern`
        (Python `re`, searched line by line as ripgrep does), read from disk now, in path
        and line order; `path` keeps files matching a glob, `limit` caps the lines.
        Only the files the grep index cannot rule out are read (`retrieval.agent.grep`)."""
        root, db = self._state()
        try:
            index = self.trigrams(root).current(db)
            return grep_files(root, db, index, pattern, path=path, ignore_case=ignore_case,
                              limit=None if limit is None else _positive(limit),
                              freshness=self._freshness)
        finally:
            db.close()

    def references(self, name: str, *, path: str | None = None,
                   limit: int = REFERENCES.default) -> list[ReferenceHit]:
        """The chunks that use `name` (an identifier, or a qualified name whose last part
        is looked for), best first; in a language with a grammar only identifier nodes
        count, elsewhere whole words (`approximate`). See `retrieval.agent.references`."""
        root, db = self._state()
        try:
            index = self.trigrams(root).current(db)
            return find_references(root, db, index, name, path=path, limit=_positive(limit),
                                   freshness=self._freshness)
        finally:
            db.close()

    def trigrams(self, root: Path) -> TrigramStore:
        """The grep index's store (kept, so a second call finds the index in memory)."""
        folder = codeveil_dir(root) / "trigrams"
        if self._trigram_store is None or self._trigram_store.directory != folder:
            self._trigram_store = TrigramStore(folder)
        return self._trigram_store

    def _state(self) -> tuple[Path, sqlite3.Connection]:
        """The root and a connection to its client state (the caller closes it)."""
        root = find_root(self._path)
        db = open_state_db(state_path(root))
        try:
            check_built(root, db)
        except BaseException:
            db.close()
            raise
        return root, db


def _positive(limit: int) -> int:
    if limit < 1:
        raise ToolInputError(f"limit must be at least 1, got {limit}")
    return limit


def repo_path(root: Path, path: str | Path) -> str:
    """`path` as the index names it: repo-relative with POSIX separators. A relative
    path is taken from the root, as the index's own paths are."""
    given = Path(path)
    full = given if given.is_absolute() else root / given
    try:
        return full.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise ToolInputError(f"{path} is not inside the indexed folder {root}") from None
