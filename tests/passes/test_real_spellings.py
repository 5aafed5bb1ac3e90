"""The GraphFusion patterns on real exports (search_spaces/models/real/): torch.onnx's spellings.

Each file is a small transformers or torchvision model exported by torch 2.13's dynamo exporter
(with and without its optimizer) or its TorchScript exporter (search_spaces/models/export_real.py).
After import and the canonicalize stage, every pattern its architecture calls for must fire as
often as the architecture says (one count per instance; comments say how; other patterns may fire
too), from every exporter alike, and the rewritten graph must compute what the imported one does
(float64 interpreter).
Files the corpus lacks are skipped; no torch is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import run_graph
from fusiontune.ir.onnx_import import import_onnx
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.passes.registry import BY_NAME

CORPUS = Path(__file__).resolve().parents[2] / "search_spaces" / "models" / "real"
EXPORTERS = ("dynamo", "dynamo_noopt", "torchscript")

# 2 layers each. Pre-LN transformers (GPT-2, ViT, Whisper) and BERT (post-LN, whose embedding sum
# feeds its first LayerNorm) have 5 LayerNorms, each reading a sum of two terms; LLaMA, Qwen2 and
# T5 have 5 RMSNorms, the first reading the embeddings, the other 4 a residual sum.
_TRANSFORMER = {"FlashAttention": 2, "AddLayerNorm": 5}
_RMS = {"RmsNormMulSqrt": 5, "AddRmsNorm": 4}
EXPECTED: dict[str, dict[str, int]] = {
    # BERT's TorchScript export writes the erf GELU out (dynamo keeps the Gelu op).
    "bert": _TRANSFORMER,
    "bert.torchscript": {**_TRANSFORMER, "GeluErfDiv": 2},
    # gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3)))).
    "gpt2": {**_TRANSFORMER, "GeluTanh": 2},
    # sdpa: q * sqrt(s), k^T * sqrt(s), Where(IsNaN(p), 0, p); kv heads by repeat_kv; SwiGLU as
    # x * Sigmoid(x) * up.
    "llama": {**_RMS, "FlashAttentionGqa": 2, "SwiGluSigmoid": 2},
    "qwen2": {**_RMS, "FlashAttentionGqa": 2, "SwiGluSigmoid": 2, "MatMulAdd": 6},
    # gated-gelu: gelu_new(x @ wi_0) * (x @ wi_1); attention with a position bias (sdpa) or with the
    # position bias and the mask as two additive terms (eager).
    "t5_encoder": {**_RMS, "FlashAttention": 2, "GeluTanh": 2, "GeGlu": 2},
    "t5_encoder_eager": {**_RMS, "FlashAttention": 2, "GeluTanh": 2, "GeGlu": 2},
    "vit": _TRANSFORMER,
    "vit.torchscript": {**_TRANSFORMER, "GeluErfDiv": 2},
    "whisper_encoder": _TRANSFORMER,
    "whisper_encoder.torchscript": {**_TRANSFORMER, "GeluErfDiv": 4},
}

# BatchNorms after a Conv: the exporters fold them into the conv in eval mode, except dynamo without
# its optimizer. (DenseNet's other BatchNorms follow a Concat, not a Conv, and stay.)
CNN_BATCHNORMS = {
    "resnet18": 20,
    "mobilenet_v3_small": 34,
    "efficientnet_b0": 31,
    "densenet121": 59,
}


def _load(stem: str) -> tuple[Graph, dict[str, np.ndarray]]:
    path = CORPUS / f"{stem}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in the corpus")
    inputs = dict(np.load(CORPUS / f"{stem}.inputs.npz"))
    graph = import_onnx(path, input_shapes={k: v.shape for k, v in inputs.items()})
    return graph, inputs


def _graph_stage(graph: Graph) -> tuple[Graph, dict[str, int]]:
    """The graph after every default GraphFusion pass, and the effected count of each pattern."""
    result = run_pipeline(graph, FusionConfig.resolve(all_switch={"UBFusion": False}))
    counts = {
        s.pattern: s.effected_times
        for s in result.report.stats
        if s.effected_times and BY_NAME[s.pass_name].stage != "canonicalize"
    }
    return result.fused.graph, counts


def _same(before: Graph, after: Graph, inputs: dict[str, np.ndarray], rel: float = 1e-7) -> None:
    """Outputs agree within ``rel`` of their largest magnitude (float64 interpreter)."""
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=0, atol=rel * np.max(np.abs(w)), err_msg=name)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    "model",
    ["bert", "gpt2", "llama", "qwen2", "t5_encoder", "t5_encoder_eager", "vit", "whisper_encoder"],
)
def test_transformer_structures_fuse_from_every_exporter(model: str, exporter: str) -> None:
    stem = f"{model}.{exporter}"
    graph, inputs = _load(stem)
    after, counts = _graph_stage(graph)
    expected = EXPECTED.get(stem, EXPECTED[model])
    assert {p: counts.get(p, 0) for p in expected} == expected
    assert "Expand" not in after.op_counts()  # no repeated kv heads are made
    _same(graph, after, inputs)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("model", sorted(CNN_BATCHNORMS))
def test_conv_batchnorm_folds_what_the_exporter_left_and_nothing_else(
    model: str, exporter: str
) -> None:
    graph, inputs = _load(f"{model}.{exporter}")
    after, counts = _graph_stage(graph)
    assert counts.get("ConvBatchnorm", 0) == (
        CNN_BATCHNORMS[model] if exporter == "dynamo_noopt" else 0
    )
    # Folded weights are rounded to float32 once: a few float32 ulps of the logits.
    _same(graph, after, inputs, rel=1e-5)
