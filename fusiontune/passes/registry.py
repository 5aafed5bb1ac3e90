"""The one registry table: every fusion pass fusiontune knows, in pipeline order.

Adding a pass is one new module and one row here. The pipeline runs the rows stage by stage
(``STAGES``), and within a stage in table order; the fusion log prints them in that order.

Inexact passes (``exact=False``: FastGeluPass, OnePassVarianceFusionPass, the ``precision``
stage) trade accuracy for speed: they are off by default, and each declares the relative error
it may add (``expected_error``), which its run function's docstring derives.
"""

from __future__ import annotations

import difflib

from fusiontune.passes.base import GRAPH_FUSION, UB_FUSION, PassInfo, SplitPoint

STAGES = (
    "canonicalize",
    "graph",
    "backward",
    "split_pre",
    "ub_epilogue",
    "ub_basic",
    "ub_composite",
    "ub_multi",
    "split_post",
    "precision",
)
"""Pipeline order. ``precision`` comes last: its passes annotate the final kernels' arithmetic."""

_G = "fusiontune.passes.graph"
_U = "fusiontune.passes.ub"


def _p(
    name: str,
    aliases: tuple[str, ...],
    kind: str,
    stage: str,
    entry: str,
    summary: str,
    *,
    default: bool = True,
    switchable: bool = True,
    exact: bool = True,
    split_points: tuple[SplitPoint, ...] = (),
    expected_error: float = 0.0,
) -> PassInfo:
    if not exact:
        # `fusiontune passes` shows the summary: say up front what an inexact pass may cost.
        summary = f"inexact (declared error {expected_error:.1e}, see its doc): {summary}"
    return PassInfo(
        name=name,
        aliases=aliases,
        kind=kind,
        default=default,
        switchable=switchable,
        exact=exact,
        split_points=split_points,
        entry=entry,
        summary=summary,
        stage=stage,
        expected_error=expected_error,
    )


PASSES: tuple[PassInfo, ...] = (
    # ---- canonicalize: needed for correctness, never switched off ------------------------------
    _p("ConstantFoldingPass", ("constant_folding",), GRAPH_FUSION, "canonicalize",
       f"{_G}.constant_folding:constant_folding",
       "evaluate nodes whose inputs are all constants", switchable=False),
    _p("IdentityEliminationPass", ("identity_elimination",), GRAPH_FUSION, "canonicalize",
       f"{_G}.identity_elimination:identity_elimination",
       "drop no-op Reshape/Transpose/Cast/Expand and x*1, x+0", switchable=False),
    _p("CanonicalizationPass", ("canonicalization",), GRAPH_FUSION, "canonicalize",
       f"{_G}.canonicalize:canonicalization",
       "exact rules to one normal form: a*Rsqrt(v) -> a/Sqrt(v), Pow(x,2) -> x*x, Neg(Neg(x)) -> x,"
       " cast round trips, operand order...", switchable=False),
    # ---- GraphFusion: math rewrites ------------------------------------------------------------
    _p("MatMulBiasAddFusionPass", ("matmul_biasadd_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.matmul_bias_add:matmul_bias_add_fusion",
       "MatMul + BiasAdd/Add(vector) -> MatMul with a bias input"),
    _p("ConvBatchnormFusionPass", ("conv_bn_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.conv_batchnorm:conv_batchnorm_fusion",
       "Conv + inference BatchNorm (constants) -> Conv with folded weights and bias"),
    _p("ConvBiasAddFusionPass", ("conv_biasadd_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.conv_bias_add:conv_bias_add_fusion",
       "Conv + Add(per-channel constant) -> Conv with a bias input"),
    _p("GeluFusionPass", ("gelu_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.gelu:gelu_fusion",
       "0.5*x*(1+erf(x/sqrt2)) or its tanh form, written out -> Gelu"),
    _p("FastGeluPass", ("fast_gelu_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.fast_gelu:fast_gelu_fusion",
       "erf GELU (node or subgraph) -> tanh approximation",
       default=False, exact=False, expected_error=5e-4),
    _p("SoftmaxFusionPass", ("softmax_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.softmax:softmax_fusion",
       "max / sub / exp / sum / div -> Softmax"),
    # After SoftmaxFusionPass: it matches the Softmax node that pass makes of the decomposed form.
    _p("FlashAttentionFusionPass", ("FlashAttentionFusionV1", "FlashAttentionFusionV2"), GRAPH_FUSION, "graph",
       f"{_G}.flash_attention:flash_attention_fusion",
       "MatMul(q, k^T) * scale + mask -> Softmax -> MatMul(., v) -> one Attention kernel (online softmax)",
       split_points=(SplitPoint("kv_block", 0, 4096, "keys per block of the attention kernel; 0: all keys in one block", (0, 32, 64, 128)),)),
    _p("LayerNormFusionPass", ("layer_norm_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.layer_norm:layer_norm_fusion",
       "decomposed mean/var normalization -> LayerNorm"),
    _p("RmsNormFusionPass", ("rms_norm_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.rms_norm:rms_norm_fusion",
       "decomposed mean-of-squares normalization -> RMSNorm"),
    _p("AddLayerNormFusionPass", ("add_layer_norm_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.add_norm:add_layer_norm_fusion",
       "Add + LayerNorm -> AddLayerNorm (also returns the sum)"),
    _p("AddRmsNormFusionPass", ("add_rms_norm_fusion", "add_cast_rms_norm_cast_fusion"), GRAPH_FUSION, "graph",
       f"{_G}.add_norm:add_rms_norm_fusion",
       "Add + RMSNorm -> AddRmsNorm (also returns the sum)"),
    _p("OnePassVarianceFusionPass", ("one_pass_variance",), GRAPH_FUSION, "graph",
       f"{_G}.one_pass_variance:one_pass_variance_fusion",
       "LayerNorm variance as E[x^2] - E[x]^2 in one sweep",
       default=False, exact=False, expected_error=1e-6),
    _p("SwiGluFusionPass", ("inference_swiglu_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.swiglu:swiglu_fusion",
       "silu(gate) * up -> SwiGlu"),
    # No MindSpore alias: MindSpore has no GeGLU fusion. After GeluFusionPass and FastGeluPass,
    # which make (and may approximate) the Gelu node it matches.
    _p("GeGluFusionPass", (), GRAPH_FUSION, "graph",
       f"{_G}.geglu:geglu_fusion",
       "gelu(gate) * up -> GeGlu (T5 gated-gelu)"),
    _p("RotaryPositionEmbeddingFusionPass", ("rotary_position_embedding_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.rotary:rotary_position_embedding_fusion",
       "x * cos + rotate_half(x) * sin (Slice / Neg / Concat, Mul, Add) -> RotaryPositionEmbedding"),
    _p("SplitConcatFusionPass", ("split_concat_fusion",), GRAPH_FUSION, "graph",
       f"{_G}.split_concat:split_concat_fusion",
       "Concat of a Split's pieces in order -> the input (or one Slice)"),
    _p("MaxPoolConcatSwapPass", ("max_pool_concat_swap",), GRAPH_FUSION, "graph",
       f"{_G}.pool_concat:max_pool_concat_swap",
       "a MaxPool of a channel Concat of conv outputs pools each part instead, so each pool can join its conv"),
    # ---- backward: a training step's loss, backward and optimizer update (training only) --------
    _p("AutodiffPass", ("autodiff",), GRAPH_FUSION, "backward",
       f"{_G}.autodiff:autodiff",
       "training only: add the loss, the backward of the fused forward and the optimizer update",
       switchable=False),
    # The fused backward ops (ir/_ops_grad.py): the rules write them; GradExpanderPass first expands
    # the ops of the passes that are off (an off switch gives the primitive backward), then each
    # pass keeps its op (one kernel, reading saved forward statistics) or expands it. Attention's
    # before Softmax's: AttentionGrad's expansion holds a SoftmaxGrad. Their recompute split points
    # have no choices: a training space lists [0, 1] to search them.
    _p("GradExpanderPass", ("grad_expander",), GRAPH_FUSION, "backward",
       f"{_G}.grad_expander:grad_expander",
       "training only: expand the grad ops of the backward passes that are off into primitives",
       switchable=False),
    _p("AttentionGradFusionPass", ("attention_grad_fusion", "FlashAttentionGradFusion"), GRAPH_FUSION, "backward",
       f"{_G}.attention_grad:attention_grad_fusion",
       "training only: Attention's backward as one AttentionGrad kernel (scores, softmax and ds stay in cache)"),
    _p("SoftmaxGradFusionPass", ("softmax_grad_fusion",), GRAPH_FUSION, "backward",
       f"{_G}.softmax_grad:softmax_grad_fusion",
       "training only: Softmax's backward (attention's too) as one SoftmaxGrad kernel from the saved output"),
    _p("LayerNormGradFusionPass", ("layer_norm_grad_fusion",), GRAPH_FUSION, "backward",
       f"{_G}.norm_grad:layer_norm_grad_fusion",
       "training only: LayerNorm's backward as one LayerNormGrad kernel reading the forward's mean and rstd",
       split_points=(SplitPoint("recompute", 0, 1, "1: the backward kernel recomputes mean and rstd instead of reading the forward's"),)),
    _p("RmsNormGradFusionPass", ("rms_norm_grad_fusion",), GRAPH_FUSION, "backward",
       f"{_G}.norm_grad:rms_norm_grad_fusion",
       "training only: RMSNorm's backward as one RmsNormGrad kernel reading the forward's rstd",
       split_points=(SplitPoint("recompute", 0, 1, "1: the backward kernel recomputes rstd instead of reading the forward's"),)),
    _p("GeluGradFusionPass", ("gelu_grad_fusion",), GRAPH_FUSION, "backward",
       f"{_G}.gelu_grad:gelu_grad_fusion",
       "training only: GELU's backward as one GeluGrad op reading the forward's Phi(x) (no erf in the backward)",
       split_points=(SplitPoint("recompute", 0, 1, "1: the backward recomputes Phi(x) (erf) instead of reading the forward's"),)),
    _p("ReluGradFusionPass", ("relu_grad_fusion", "add_relu_grad_fusion"), GRAPH_FUSION, "backward",
       f"{_G}.relu_grad:relu_grad_fusion",
       "training only: Relu's (Add+Relu's) backward as one ReluGrad op reading the forward's output"),
    # ---- after the backward, before grouping: the last GraphFusion rewrite (TransposeMatMul) ---
    # A GraphFusion pass in the split_pre stage, ahead of its UBFusion rows: it sees the backward's
    # MatMul(dY, Transpose(W)) / MatMul(Transpose(X), dY), after every pattern over MatMul ran.
    _p("TransposeMatMulFusionPass", ("transpose_matmul_fusion",), GRAPH_FUSION, "split_pre",
       f"{_G}.transpose_matmul:transpose_matmul_fusion",
       "MatMul(Transpose(a), b) -> MatMul(a, b, trans_a) (and trans_b): BLAS reads the operand transposed, no layout kernel"),
    _p("BatchMatmulReduceFusionPass", ("batch_matmul_reduce_fusion",), GRAPH_FUSION, "split_pre",
       f"{_G}.matmul_batch_reduce:batch_matmul_reduce_fusion",
       "ReduceSum over the batch of MatMul(x, dy, trans_a) -> one GEMM over the stacked rows (a weight gradient)"),
    # ---- split fusion before grouping: cut an op into parts that fuse with different neighbours --
    _p("NormSplitFusionPass", ("norm_split_fusion",), UB_FUSION, "split_pre",
       f"{_U}.norm_split:norm_split_fusion",
       "split a normalization into statistics (fuse with producer) and elementwise part (fuse with consumers)",
       split_points=(SplitPoint("stats", 0, 1, "1: cut LayerNorm/RMSNorm/Softmax between statistics and the elementwise part", (0, 1)),)),
    # After NormSplitFusionPass: an elementwise part it cut off is recomputable from stored statistics.
    # No choices: a training space lists the values (an inference graph has nothing to recompute).
    _p("RecomputeSplitFusionPass", ("recompute_split_fusion",), UB_FUSION, "split_pre",
       f"{_U}.recompute:recompute_split_fusion",
       "training only: recompute cheap forward values in the backward instead of storing them (less peak memory)",
       split_points=(SplitPoint("recompute", 0, 3, "0: store every activation the backward reads; 1: recompute cheap elementwise/layout chains; 2: also transcendentals and normalizations; 3: also the attention core"),)),
    # ---- UBFusion: kernel grouping -------------------------------------------------------------
    _p("MatmulElemBiasaddFusionPass", ("matmul_elem_biasadd_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.matmul_epilogue:matmul_elem_biasadd_fusion",
       "MatMul kernel applies its bias add as an epilogue"),
    _p("MatmulElemReluFusionPass", ("matmul_elem_relu_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.matmul_epilogue:matmul_elem_relu_fusion",
       "MatMul kernel applies a following Relu as an epilogue"),
    _p("MatmulElemGeluFusionPass", ("matmul_elem_gelu_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.matmul_epilogue:matmul_elem_gelu_fusion",
       "MatMul kernel applies a following Gelu as an epilogue"),
    _p("MatmulElemAddFusionPass", ("matmul_elem_add_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.matmul_epilogue:matmul_elem_add_fusion",
       "MatMul kernel adds a same-shape tensor (residual) as an epilogue"),
    _p("TbeConvElemwiseFusionPass", ("conv_elemwise_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.conv_epilogue:conv_elemwise_fusion",
       "Conv kernel applies following elementwise ops (Relu, Clip, residual Add, BatchNorm...) per output block"),
    _p("ConvMaxPoolFusionPass", ("conv_max_pool_fusion",), UB_FUSION, "ub_epilogue",
       f"{_U}.conv_pool:conv_max_pool_fusion",
       "a MaxPool after a Conv's epilogue runs in the conv kernel, over its block of channels in cache"),
    _p("TbeEltwiseFusionPass", ("basic_ops_fusion",), UB_FUSION, "ub_basic",
       f"{_U}.eltwise:eltwise_fusion",
       "basic fusion: chains of simple elementwise ops -> one kernel"),
    # After basic fusion: it takes a chain (BatchNorm + Relu) as one producer group.
    _p("TbeElemwiseConvFusionPass", ("elemwise_conv_fusion",), UB_FUSION, "ub_basic",
       f"{_U}.conv_prologue:elemwise_conv_fusion",
       "Conv kernel computes its input with the elementwise ops before it (BatchNorm + Relu, an SE gate's scale) as it copies it"),
    _p("CompositeOpsFusionPass", ("composite_ops_fusion",), UB_FUSION, "ub_composite",
       f"{_U}.composite:composite_fusion",
       "composite fusion: groups absorb reductions, transcendental ops and neighbouring groups"),
    _p("TbeMultiOutputFusionPass", ("multi_output_fusion",), UB_FUSION, "ub_multi",
       f"{_U}.multi_output:multi_output_fusion",
       "sibling groups that read the same input -> one multi-output kernel"),
    # After basic and composite fusion: the loop kernel it hands a MatMul is complete.
    _p("TbeMatmulElemwiseFusionPass", ("matmul_elemwise_fusion",), UB_FUSION, "ub_multi",
       f"{_U}.matmul_elemwise:matmul_elemwise_fusion",
       "MatMul kernel runs the elementwise kernel reading its product (a weight gradient's optimizer update) as its epilogue"),
    # ---- split fusion after grouping ------------------------------------------------------------
    _p("TbeEltwiseSplitFusionPass", ("elemwise_split_fusion",), UB_FUSION, "split_post",
       f"{_U}.eltwise_split:eltwise_split_fusion",
       "cut long elementwise kernels after `cut` ops",
       split_points=(SplitPoint("cut", 0, 32, "k>0: an elementwise kernel of more than k ops is cut after its k-th op", (0, 2, 4, 8)),)),
    _p("MatMulRowSplitFusionPass", ("matmul_row_split_fusion",), UB_FUSION, "split_post",
       f"{_U}.matmul_row_split:matmul_row_split_fusion",
       "run MatMul in row blocks, applying the epilogue to each block while it is in cache",
       split_points=(SplitPoint("row_block", 0, 4096, "rows per block; the epilogue runs on each block while in cache", (0, 32, 128, 512)),)),
    _p("ConvOutputSplitFusionPass", ("conv_output_split_fusion",), UB_FUSION, "split_post",
       f"{_U}.conv_output_split:conv_output_split_fusion",
       "run Conv in blocks of output rows (im2col) and pick its algorithm",
       split_points=(SplitPoint("rows", 0, 256, "output rows per im2col block; 0: sized to L2", (0, 1, 2, 4, 8)),
                     SplitPoint("algo", 0, 7, "0: codegen rule, 1: im2col + GEMM, 2: direct loop kernel, 3: shifted GEMMs, 4: packed micro-kernel, 5: padded-plane kernel (depthwise), 6: channels-last kernel (depthwise), 7: scaled-rows kernel (1x1, short reductions)", (0, 1, 2, 3, 4)),
                     SplitPoint("orient", 0, 2, "packed conv's vector lanes: 0 codegen rule, 1 over output positions, 2 over output channels", (0, 1, 2)))),
    # Convs whose outputs a channel Concat joins write into its buffer; the Concat runs no kernel.
    _p("ConvConcatFusionPass", ("conv_concat_fusion",), UB_FUSION, "split_post",
       f"{_U}.conv_concat:conv_concat_fusion",
       "the convs of a channel Concat write their channels into its output: no Concat kernel runs"),
    # A Reshape kernel of the final grouping runs as a view of its input's buffer (no copy).
    _p("ReshapeRemovePass", ("reshape_remove",), UB_FUSION, "split_post",
       f"{_U}.reshape_view:reshape_remove",
       "a kernel that is one Reshape becomes a view of its input's buffer: no kernel runs"),
    # ---- precision: inexact annotations of the final kernels' arithmetic (all off by default) --
    _p("ApproxTranscendentalFusionPass", ("approx_transcendental",), UB_FUSION, "precision",
       f"{_U}.approx_transcendental:approx_transcendental_fusion",
       "kernels with exp/tanh/sigmoid/erf use fast approximations",
       default=False, exact=False, expected_error=1e-4),
    _p("LowPrecisionFusionPass", ("enable_low_precision",), UB_FUSION, "precision",
       f"{_U}.low_precision:low_precision_fusion",
       "loop-nest kernels compute in float16 (float32 accumulation)",
       default=False, exact=False, expected_error=2.0**-11),
    _p("LowPrecisionBf16FusionPass", ("enable_low_precision_bf16",), UB_FUSION, "precision",
       f"{_U}.low_precision:low_precision_bf16_fusion",
       "loop-nest kernels compute in bfloat16 (float32 accumulation)",
       default=False, exact=False, expected_error=2.0**-8),
)

BY_NAME: dict[str, PassInfo] = {p.name: p for p in PASSES}
_BY_ALIAS: dict[str, PassInfo] = {a: p for p in PASSES for a in p.aliases}


def lookup(name: str) -> PassInfo | None:
    """A pass by its CANN name or MindSpore alias (exact), or None."""
    return BY_NAME.get(name) or _BY_ALIAS.get(name)


def closest(name: str, n: int = 3) -> list[str]:
    """The known pass names and aliases closest to ``name``, for error messages."""
    known = list(BY_NAME) + list(_BY_ALIAS)
    found = difflib.get_close_matches(name, known, n=n, cutoff=0.5)
    if not found:
        lowered = {k.lower(): k for k in known}
        found = [lowered[k] for k in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.3)]
    return found


def passes_of_kind(kind: str) -> list[PassInfo]:
    return [p for p in PASSES if p.kind == kind]


def switchable_passes() -> list[PassInfo]:
    return [p for p in PASSES if p.switchable]
