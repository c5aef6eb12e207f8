"""A static embedding model: a text's vector is the mean of its word pieces' vectors.

No network runs: a text is tokenised (MiniLM's own word pieces) and its pieces' rows of
one table are averaged, so a chunk costs microseconds instead of MiniLM's ~35 ms a core,
and a query well under a millisecond. The table is derived from the bundled MiniLM (each
piece's vector is what MiniLM makes of it, reduced to 256 dimensions, weighted down by
how common the piece is) and then trained on code so that the mean of a chunk's rows
points where MiniLM's vector of the chunk points (`bench/static_model.py` rebuilds it).
It is the first tier of meaning: every chunk gets a vector while `index` runs, and
MiniLM's vectors take over as the builder lands them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedder import Embedder
from indexer.errors import EmbedderError

#: Where the shipped table and its tokenizer lie (inside the package).
MODEL_DIR = Path(__file__).resolve().parent / "static_model"
EMBEDDINGS_FILE = "embeddings.npy"
TOKENIZER_FILE = "tokenizer.json"
#: Word pieces of a text read: a chunk is rarely longer; past it the mean barely moves.
MAX_PIECES = 2048


class StaticEmbedder(Embedder):
    """Mean of word-piece vectors, L2-normalised; `model_dir` holds embeddings.npy (float16
    [pieces, dim]) and tokenizer.json (MiniLM's word pieces, no special tokens)."""

    def __init__(self, model_dir: Path | None = None) -> None:
        self.model_dir = Path(model_dir or os.environ.get("CODEVEIL_STATIC_MODEL") or MODEL_DIR)
        try:
            stat = (self.model_dir / EMBEDDINGS_FILE).stat()
        except OSError as exc:
            raise _unreadable(self.model_dir, exc) from exc
        # Loaded once per process and table (a rebuilt table is read again).
        table, tokenizer, version = _load(self.model_dir, stat.st_mtime_ns, stat.st_size)
        self._table = table
        self._tokenizer = tokenizer
        self.dim = int(table.shape[1])
        self.max_tokens = MAX_PIECES
        self.model_id = f"codeveil/static-minilm-{self.dim}:{version}"

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        from scipy.sparse import csr_matrix

        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        ids = [e.ids[:MAX_PIECES] for e in encodings]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        # Each text's pieces counted in a sparse row: one product sums their vectors,
        # 10x faster than gathering every piece's row (pieces x dim floats) first.
        counts = csr_matrix((np.ones(len(flat), dtype=np.float32), flat,
                             np.concatenate(([0], np.cumsum(lengths)))),
                            shape=(len(ids), self._table.shape[0]))
        out = np.asarray(counts @ self._table, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


@cache
def _load(model_dir: Path, mtime_ns: int, size: int) -> tuple[np.ndarray, Any, str]:
    """(the table as float32, the tokenizer, the table's identity: vectors of two
    different tables never mix in one index)."""
    import xxhash
    from tokenizers import Tokenizer

    try:
        raw = (model_dir / EMBEDDINGS_FILE).read_bytes()
        # float32 in memory (30 MB): rows summed from float16 would be widened each call.
        table = np.load(io.BytesIO(raw), allow_pickle=False).astype(np.float32)
        tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
    except Exception as exc:  # any unreadable file: numpy and tokenizers raise many kinds
        raise _unreadable(model_dir, exc) from exc
    if table.ndim != 2 or table.shape[0] < tokenizer.get_vocab_size():
        raise _unreadable(model_dir, ValueError(f"a table of shape {table.shape}"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return table, tokenizer, xxhash.xxh64_hexdigest(raw)[:12]


def _unreadable(model_dir: Path, exc: BaseException) -> EmbedderError:
    return EmbedderError(f"the static model in {model_dir} cannot be read ({exc}); "
                         "reinstall codeveil")
