"""The corpus of real exports (search_spaces/models/real/): torch.onnx output no one here wrote.

Each file is a small random-initialized transformers or torchvision model exported by torch 2.13's
dynamo exporter (with and without its optimizer) or the TorchScript exporter at opset 17, with its
inputs and the eager PyTorch outputs beside it (search_spaces/models/export_real.py), so this
needs no torch. For every file: it imports, the program of the default configuration matches
onnxruntime and the stored PyTorch outputs within float32 tolerance, and the passes its structures
call for fire as often as the architecture says (:data:`EXPECTED`), from every exporter alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.onnx_import import import_onnx
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import build_program

CORPUS = Path(__file__).resolve().parents[2] / "search_spaces" / "models" / "real"
MANIFEST = json.loads((CORPUS / "MANIFEST.json").read_text())

MAX_REL = 1e-4
"""max |fusiontune - peer| / max |peer| over an output: float32 rounding of a few layers, with room."""

# Per model, what its architecture makes of the default pipeline, derived from the configuration
# export_real.py builds (2 layers each): how many fused nodes of each kind the final graph holds,
# and how often the passes that must do the work apply. The fused-op counts hold for every
# exporter alike; a pass count is listed only where no exporter writes the fused op itself (the
# dynamo exporter writes Gelu and LayerNormalization nodes at opset 20, TorchScript decomposes GELU).
_PRE_NORM_LAYERS = {"AddLayerNorm": 5}  # 2 per layer, each after a residual sum, and a final one
FUSED_OPS: dict[str, dict[str, int]] = {
    # the embedding LayerNorm reads word + position + type embeddings, then 2 per layer
    "bert": {"AddLayerNorm": 5, "Attention": 2, "Gelu": 2, "BiasedMatMul": 12},
    "gpt2": {**_PRE_NORM_LAYERS, "Attention": 2, "Gelu": 2, "BiasedMatMul": 8},
    # the first RMSNorm reads the embeddings; the other 4 read a residual sum
    "llama": {"RMSNorm": 1, "AddRmsNorm": 4, "RotaryPositionEmbedding": 4, "Attention": 2, "SwiGlu": 2},
    "qwen2": {"RMSNorm": 1, "AddRmsNorm": 4, "RotaryPositionEmbedding": 4, "Attention": 2, "SwiGlu": 2,
              "BiasedMatMul": 6},
    "t5_encoder": {"RMSNorm": 1, "AddRmsNorm": 4, "Attention": 2, "GeGlu": 2},
    "t5_encoder_eager": {"RMSNorm": 1, "AddRmsNorm": 4, "Attention": 2, "GeGlu": 2},
    "vit": {**_PRE_NORM_LAYERS, "Attention": 2, "Gelu": 2, "BiasedMatMul": 12},
    "whisper_encoder": {**_PRE_NORM_LAYERS, "Attention": 2, "Gelu": 4, "BiasedMatMul": 10},
    # exporters fold BatchNorm into the convs in eval mode, except without the dynamo optimizer,
    # where ConvBatchnormFusionPass does it: no BatchNorm after a Conv is left either way
    "resnet18": {"BatchNorm": 0, "Conv": 20},
    "mobilenet_v3_small": {"BatchNorm": 0},
    "efficientnet_b0": {"BatchNorm": 0},
    "squeezenet1_1": {"Conv": 26},
    # a LayerNorm (channels last) in the stem, each of the 6 blocks, the 3 downsamplings and the
    # head; a GELU per block
    "convnext_tiny": {"LayerNorm": 11, "Gelu": 6},
    # pre-activation: the BatchNorm before each layer's first conv (58), each transition (3) and
    # the final one follow a concatenation, not a conv, and stay; the 59 after a conv are folded
    "densenet121": {"BatchNorm": 62},
}
PASS_COUNTS: dict[str, dict[str, int]] = {
    "bert": {"AddLayerNormFusionPass": 5, "FlashAttentionFusionPass": 2},
    "gpt2": {"AddLayerNormFusionPass": 5, "FlashAttentionFusionPass": 2},
    "llama": {
        "RmsNormFusionPass": 5,
        "AddRmsNormFusionPass": 4,
        "RotaryPositionEmbeddingFusionPass": 4,
        "FlashAttentionFusionPass": 2,
        "SwiGluFusionPass": 2,
    },
    "t5_encoder": {"RmsNormFusionPass": 5, "AddRmsNormFusionPass": 4, "FlashAttentionFusionPass": 2},
    "vit": {"AddLayerNormFusionPass": 5, "FlashAttentionFusionPass": 2},
    "whisper_encoder": {"AddLayerNormFusionPass": 5, "FlashAttentionFusionPass": 2},
}
PASS_COUNTS["qwen2"] = PASS_COUNTS["llama"]
# Without its optimizer the dynamo exporter leaves every eval-mode BatchNorm after a Conv unfolded.
CONV_BN_UNFOLDED = {"resnet18": 20, "mobilenet_v3_small": 34, "efficientnet_b0": 31, "densenet121": 59}
PASS_COUNTS["t5_encoder_eager"] = PASS_COUNTS["t5_encoder"]


def fused_op_counts(graph: Any) -> dict[str, int]:
    """Op counts of a graph, with MatMuls that carry their bias counted as ``BiasedMatMul``."""
    counts = dict(graph.op_counts())
    counts["BiasedMatMul"] = sum(1 for n in graph.nodes if n.op == "MatMul" and len(n.inputs) == 3)
    return counts


@dataclass(frozen=True)
class Export:
    file: str
    model: str
    exporter: str
    entry: dict[str, Any]

    @property
    def stem(self) -> str:
        return self.file.removesuffix(".onnx")


EXPORTS = [
    Export(e["file"], e["model"], e["exporter"], e) for e in MANIFEST["files"] if e.get("exported")
]


def _load(export: Export) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    inputs = dict(np.load(CORPUS / f"{export.stem}.inputs.npz"))
    torch_out = dict(np.load(CORPUS / f"{export.stem}.torch.npz"))
    return inputs, torch_out


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


@pytest.mark.slow
@pytest.mark.parametrize("export", EXPORTS, ids=lambda e: e.stem)
def test_real_export_imports_matches_peers_and_fuses(export: Export) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = CORPUS / export.file
    inputs, torch_out = _load(export)
    graph = import_onnx(path, input_shapes={k: v.shape for k, v in inputs.items()})
    result = run_pipeline(graph, FusionConfig.defaults())
    program = build_program(result.fused)
    feed = {k: v for k, v in inputs.items() if k in graph.inputs}
    got = program.run(feed)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want_ort = dict(zip(names, session.run(None, inputs), strict=True))
    for name, want in torch_out.items():
        assert got[name].shape == want.shape, name
        assert _max_rel(got[name], want_ort[name]) <= MAX_REL, (name, "onnxruntime")
        assert _max_rel(got[name], want) <= MAX_REL, (name, "pytorch")
    counts = fused_op_counts(result.fused.graph)
    for op, count in FUSED_OPS[export.model].items():
        assert counts.get(op, 0) == count, (op, counts)
    for pass_name, count in PASS_COUNTS.get(export.model, {}).items():
        assert result.report.effected(pass_name) == count, (pass_name, result.report.log_lines())
    if export.model in CONV_BN_UNFOLDED:
        folded = CONV_BN_UNFOLDED[export.model] if export.exporter == "dynamo_noopt" else 0
        assert result.report.effected("ConvBatchnormFusionPass") == folded
