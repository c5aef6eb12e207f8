"""Which embedder runs: the CODEVEIL_EMBEDDER names, the default, and the embedder that
makes a given model id's vectors (the one a workspace was built with).

Imports run one way: this registry imports the backends (`indexer.embedder` for the
interface, torch and hashing; `indexer.onnx_embedder` and `indexer.cuda_embedder` on
use), and no backend imports the registry.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from indexer.embedder import MINILM_DIM, Embedder, HashingEmbedder, SentenceTransformerEmbedder
from indexer.errors import EmbedderError

if TYPE_CHECKING:
    from indexer.onnx_embedder import Precision

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MINILM",
    "EMBEDDERS",
    "default_embedder",
    "embedder_for_model_id",
    "embedder_name",
    "minilm_embedder",
]


def minilm_embedder(precision: Precision = "int8", *, threads: int | None = None) -> Embedder:
    """all-MiniLM-L6-v2 on the fastest backend this machine runs well, at most `precision`.

    int8 falls back to ONNX fp32 on a CPU without fast int8 kernels, and ONNX to torch
    when onnxruntime is unusable; each fallback is logged with its reason. The model id
    of the returned embedder says what actually runs. Where a CUDA device is found, the
    fp32 graph runs on it instead (`indexer.cuda_embedder`: same vectors and model id as
    the CPU's fp32).
    """
    from indexer import onnx_embedder
    from indexer.cuda_embedder import device_embedder

    device = device_embedder("fp32")
    if device is not None:
        return device
    reason = onnx_embedder.onnx_unavailable_reason()
    if reason is not None:
        log.warning("using torch for the embedding model: %s", reason)
        return SentenceTransformerEmbedder(threads=threads)
    if precision == "int8":
        reason = onnx_embedder.int8_unsupported_reason()
        if reason is not None:
            log.warning("using ONNX fp32 instead of int8 for the embedding model: %s", reason)
            precision = "fp32"
    return onnx_embedder.OnnxEmbedder(precision, threads=threads)


def _onnx_minilm(precision: Precision) -> Callable[[], Embedder]:
    def make() -> Embedder:
        return minilm_embedder(precision)

    return make


#: The backend that "minilm" (the default) runs: the fastest whose retrieval quality
#: stays within a point of torch fp32, as measured by bench/embed_backends.py
#: (int8: 1.65x torch's chunks/s on an AVX2 CPU, CoSQA MRR 53.3 against 53.8).
DEFAULT_MINILM = "minilm-onnx-int8"

#: CODEVEIL_EMBEDDER names. The ONNX ones fall back (int8 -> ONNX fp32 -> torch) with a
#: logged reason where this machine cannot run them; the model id says what runs.
EMBEDDERS: dict[str, Callable[[], Embedder]] = {
    "minilm-torch": SentenceTransformerEmbedder,
    "minilm-onnx": _onnx_minilm("fp32"),
    "minilm-onnx-int8": _onnx_minilm("int8"),
    "hashing": HashingEmbedder,
    "static": lambda: _static(),
}
EMBEDDERS["minilm"] = EMBEDDERS[DEFAULT_MINILM]


def _static() -> Embedder:
    from indexer.static_embedder import StaticEmbedder

    return StaticEmbedder()


def embedder_name(model_id: str) -> str | None:
    """The EMBEDDERS name that makes vectors of `model_id`, None if none does."""
    names = {
        "sentence-transformers/all-MiniLM-L6-v2:torch-fp32": "minilm-torch",
        "sentence-transformers/all-MiniLM-L6-v2:onnx-fp32": "minilm-onnx",
        "sentence-transformers/all-MiniLM-L6-v2:onnx-int8": "minilm-onnx-int8",
        f"codeveil/hashing-{MINILM_DIM}": "hashing",
    }
    return names.get(model_id)


def embedder_for_model_id(model_id: str) -> Embedder | None:
    """The embedder that makes vectors of `model_id` (say, the one a workspace was built
    with), with no fallback to another backend; None if none here does."""
    if model_id.startswith("codeveil/hashing-"):
        return HashingEmbedder(int(model_id.rsplit("-", 1)[1]))
    if model_id.startswith("codeveil/static-"):
        static = _static()
        return static if static.model_id == model_id else None
    model, _, backend = model_id.rpartition(":")
    if model != "sentence-transformers/all-MiniLM-L6-v2":
        return None
    if backend == "torch-fp32":
        return SentenceTransformerEmbedder()
    if backend in ("onnx-fp32", "onnx-fp16"):
        # fp32 runs on a CUDA device where there is one (same vectors); fp16 only there.
        from indexer.cuda_embedder import device_embedder

        device = device_embedder("fp16" if backend == "onnx-fp16" else "fp32")
        if device is not None or backend == "onnx-fp16":
            return device
    if backend in ("onnx-fp32", "onnx-int8"):
        from indexer.onnx_embedder import OnnxEmbedder

        return OnnxEmbedder("int8" if backend == "onnx-int8" else "fp32")
    return None


def default_embedder() -> Embedder:
    """The embedder `codeveil index` uses: all-MiniLM-L6-v2 unless CODEVEIL_EMBEDDER names
    another (`hashing` is for measuring the system around the model, not for search)."""
    name = os.environ.get("CODEVEIL_EMBEDDER", "minilm")
    try:
        return EMBEDDERS[name]()
    except KeyError:
        raise EmbedderError(
            f"CODEVEIL_EMBEDDER={name!r} is not a known embedder; use one of {sorted(EMBEDDERS)}"
        ) from None
