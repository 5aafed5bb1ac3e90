"""A stand-in for a MindSpore script that reads its fusion switches from graph_kernel_flags.

Replace it with your own training or inference script. Keep it reading the flags fusiontune
renders, e.g. at its start::

    import os, mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE, device_target="Ascend",
                   graph_kernel_flags=os.environ.get("MS_DEV_GRAPH_KERNEL_FLAGS", ""))

and make it print one JSON object on its last line: ``{"runtime_s": <seconds per step>,
"error": <error against your reference>}``.

What this one does: reads ``MS_DEV_GRAPH_KERNEL_FLAGS`` (``--enable_pass=a,b --disable_pass=c``,
MindSpore's pass names, seed 003), refuses a pass it does not know with a message and exit code
1, logs each pass the way MindSpore and GE do (``graph kernel pass ... is disabled``, and
``GraphFusionPass[name]: pattern=P, matched_times=N, effected_times=M`` for those that ran),
and "runs" a llama-style model whose step time and error come from the deterministic model
below. Every pass is on unless disabled.

The optimum within an error bound of 1e-3: every pass on except matmul_elem_gelu_fusion (the
fastest, but its fused GELU epilogue is an approximation: the planted culprit), split_concat_fusion
and shape_reshape (slower on this model). inference_matmul_split_fusion and inference_swiglu_fusion
help only together. Test hooks: see ``_job_model.py``.
"""

from __future__ import annotations

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _job_model import Model, fail, ge_log_line, misbehave, report  # noqa: E402

PASSES = (  # MindSpore's graph kernel passes on Ascend (seed 003, appendix)
    "FlashAttentionFusionV1",
    "FlashAttentionFusionV2",
    "add_layer_norm_fusion",
    "add_layer_norm_v3_fusion",
    "add_layer_norm_ext_fusion",
    "inference_swiglu_fusion",
    "inference_matmul_split_fusion",
    "shape_reshape",
    "shape_reshape_2",
    "add_rms_norm_quant_fusion",
    "rms_norm_quant_fusion",
    "add_rms_norm_fusion",
    "add_cast_rms_norm_cast_fusion",
    "MatMulAllReduce",
    "split_concat_fusion",
    "matmul_elem_biasadd_fusion",
    "matmul_elem_add_fusion",
    "matmul_elem_relu_fusion",
    "matmul_elem_gelu_fusion",
    "inference_qbmm_add_fusion",
    "inference_qbmm_allreduce_add_fusion",
)

MODEL = Model(
    base_ms=40.0,
    base_error=2e-4,
    speed_ms={
        "matmul_elem_gelu_fusion": -3.0,
        "FlashAttentionFusionV1": -2.5,
        "add_rms_norm_fusion": -1.2,
        "add_layer_norm_fusion": -0.9,
        "matmul_elem_biasadd_fusion": -0.8,
        "matmul_elem_add_fusion": -0.6,
        "split_concat_fusion": +0.7,
        "shape_reshape": +0.3,
    },
    error={
        "matmul_elem_gelu_fusion": 6e-3,
        "FlashAttentionFusionV1": 2e-4,
        "add_rms_norm_fusion": 5e-5,
    },
    pair=("inference_matmul_split_fusion", "inference_swiglu_fusion"),
    pair_ms=-2.0,
    patterns={
        "matmul_elem_gelu_fusion": ("GraphFusion", "MatMulElemGelu", 4),
        "FlashAttentionFusionV1": ("GraphFusion", "FlashAttentionV1", 2),
        "add_rms_norm_fusion": ("GraphFusion", "AddRmsNorm", 4),
        "add_layer_norm_fusion": ("GraphFusion", "AddLayerNorm", 2),
        "matmul_elem_biasadd_fusion": ("GraphFusion", "MatMulElemBiasAdd", 3),
        "matmul_elem_add_fusion": ("GraphFusion", "MatMulElemAdd", 2),
        "split_concat_fusion": ("GraphFusion", "SplitConcat", 1),
        "shape_reshape": ("GraphFusion", "ShapeReshape", 2),
        "inference_matmul_split_fusion": ("GraphFusion", "MatMulSplit", 2),
        "inference_swiglu_fusion": ("GraphFusion", "SwiGlu", 2),
    },
)


def read_flags(text: str) -> dict[str, bool]:
    """The passes on and off: all on, then --enable_pass, then --disable_pass."""
    on = dict.fromkeys(PASSES, True)
    named: dict[str, list[str]] = {"--enable_pass": [], "--disable_pass": []}
    for word in shlex.split(text):
        flag, _, value = word.partition("=")
        if flag not in named:
            continue  # other graph_kernel_flags (--opt_level=2 ...) are not about passes
        for name in filter(None, (n.strip() for n in value.split(","))):
            if name not in on:
                fail(f"ValueError: graph_kernel_flags {flag}: unknown pass {name!r}")
            named[flag].append(name)
    for name in named["--enable_pass"]:
        on[name] = True
    for name in named["--disable_pass"]:
        on[name] = False
    return on


def main() -> None:
    on = read_flags(os.environ.get("MS_DEV_GRAPH_KERNEL_FLAGS", ""))
    misbehave(on)
    for name in PASSES:
        if not on[name]:
            print(f"[INFO] GRAPH_KERNEL({os.getpid()},python): graph kernel pass fusion_group_{name} is disabled.")
    for name, (kind, pattern, matched, effected) in MODEL.fusion_counts(on).items():
        print(ge_log_line(kind, name, pattern, matched, effected, "python"))
    report(MODEL, on, {"steps": 10})


if __name__ == "__main__":
    main()
