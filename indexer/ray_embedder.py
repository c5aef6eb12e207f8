"""Embedding on a Ray cluster: batches go to a pool of actors, vectors come back.

    codeveil index --embed-on ray://HOST:PORT      (or CODEVEIL_EMBED_ON=ray://HOST:PORT)

Trust: the actors receive the chunks' plain text, so the cluster must be inside the
client's trust boundary (your own machines). They never see a key and never talk to a
codeveil server: vectors come back to the client, which caches, encrypts and sends them
as it does its own.

Each actor loads the bundled model once (the same embedder the client would run, by
name) and reports its model id; the pool is used only if every actor's id equals the
client's, so vectors made on the cluster and on the laptop share one cache and one
workspace. `embed_batches` keeps up to `IN_FLIGHT` batches queued per actor and yields
them as they finish. A batch whose actor dies is sent again, to a fresh actor that
takes the dead one's place: a batch's vectors are yielded once, whichever try made
them, so nothing is lost and nothing reaches the store twice.

Ray is an optional extra (`pip install 'codeveil[ray]'`); the actors need codeveil
installed (or on PYTHONPATH) on the cluster's nodes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from indexer.embedder import Embedder
from indexer.embedder_registry import DEFAULT_MINILM, EMBEDDERS
from indexer.errors import EmbedderError

log = logging.getLogger(__name__)

#: Batches queued per actor: one running, one waiting, so an actor never idles on the
#: round trip.
IN_FLIGHT = 2
#: Tries per batch before the index fails (a batch that kills every actor it meets is
#: a bug to report, not to retry forever).
MAX_TRIES = 3


class _EmbedActor:
    """Runs one embedder in a Ray worker process; the model loads once, on creation."""

    def __init__(self, name: str, threads: int) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.model = EMBEDDERS[name]()
        # The model's threads: the actor's CPUs, not the node's (both backends read
        # `_threads` when they load); more actors than cores would only oversubscribe.
        if hasattr(self.model, "_threads"):
            self.model._threads = threads
        self.model.embed_batch(["load the model once"])

    def model_id(self) -> str:
        return self.model.model_id

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.embed_batch(texts)

    def pid(self) -> int:
        return os.getpid()


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise EmbedderError(
            "embedding on a Ray cluster needs ray: pip install 'codeveil[ray]'"
        ) from exc
    return ray


class RayEmbedder(Embedder):
    """An embedder whose batches run on a pool of `actors` Ray actors.

    `address` is what `ray.init` takes (`ray://HOST:PORT`, `auto`, or `local` for a
    cluster started in this process); when Ray is already initialised it is used as it
    is. `model` names the embedder the actors run (default: the client's default).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        actors: int = 2,
        cpus_per_actor: float = 1,
        model: str | None = None,
        batch_size: int = 64,
    ) -> None:
        if actors < 1:
            raise EmbedderError(f"a Ray pool needs at least one actor, not {actors}")
        self.address = address
        self.name = model or os.environ.get("CODEVEIL_EMBEDDER", "minilm")
        if self.name not in EMBEDDERS:
            raise EmbedderError(f"unknown embedder {self.name!r} for the Ray actors")
        if self.name == "minilm":
            self.name = DEFAULT_MINILM
        # The client's own instance of the same model: windows, dim and the model id the
        # actors must match. It loads no weights unless asked to embed.
        self.local = EMBEDDERS[self.name]()
        self.model_id = self.local.model_id
        self.dim = self.local.dim
        self.max_tokens = self.local.max_tokens
        self.batch_size = batch_size
        self._size = actors
        self._cpus = cpus_per_actor
        self._pool: list[Any] = []
        self._started_ray = False
        #: Batches sent again after their actor died (for reports and tests).
        self.retries = 0
        #: Batches whose vectors came back.
        self.batches_done = 0

    # -- the pool ----------------------------------------------------------------------

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
            if self.address:
                kwargs["address"] = self.address
            try:
                ray.init(**kwargs)
            except Exception as exc:
                raise EmbedderError(
                    f"could not connect to the Ray cluster at {self.address or 'auto'}: {exc}"
                ) from exc
            self._started_ray = True
        return ray

    def _new_actor(self) -> Any:
        ray = self._connect()
        cls = ray.remote(num_cpus=self._cpus, max_restarts=0)(_EmbedActor)
        return cls.remote(self.name, max(1, round(self._cpus)))

    def actors(self) -> list[Any]:
        """The pool, started on first use; checks each actor runs the client's model."""
        if not self._pool:
            ray = self._connect()
            pool = [self._new_actor() for _ in range(self._size)]
            try:
                ids = ray.get([a.model_id.remote() for a in pool])
            except Exception as exc:
                raise EmbedderError(f"the Ray actors could not load the model: {exc}") from exc
            wrong = {i for i in ids if i != self.model_id}
            if wrong:
                for a in pool:
                    ray.kill(a)
                raise EmbedderError(
                    f"the Ray actors run {sorted(wrong)} but this machine expects"
                    f" {self.model_id}; vectors of both cannot share an index"
                )
            self._pool = pool
        return self._pool

    def close(self) -> None:
        """Stop the actors (and the Ray session, if this embedder started it)."""
        if not self._pool and not self._started_ray:
            return
        ray = _ray()
        for actor in self._pool:
            try:
                ray.kill(actor)
            except Exception:  # already dead: nothing to stop
                log.debug("Ray actor already gone", exc_info=True)
        self._pool = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    # -- embedding -----------------------------------------------------------------

    def windows(self, text: str) -> list[str]:
        return self.local.windows(text)

    def embed(
        self,
        texts: Sequence[str],
        *,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        return super().embed(texts, batch_size=batch_size or self.batch_size, progress=progress)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        return next(iter(self.embed_batches([texts])))[1]

    def embed_batches(
        self, batches: Sequence[Sequence[str]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        ray = self._connect()
        pool = self.actors()
        todo = list(range(len(batches)))[::-1]  # popped from the end: first batch first
        tries = dict.fromkeys(todo, 0)
        running: dict[Any, tuple[int, int, Any]] = {}  # ref -> (batch, slot, actor)
        load = [0] * len(pool)

        def send(slot: int) -> None:
            b = todo.pop()
            tries[b] += 1
            ref = pool[slot].embed.remote(list(batches[b]))
            running[ref] = (b, slot, pool[slot])
            load[slot] += 1

        def fill() -> None:
            for slot in range(len(pool)):
                while todo and load[slot] < IN_FLIGHT:
                    send(slot)

        fill()
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            ref = ready[0]
            b, slot, actor = running.pop(ref)
            load[slot] -= 1
            try:
                vecs = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if pool[slot] is actor:  # the first of its batches to fail says so
                    self._replace(slot, exc)
                if tries[b] >= MAX_TRIES:
                    raise EmbedderError(
                        f"a batch of {len(batches[b])} chunks failed on {tries[b]} Ray"
                        f" actors in turn: {exc}"
                    ) from exc
                self.retries += 1
                todo.append(b)  # next to go: the order stays roughly by batch number
                fill()
                continue
            self.batches_done += 1
            fill()
            yield b, np.asarray(vecs, dtype=np.float32)

    def _replace(self, slot: int, exc: BaseException) -> None:
        """A fresh actor in the slot of one that died; batches still queued on the dead
        one fail in turn and are sent again to whichever actor has room."""
        old = self._pool[slot]
        log.warning("a Ray embedding actor died (%s); starting another", exc)
        try:
            _ray().kill(old)
        except Exception:
            log.debug("dead Ray actor could not be killed", exc_info=True)
        self._pool[slot] = self._new_actor()


def parse_embed_on(value: str) -> tuple[str, int | None]:
    """(Ray address, actors or None) of an `--embed-on` value: `ray://HOST:PORT`,
    `ray://HOST:PORT?actors=4`, `ray:auto` or `ray:local`."""
    if not value.startswith("ray:"):
        raise EmbedderError(
            f"--embed-on {value!r}: expected ray://HOST:PORT, ray:auto or ray:local"
        )
    address, _, query = value.partition("?")
    actors = None
    if query:
        key, _, number = query.partition("=")
        if key != "actors" or not number.isdigit() or int(number) < 1:
            raise EmbedderError(f"--embed-on {value!r}: the only option is ?actors=N")
        actors = int(number)
    if address in ("ray:auto", "ray:local"):
        address = address.removeprefix("ray:")
    elif not address.startswith("ray://"):
        raise EmbedderError(f"--embed-on {value!r}: expected ray://HOST:PORT")
    return address, actors


__all__ = ["IN_FLIGHT", "MAX_TRIES", "RayEmbedder", "parse_embed_on"]
