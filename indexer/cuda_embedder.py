"""all-MiniLM-L6-v2 on a CUDA device, through onnxruntime's CUDA execution provider.

Used where a device is found (`cuda_unavailable_reason()` is None) and the index's
model allows it; the CPU path is unchanged and stays the default everywhere else
(`CODEVEIL_DEVICE=cpu` forces it).

Model ids. fp32 on the device runs the same exported fp32 graph as the CPU and records
the same id, `...:onnx-fp32`: the vectors differ by float rounding only (the CPU's ONNX
fp32 and torch fp32 agree to a cosine of 1.00000 on real chunks, bench/embed_backends.py),
so a GPU machine and a CPU fp32 machine share cache entries and workspaces. int8 is a
different vector (cosine 0.9925 on average to fp32, 0.98 at worst), which is why the
CPU default keeps its own id and a workspace built with it is extended with int8 on the
CPU even where a device exists. fp16 records `...:onnx-fp16` until its cosine to fp32
has been measured on a device (bench/device_embed.py prints it).

Batches are bigger than on the CPU (`GPU_BATCH`): a device is starved by 64 short texts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexer.embedder import Embedder
from indexer.errors import EmbedderError
from indexer.onnx_embedder import MINILM_NAME, OnnxEmbedder, load_graph

log = logging.getLogger(__name__)

DevicePrecision = Literal["fp32", "fp16"]
#: Texts per device batch; chosen to fill a device without padding long runs much
#: (batches are sorted by length, so one batch holds texts of similar length).
GPU_BATCH = 256
ENV_DEVICE = "CODEVEIL_DEVICE"
_PROVIDER = "CUDAExecutionProvider"


@cache
def cuda_unavailable_reason() -> str | None:
    """Why no CUDA device can embed here, or None if one can."""
    if os.environ.get(ENV_DEVICE, "").lower() == "cpu":
        return f"{ENV_DEVICE}=cpu"
    try:
        import onnxruntime as ort
    except Exception as exc:
        return f"onnxruntime cannot be imported ({exc})"
    if _PROVIDER not in ort.get_available_providers():
        return "this onnxruntime has no CUDA provider (pip install onnxruntime-gpu)"
    try:
        from onnx import TensorProto, helper

        node = helper.make_node("Relu", ["x"], ["y"])
        graph = helper.make_graph(
            [node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = ort.InferenceSession(model.SerializeToString(), providers=[_PROVIDER])
    except Exception as exc:  # no driver, no device, a library missing
        return f"the CUDA provider could not start ({exc})"
    if session.get_providers()[0] != _PROVIDER:
        return "onnxruntime fell back to the CPU (no CUDA device visible)"
    return None


class CudaOnnxEmbedder(OnnxEmbedder):
    """The exported fp32 graph on a CUDA device, run in fp32 or fp16."""

    def __init__(self, precision: DevicePrecision = "fp32", *, device_id: int = 0,
                 models_directory: Path | None = None) -> None:
        if precision not in ("fp32", "fp16"):
            raise EmbedderError(f"unknown device precision {precision!r}; use fp32 or fp16")
        super().__init__("fp32", models_directory=models_directory)
        self.device_precision = precision
        self.model_id = f"{MINILM_NAME}:onnx-{precision}"
        self.device_id = device_id
        self._device_lock = threading.Lock()
        self.small_batches_on_one_thread = False  # every batch runs on the device

    def _load(self, *, bulk: bool = True, latency: bool = False) -> Any:
        with self._device_lock:
            if self._session is not None:
                return self._session
            import onnxruntime as ort

            reason = cuda_unavailable_reason()
            if reason is not None:
                raise EmbedderError(f"cannot embed on a CUDA device: {reason}")
            data = load_graph("fp32", self._directory)
            if self.device_precision == "fp16":
                data = _to_fp16(data)
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            providers = [(_PROVIDER, {"device_id": self.device_id}), "CPUExecutionProvider"]
            session = ort.InferenceSession(data, options, providers=providers)
            if session.get_providers()[0] != _PROVIDER:
                raise EmbedderError("onnxruntime placed the model on the CPU, not the device")
            self._input_names = [i.name for i in session.get_inputs()]
            self._session = session
            return session

    def embed(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = GPU_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        return Embedder.embed(self, texts, batch_size=max(batch_size, GPU_BATCH),
                              progress=progress)


def _to_fp16(data: bytes) -> bytes:
    """The fp32 graph with weights and activations in fp16; inputs and outputs stay
    as they are (int64 ids in, fp32 hidden states out), so the pooling is unchanged."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load_from_string(data)
    return convert_float_to_float16(model, keep_io_types=True).SerializeToString()


def device_embedder(precision: DevicePrecision = "fp32") -> Embedder | None:
    """The device embedder if a CUDA device can run it here, else None (with the
    reason logged at debug level: no device is the usual case)."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        log.debug("embedding on the CPU: %s", reason)
        return None
    return CudaOnnxEmbedder(precision)


__all__ = ["GPU_BATCH", "CudaOnnxEmbedder", "cuda_unavailable_reason", "device_embedder"]
