"""The ONNX backends of all-MiniLM-L6-v2: real export, real model, compared to torch."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexer import onnx_embedder
from indexer.chunker import chunk_file
from indexer.embedder import HashingEmbedder, SentenceTransformerEmbedder
from indexer.embedder_registry import EMBEDDERS, default_embedder, minilm_embedder
from indexer.errors import EmbedderError
from indexer.onnx_embedder import OnnxEmbedder, load_graph, read_cached, source_stamp
from indexer.tokens import TokenCounter

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real export (fp32 and int8) per test run, in a temp dir."""
    directory = tmp_path_factory.mktemp("onnx-models")
    load_graph("int8", directory)
    return directory


@pytest.fixture(scope="session")
def onnx_fp32(models: Path) -> OnnxEmbedder:
    return OnnxEmbedder("fp32", models_directory=models)


@pytest.fixture(scope="session")
def onnx_int8(models: Path) -> OnnxEmbedder:
    return OnnxEmbedder("int8", models_directory=models)


@pytest.fixture(scope="session")
def code_chunks() -> list[str]:
    """Real chunks of this repo's own code, as the indexer would embed them."""
    texts = []
    for rel in ("indexer/embedder.py", "indexer/onnx_embedder.py", "indexer/embed_cache.py"):
        texts += [c.embed_text for c in chunk_file(rel, (REPO / rel).read_text())]
    return texts[:16]


@pytest.fixture(scope="session")
def torch_vectors(real_embedder: SentenceTransformerEmbedder, code_chunks: list[str]) -> np.ndarray:
    return real_embedder.embed(code_chunks)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1)


def test_fp32_matches_torch(onnx_fp32, code_chunks, torch_vectors) -> None:
    cos = _cosines(onnx_fp32.embed(code_chunks), torch_vectors)
    assert cos.min() > 0.999


def test_int8_stays_close_to_torch(onnx_int8, code_chunks, torch_vectors) -> None:
    cos = _cosines(onnx_int8.embed(code_chunks), torch_vectors)
    assert cos.mean() > 0.97
    assert cos.min() > 0.95


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_vectors_are_unit_float32_rows(models, precision, code_chunks) -> None:
    model = OnnxEmbedder(precision, models_directory=models)
    texts = [*code_chunks[:5], "x", "ok", "def f(): pass"]  # lengths differ: padding
    vecs = model.embed_batch(texts)
    assert vecs.shape == (len(texts), 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # Padding to the batch's longest text must not change a text's vector. In int8 it
    # moves a little: activations are quantised with one scale per batch tensor.
    alone = model.embed_batch(["x"])[0]
    assert float(alone @ vecs[5]) > (0.9999 if precision == "fp32" else 0.95)


def test_related_code_ranks_first(onnx_int8) -> None:
    vecs = onnx_int8.embed([
        "retry the upload with exponential backoff",
        "def upload(path):\n    for attempt in range(5):\n        try: return put(path)\n"
        "        except ConnectionError: sleep(2 ** attempt)",
        "def area(r):\n    return 3.14159 * r * r",
    ])
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.1


def test_export_is_cached(models, monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted(models.glob("model-*"))
    before = {p: p.stat().st_mtime_ns for p in files}

    def no_export(*_args: object) -> None:
        raise AssertionError("exported again although a valid graph is cached")

    monkeypatch.setattr(onnx_embedder, "_export_fp32_in_child", no_export)
    monkeypatch.setattr(onnx_embedder, "_quantize_int8_in_child", no_export)
    for precision in ("fp32", "int8"):
        OnnxEmbedder(precision, models_directory=models).embed(["cached"])
    assert {p: p.stat().st_mtime_ns for p in files} == before
    manifest = json.loads((models / "model-int8.json").read_text())
    assert manifest["stamp"] == source_stamp()


def test_damaged_or_stale_graphs_are_not_read(models, tmp_path: Path) -> None:
    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    stamp = source_stamp()
    assert read_cached(copy, "fp32", stamp) is not None
    graph = copy / "model-fp32.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the weights: same size, parses fine
    graph.write_bytes(bytes(data))
    assert read_cached(copy, "fp32", stamp) is None
    assert read_cached(copy, "int8", {**stamp, "onnxruntime": "0.0"}) is None
    (copy / "model-int8.json").unlink()
    assert read_cached(copy, "int8", stamp) is None


def test_partial_graph_is_rebuilt(models, tmp_path: Path, caplog) -> None:
    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    graph = copy / "model-int8.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 3])  # a crash mid-copy
    with caplog.at_level(logging.WARNING, logger="indexer.onnx_embedder"):
        vec = OnnxEmbedder("int8", models_directory=copy).embed(["rebuilt"])
    assert "damaged" in caplog.text
    assert read_cached(copy, "int8", source_stamp()) is not None
    assert np.isclose(np.linalg.norm(vec), 1.0)
    assert not list(copy.glob(".tmp-*"))


def test_crash_during_export_leaves_no_usable_half(models, tmp_path, monkeypatch) -> None:
    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    (copy / "model-int8.json").unlink()

    def crash(_fp32: Path, out: Path) -> None:
        out.write_bytes(b"half a graph")
        raise OSError("disk full")

    monkeypatch.setattr(onnx_embedder, "_quantize_int8_in_child", crash)
    with pytest.raises(EmbedderError, match="disk full"):
        load_graph("int8", copy)
    assert read_cached(copy, "int8", source_stamp()) is None
    assert not list(copy.glob(".tmp-*"))
    # The fp32 graph, finished before the crash, is still served as it was.
    assert read_cached(copy, "fp32", source_stamp()) is not None


def test_a_failing_child_export_is_reported(tmp_path: Path) -> None:
    # The real child process, given a graph that is not there: its error comes back.
    with pytest.raises(EmbedderError, match=r"quantize_int8 process failed.*missing\.onnx"):
        onnx_embedder._quantize_int8_in_child(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_model_ids_name_backend_and_precision(models) -> None:
    ids = {
        SentenceTransformerEmbedder().model_id,
        OnnxEmbedder("fp32", models_directory=models).model_id,
        OnnxEmbedder("int8", models_directory=models).model_id,
        HashingEmbedder().model_id,
    }
    assert len(ids) == 4
    assert "sentence-transformers/all-MiniLM-L6-v2:onnx-int8" in ids
    assert "sentence-transformers/all-MiniLM-L6-v2:torch-fp32" in ids


def test_long_text_is_windowed_not_truncated(onnx_int8) -> None:
    text = "\n".join(f"value_{i} = compute_something({i}, other_{i})" for i in range(200))
    pieces = onnx_int8.windows(text)
    counter = TokenCounter()
    assert len(pieces) > 1
    assert all(counter.count(p) <= onnx_int8.max_tokens for p in pieces)
    assert "value_199" in pieces[-1]
    # The whole text's vector is the normalised mean of its windows' vectors. int8
    # quantises activations per batch, so the windows go in the batches `embed` makes.
    mean = onnx_int8.embed(pieces).mean(axis=0)
    assert np.allclose(onnx_int8.embed([text])[0], mean / np.linalg.norm(mean), atol=1e-5)
    with pytest.raises(EmbedderError, match="windows"):
        onnx_int8.embed_batch([text])


def test_int8_falls_back_to_fp32_with_a_reason(monkeypatch, caplog) -> None:
    monkeypatch.setattr(onnx_embedder, "int8_unsupported_reason", lambda: "no AVX2 here")
    with caplog.at_level(logging.WARNING, logger="indexer.embedder_registry"):
        model = minilm_embedder("int8")
    assert model.model_id.endswith(":onnx-fp32")
    assert "no AVX2 here" in caplog.text


def test_no_onnxruntime_falls_back_to_torch(monkeypatch, caplog) -> None:
    monkeypatch.setattr(onnx_embedder, "onnx_unavailable_reason", lambda: "not installed")
    with caplog.at_level(logging.WARNING, logger="indexer.embedder_registry"):
        model = minilm_embedder("int8")
    assert isinstance(model, SentenceTransformerEmbedder)
    assert "not installed" in caplog.text


def test_cpu_check() -> None:
    reason = onnx_embedder._int8_cpu_reason
    assert reason({"SSE41", "AVX"}, "x86_64") is not None
    assert reason({"AVX", "AVX2"}, "x86_64") is None
    assert reason({"AVX512VNNI"}, "AMD64") is None
    assert reason({"ASIMD", "ASIMDDP"}, "aarch64") is None
    # onnxruntime's CPU provider runs the quantised probe graph correctly on any CPU;
    # only whether it is fast depends on the CPU.
    assert onnx_embedder._int8_probe() is None


@pytest.mark.parametrize(
    ("name", "suffix"),
    [("minilm-torch", ":torch-fp32"), ("minilm-onnx", ":onnx-fp32"), ("hashing", "hashing-384")],
)
def test_embedder_names(monkeypatch, name: str, suffix: str) -> None:
    monkeypatch.setenv("CODEVEIL_EMBEDDER", name)
    assert default_embedder().model_id.endswith(suffix)
    assert {"minilm", "minilm-onnx-int8"} <= set(EMBEDDERS)


def test_embedder_for_a_workspace_model_id(models) -> None:
    from indexer.embedder_registry import embedder_for_model_id

    for model in (
        SentenceTransformerEmbedder(),
        OnnxEmbedder("fp32", models_directory=models),
        OnnxEmbedder("int8", models_directory=models),
        HashingEmbedder(64),
    ):
        found = embedder_for_model_id(model.model_id)
        assert found is not None and found.model_id == model.model_id
    assert embedder_for_model_id("someone/else:onnx-int8") is None


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_a_query_runs_on_one_thread_with_the_same_vectors(models: Path, precision: str,
                                                          code_chunks: list[str]) -> None:
    # Small batches (a query and its parts) use a session of one thread, so a busy
    # machine does not make a short query wait for a pool; the vectors must not change.
    pooled = OnnxEmbedder(precision, threads=2, models_directory=models)
    pooled.small_batches_on_one_thread = False
    single = OnnxEmbedder(precision, threads=2, models_directory=models)
    texts = [*code_chunks[:6], "where do we retry failed uploads", "HitFilter"]
    for batch in ([t] for t in texts):
        np.testing.assert_array_equal(single.embed_batch(batch), pooled.embed_batch(batch))
    pair = texts[:2]
    np.testing.assert_array_equal(single.embed_batch(pair), pooled.embed_batch(pair))
    assert single._latency_session is not None and single._session is None
    assert pooled._latency_session is None and pooled._session is not None


def test_the_bulk_threads_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer.onnx_embedder import OnnxEmbedder, env_threads

    monkeypatch.setenv("CODEVEIL_EMBED_THREADS", "1")
    assert env_threads() == 1 and OnnxEmbedder("int8")._threads == 1
    assert OnnxEmbedder("int8", threads=3)._threads == 3  # an explicit count wins
    for junk in ("", "0", "-2", "many"):
        monkeypatch.setenv("CODEVEIL_EMBED_THREADS", junk)
        assert env_threads() is None


def test_a_session_keeps_no_copy_of_its_graph(models: Path) -> None:
    """onnxruntime's Python session keeps the bytes it is made from for its whole life
    (the int8 graph: 58 MB); one made from the checked graph's path keeps none."""
    import gc
    import tracemalloc

    graph_bytes = (models / "model-int8.onnx").stat().st_size
    tracemalloc.start()
    try:
        model = OnnxEmbedder("int8", models_directory=models)
        model.embed_batch(["def verify_password(digest): ..."])  # makes its session
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert model._latency_session is not None or model._session is not None
    assert held < graph_bytes / 4
