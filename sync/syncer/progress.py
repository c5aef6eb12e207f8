"""How a sync reports progress. Its own module so that the CLI can subclass it without
importing the indexing machinery (and numpy, tree-sitter, the store) just to start."""

from __future__ import annotations

from typing import Protocol


class Progress:
    """Receives progress of a sync; the CLI draws it, the library never prints."""

    def scanned(self, files: int) -> None:
        """The walk found `files` candidate files."""

    def planned(self, files: int, chunks_hint: int) -> None:
        """`files` files will be chunked and sent."""

    def files_done(self, n: int) -> None:
        """`n` more files were chunked and sent."""

    def chunks_done(self, embedded: int, cached: int) -> None:
        """More chunks got vectors: `embedded` by the model, `cached` from the cache."""

    def stages(self, seconds: dict[str, float], embed_chunks_per_s: float) -> None:
        """Seconds spent so far per stage (walk, chunk, embed, encrypt, sync), and the
        embed stage's chunks per second; sent after each batch."""


class SyncFollower(Protocol):
    """Work that runs beside one sync and ends with it (retrieval.indexes.search_ready keeps the
    search side built during a large index). `Workspace.sync` hands it the sync's
    progress and finishes it however the sync ends."""

    def watch(self, progress: Progress | None) -> Progress:
        """The progress the sync reports to: `progress` as given, seen by the follower."""
        ...

    def finish(self, *, completed: bool) -> float:
        """The sync is over (`completed`: it succeeded); returns the seconds the last
        step took, reported as the sync's `seconds_search_ready`."""
        ...

    def words(self) -> None:
        """Instead of a sync, only the words were indexed (the vectors are left to the
        index's builder): bring the search side's word indexes in step with them."""
        ...
