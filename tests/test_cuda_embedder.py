"""The CUDA path: used where a device is, the CPU path unchanged where none is.

The device tests run where onnxruntime finds a CUDA device and are skipped, with the
reason, everywhere else (this project's CI machines have none)."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import cuda_embedder
from indexer.cuda_embedder import CudaOnnxEmbedder, cuda_unavailable_reason
from indexer.embedder_registry import embedder_for_model_id, minilm_embedder
from indexer.errors import EmbedderError
from indexer.onnx_embedder import OnnxEmbedder

TEXTS = [
    "def upload(path):\n    for attempt in range(5):\n        return put(path)",
    "retry the upload with exponential backoff",
    "class Session:\n    def send(self, request): ...",
]
REASON = cuda_unavailable_reason()
needs_device = pytest.mark.skipif(REASON is not None, reason=f"no CUDA device: {REASON}")


@pytest.mark.skipif(REASON is None, reason="a CUDA device is present")
def test_cpu_path_is_the_default_without_a_device() -> None:
    model = minilm_embedder("int8")
    assert type(model) is OnnxEmbedder  # not the device embedder
    assert model.model_id.endswith((":onnx-int8", ":onnx-fp32"))
    # An fp16 index can only be extended where a device is.
    assert embedder_for_model_id("sentence-transformers/all-MiniLM-L6-v2:onnx-fp16") is None
    assert type(embedder_for_model_id("sentence-transformers/all-MiniLM-L6-v2:onnx-fp32")) \
        is OnnxEmbedder
    with pytest.raises(EmbedderError, match="cannot embed on a CUDA device"):
        CudaOnnxEmbedder("fp32").embed(["x"])


def test_cpu_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEVEIL_DEVICE", "cpu")
    cuda_unavailable_reason.cache_clear()
    try:
        assert cuda_unavailable_reason() == "CODEVEIL_DEVICE=cpu"
        assert cuda_embedder.device_embedder() is None
    finally:
        cuda_unavailable_reason.cache_clear()


def test_device_model_ids_and_precisions() -> None:
    assert CudaOnnxEmbedder("fp32").model_id == OnnxEmbedder("fp32").model_id
    assert CudaOnnxEmbedder("fp16").model_id.endswith(":onnx-fp16")
    with pytest.raises(EmbedderError, match="fp32 or fp16"):
        CudaOnnxEmbedder("int8")  # type: ignore[arg-type]


@needs_device
def test_device_is_used_by_default() -> None:
    model = minilm_embedder("int8")
    assert isinstance(model, CudaOnnxEmbedder)
    assert model.model_id.endswith(":onnx-fp32")


@needs_device
@pytest.mark.parametrize(("precision", "floor"), [("fp32", 0.9999), ("fp16", 0.999)])
def test_device_vectors_match_the_cpu(precision: str, floor: float) -> None:
    cpu = OnnxEmbedder("fp32").embed(TEXTS)
    gpu = CudaOnnxEmbedder(precision).embed(TEXTS)  # type: ignore[arg-type]
    assert gpu.shape == cpu.shape and gpu.dtype == np.float32
    assert np.allclose(np.linalg.norm(gpu, axis=1), 1.0, atol=1e-3)
    assert float((gpu * cpu).sum(axis=1).min()) > floor
