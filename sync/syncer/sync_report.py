"""`SyncReport`: what one sync did (sync.syncer.syncer), the `codeveil index --json` keys."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SyncReport:
    """What one sync did. Field names are the `codeveil index --json` keys."""

    files_scanned: int = 0
    files_changed: int = 0
    files_deleted: int = 0
    files_skipped: int = 0
    #: Files whose chunks were copied from another worktree of the repository
    #: (indexer.sibling_chunks), not parsed again.
    files_reused: int = 0
    #: Files the chunker parsed; the others it read were chunked already at the same
    #: content (by the words pass of `codeveil index`, or in another worktree).
    files_parsed: int = 0
    chunks_total: int = 0
    chunks_embedded: int = 0
    chunks_from_cache: int = 0
    #: Chunks whose vectors came from the workspace's sealed rows instead of the model.
    chunks_pulled: int = 0
    #: Changed files this ref's tree now points at in the pool, sent by another ref
    #: (or earlier): no rows uploaded for them.
    files_linked: int = 0
    #: Chunk headers (`path > symbol`) the model embedded for the chunks' second vector
    #: (a sealed workspace's search ranks them); a file's chunks often share one.
    headers_embedded: int = 0
    seconds: float = 0.0
    seconds_walk: float = 0.0
    seconds_chunk: float = 0.0
    seconds_embed: float = 0.0
    seconds_encrypt: float = 0.0
    seconds_sync: float = 0.0
    #: After a large index: the search side (lexical and vector indexes) brought in step
    #: so that the first search does not build it (retrieval.indexes.search_ready).
    seconds_search_ready: float = 0.0
    #: Chunks the model embedded per second of the embed stage (0 when none were).
    embed_chunks_per_s: float = 0.0
    #: Where the embedding ran: "here", or the Ray cluster's address.
    embedded_on: str = "here"
    #: Why the store was not reached ("" when it was): the server was unreachable, and
    #: this machine's index was updated alone; the next sync sends what the store lacks.
    offline: str = ""
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        for k in list(out):
            if k.startswith("seconds"):
                out[k] = round(out[k], 4)
        out["embed_chunks_per_s"] = round(out["embed_chunks_per_s"], 2)
        return out

    def stages(self) -> dict[str, float]:
        """Seconds per stage, in pipeline order. Chunking runs in a thread beside the
        others, so the stages can add up to more than `seconds`."""
        return {"walk": self.seconds_walk, "chunk": self.seconds_chunk,
                "embed": self.seconds_embed, "encrypt": self.seconds_encrypt,
                "sync": self.seconds_sync}

    def _rate(self) -> None:
        self.embed_chunks_per_s = (
            self.chunks_embedded / self.seconds_embed if self.chunks_embedded else 0.0
        )
