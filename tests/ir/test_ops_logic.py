"""The logic, comparison and elementwise ops of real exports (ir/_ops_logic.py and its converters).

Each ONNX converter is checked on one-node models built with ``onnx.helper``, in the opsets where
the op changed, against onnxruntime (the peer no one here wrote): the float64-free interpreter run
of the imported graph and the compiled registry-defaults program must both give onnxruntime's
answer. Where onnxruntime has no kernel (opset-6 And and PRelu, a float Mod with ``fmod=0`` before
opset 28) the peer is the onnx package's reference evaluator or, for the legacy broadcast
attributes, numpy written out from the spec. Then: special values through the attribute variants,
bool values through one fused kernel, and the float64 interpreter's casts of bool and int tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402

from fusiontune.config.fusion_config import FusionConfig  # noqa: E402
from fusiontune.ir import GraphBuilder, run_graph  # noqa: E402
from fusiontune.ir.onnx_import import import_onnx  # noqa: E402
from fusiontune.passes.fused_graph import FusedGraph  # noqa: E402
from fusiontune.passes.pipeline import run_pipeline  # noqa: E402
from fusiontune.runtime import build_program  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6

_rng = np.random.default_rng(7)
SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.0, 100.0, -100.0], np.float32
)


def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (_rng.standard_normal(shape) * scale).astype(np.float32)


def ints(
    *shape: int, lo: int = -5, hi: int = 6, dtype: Any = np.int64, nonzero: bool = False
) -> np.ndarray:
    arr = _rng.integers(lo, hi, shape)
    if nonzero:
        arr[arr == 0] = 1
    return arr.astype(dtype)


def ties(*shape: int) -> np.ndarray:
    """Small integers as floats: comparisons see equal operands."""
    return _rng.integers(-2, 3, shape).astype(np.float32)


def bools(*shape: int) -> np.ndarray:
    return _rng.random(shape) < 0.5


def specials_outer() -> tuple[np.ndarray, np.ndarray]:
    """Every pair of special values: (n, 1) against (1, n)."""
    return SPECIALS[:, None].copy(), SPECIALS[None, :].copy()


@dataclass(frozen=True)
class NodeCase:
    """One ONNX node in one opset.

    Attributes:
        id: the pytest id (``<Op>-<opset>-<what>``).
        op: the ONNX op type.
        opset: the default-domain opset the model is stamped with.
        inputs: graph inputs, in the node's input order (before ``inits``).
        inits: initializers, read after the inputs.
        attrs: node attributes.
        peer: ``ort`` (onnxruntime), ``ref`` (onnx.reference) or ``numpy`` (``expect``).
        expect: for the numpy peer, the expected output from the input arrays.
        rtol, atol: tolerance on float outputs.
    """

    id: str
    op: str
    opset: int
    inputs: tuple[tuple[str, np.ndarray], ...]
    inits: tuple[tuple[str, np.ndarray], ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    peer: str = "ort"
    expect: Callable[..., np.ndarray] | None = None
    rtol: float = RTOL
    atol: float = ATOL


def _c(
    op: str,
    opset: int,
    what: str,
    *inputs: np.ndarray,
    inits: tuple[np.ndarray, ...] = (),
    **kw: Any,
) -> NodeCase:
    names = "abcdefg"
    ins = tuple((names[i], x) for i, x in enumerate(inputs))
    its = tuple((f"w{i}", x) for i, x in enumerate(inits))
    attrs = kw.pop("attrs", {})
    return NodeCase(f"{op}-{opset}-{what}", op, opset, ins, its, attrs, **kw)


NODE_CASES: tuple[NodeCase, ...] = (
    # ---- logic -----------------------------------------------------------------------------------
    _c("And", 7, "row", bools(3, 4), bools(4)),
    _c("Or", 7, "outer", bools(3, 1), bools(1, 4)),
    _c("Xor", 7, "rank3", bools(2, 3, 4), bools(3, 1)),
    _c(
        "And",
        6,
        "legacy_axis0",
        bools(3, 4),
        bools(3),
        attrs={"broadcast": 1, "axis": 0},
        peer="numpy",
        expect=lambda a, b: np.logical_and(a, b[:, None]),
    ),
    _c(
        "Or",
        6,
        "legacy_trailing",
        bools(2, 3, 4),
        bools(4),
        attrs={"broadcast": 1},
        peer="numpy",
        expect=np.logical_or,
    ),
    _c(
        "Xor",
        6,
        "legacy_axis1",
        bools(2, 3, 4),
        bools(3),
        attrs={"broadcast": 1, "axis": 1},
        peer="numpy",
        expect=lambda a, b: np.logical_xor(a, b[:, None]),
    ),
    _c("Not", 7, "bool", bools(3, 5)),
    _c("Not", 22, "bool_rank3", bools(2, 3, 4)),
    # ---- comparisons -----------------------------------------------------------------------------
    _c("Equal", 7, "int64_row", ints(3, 4, lo=-2, hi=3), ints(4, lo=-2, hi=3)),
    _c("Equal", 11, "bool_outer", bools(3, 1), bools(1, 4)),
    _c("Equal", 13, "float_ties", ties(3, 4), ties(3, 4)),
    _c("Equal", 19, "specials", *specials_outer()),
    _c("Greater", 7, "float_row", normal(3, 4), normal(4)),
    _c("Greater", 9, "int64", ints(3, 4), ints(3, 4)),
    _c("Greater", 13, "specials", *specials_outer()),
    _c("Less", 9, "int32_col", ints(3, 4, dtype=np.int32), ints(3, 1, dtype=np.int32)),
    _c("Less", 13, "float_ties", ties(3, 4), ties(4)),
    _c("GreaterOrEqual", 12, "float_ties", ties(3, 4), ties(3, 4)),
    _c("GreaterOrEqual", 16, "int64_outer", ints(3, 1, lo=-2, hi=3), ints(1, 4, lo=-2, hi=3)),
    _c("GreaterOrEqual", 16, "specials", *specials_outer()),
    _c("LessOrEqual", 12, "int64", ints(3, 4, lo=-2, hi=3), ints(3, 4, lo=-2, hi=3)),
    _c("LessOrEqual", 16, "float_ties_row", ties(2, 3, 4), ties(4)),
    _c("LessOrEqual", 16, "specials", *specials_outer()),
    _c("IsNaN", 9, "specials", SPECIALS.reshape(3, 4)),
    _c("IsNaN", 13, "specials", SPECIALS.reshape(2, 6)),
    _c("IsNaN", 20, "float64", SPECIALS.astype(np.float64).reshape(4, 3)),
    _c("IsInf", 10, "both", SPECIALS.reshape(3, 4)),
    _c("IsInf", 10, "positive_only", SPECIALS.reshape(3, 4), attrs={"detect_negative": 0}),
    _c("IsInf", 20, "negative_only", SPECIALS.reshape(3, 4), attrs={"detect_positive": 0}),
    _c(
        "IsInf",
        20,
        "neither",
        SPECIALS.reshape(3, 4),
        attrs={"detect_positive": 0, "detect_negative": 0},
    ),
    # ---- Where: all three operands broadcast -----------------------------------------------------
    _c("Where", 9, "float_three_way", bools(2, 1, 4), normal(3, 1), normal(4)),
    _c("Where", 16, "int64_cond_row", bools(4), ints(3, 4), ints(3, 1)),
    _c(
        "Where", 16, "bool_branches", bools(3, 4), bools(3, 1), bools(4), peer="ref"
    ),  # no bool Where in ort
    _c("Where", 16, "specials", bools(12, 12), *specials_outer()),
    # ---- elementwise -----------------------------------------------------------------------------
    _c("Cos", 7, "wide", normal(3, 5, scale=4.0)),
    _c("Cos", 22, "specials", SPECIALS.reshape(3, 4)),
    _c("Sin", 7, "wide", normal(3, 5, scale=4.0)),
    _c("Sin", 22, "float64", normal(3, 5, scale=4.0).astype(np.float64)),
    _c("Abs", 6, "specials", SPECIALS.reshape(3, 4)),
    _c("Abs", 13, "int64", ints(3, 4)),
    _c("Abs", 13, "int32", ints(3, 4, dtype=np.int32)),
    _c("Sign", 9, "specials", SPECIALS.reshape(3, 4)),
    _c("Sign", 13, "int64", ints(3, 4)),
    _c("Sign", 13, "float64_ties", ties(3, 4).astype(np.float64)),
    _c("Mod", 10, "int64_floor", ints(3, 4, lo=-9, hi=10), ints(4, nonzero=True)),
    _c(
        "Mod",
        13,
        "int64_fmod",
        ints(3, 4, lo=-9, hi=10),
        ints(3, 1, nonzero=True),
        attrs={"fmod": 1},
    ),
    _c(
        "Mod",
        13,
        "int32_floor_outer",
        ints(3, 1, lo=-9, hi=10, dtype=np.int32),
        ints(1, 4, nonzero=True, dtype=np.int32),
    ),
    _c("Mod", 10, "float_fmod", normal(3, 4, scale=5.0), normal(4), attrs={"fmod": 1}),
    _c("Mod", 13, "float_fmod_specials", *specials_outer(), attrs={"fmod": 1}),
    _c(
        "Mod",
        13,
        "float64_fmod",
        normal(3, 4, scale=5.0).astype(np.float64),
        normal(3, 4).astype(np.float64),
        attrs={"fmod": 1},
    ),
    # onnxruntime refuses a float fmod=0 before opset 28, which defines it as the floor remainder
    _c("Mod", 13, "float_floor", normal(3, 4, scale=5.0), normal(3, 4), peer="ref"),
    _c("Softplus", 6, "wide", normal(3, 5, scale=10.0)),
    _c("Softplus", 22, "specials", SPECIALS.reshape(3, 4)),
    _c("Elu", 6, "alpha", normal(3, 5, scale=3.0), attrs={"alpha": 0.7}),
    _c("Elu", 22, "specials", SPECIALS.reshape(3, 4)),
    _c("Selu", 6, "default", normal(3, 5, scale=3.0)),
    _c("Selu", 22, "attrs", normal(2, 3, 4, scale=3.0), attrs={"alpha": 2.0, "gamma": 0.5}),
    _c("PRelu", 7, "nchw_channel_slope", normal(2, 3, 4, 5), inits=(normal(3, 1, 1),)),
    _c("PRelu", 9, "one_slope", normal(3, 5), inits=(np.array([0.25], np.float32),)),
    _c("PRelu", 16, "slope_input_last_axis", normal(2, 3, 4), normal(4)),
    _c(
        "PRelu",
        16,
        "specials",
        np.repeat(SPECIALS[:, None], len(SPECIALS), axis=1),
        SPECIALS[None, :].copy(),
    ),
    _c("PRelu", 6, "same_shape", normal(3, 4), inits=(normal(3, 4),), peer="ref"),
    # ---- casts -----------------------------------------------------------------------------------
    _c("Cast", 13, "float_to_bool", SPECIALS.reshape(3, 4), attrs={"to": onnx.TensorProto.BOOL}),
    _c("Cast", 13, "bool_to_float", bools(3, 4), attrs={"to": onnx.TensorProto.FLOAT}),
    _c("Cast", 19, "int64_to_bool", ints(3, 4, lo=-2, hi=3), attrs={"to": onnx.TensorProto.BOOL}),
    _c("Cast", 6, "bool_to_int64", bools(3, 4), attrs={"to": onnx.TensorProto.INT64}),
    _c("CastLike", 15, "float_to_int64", normal(3, 4, scale=3.0), np.zeros((1,), np.int64)),
    _c("CastLike", 19, "bool_to_float", bools(3, 4), np.zeros((2, 2), np.float32)),
    _c("CastLike", 21, "float_to_bool", SPECIALS.reshape(3, 4), np.zeros((), bool)),
    _c("CastLike", 21, "float_to_float64", normal(3, 4), np.zeros((1,), np.float64)),
    # ---- LogSoftmax: 2-D coercion before opset 13, one axis from 13 on ---------------------------
    _c("LogSoftmax", 6, "2d_default_axis", normal(3, 7)),
    _c("LogSoftmax", 11, "3d_default_axis_flattens", normal(2, 3, 4)),
    _c("LogSoftmax", 11, "axis2", normal(2, 3, 4), attrs={"axis": 2}),
    _c("LogSoftmax", 13, "default_last", normal(2, 3, 5)),
    _c("LogSoftmax", 13, "middle_axis", normal(2, 3, 4), attrs={"axis": 1}),
    _c(
        "LogSoftmax",
        13,
        "axis0_large",
        normal(4, 6, scale=1e3),
        attrs={"axis": 0},
        rtol=1e-5,
        atol=1e-3,
    ),
    # ---- InstanceNormalization: a LayerNorm over (N*C, H*W) and the per-channel affine -----------
    _c(
        "InstanceNormalization",
        6,
        "nchw_consts",
        normal(2, 3, 4, 5, scale=2.0),
        inits=(normal(3), normal(3)),
        attrs={"epsilon": 1e-3},
        atol=1e-5,
    ),
    _c("InstanceNormalization", 22, "ncl_inputs", normal(2, 4, 7), normal(4), normal(4), atol=1e-5),
    _c(
        "InstanceNormalization",
        22,
        "3d_spatial",
        normal(1, 2, 3, 4, 5) + 3.0,
        inits=(normal(2), normal(2)),
        atol=1e-5,
    ),
)


def _elem(arr: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def node_model(case: NodeCase) -> Any:
    names = [n for n, _ in case.inputs] + [n for n, _ in case.inits]
    node = helper.make_node(case.op, names, ["y"], name=case.op.lower(), **dict(case.attrs))
    graph = helper.make_graph(
        [node],
        "m",
        [helper.make_tensor_value_info(n, _elem(a), a.shape) for n, a in case.inputs],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(a, n) for n, a in case.inits],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=10
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # types and shapes y
    onnx.checker.check_model(model)
    return model


def peer_output(case: NodeCase, model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    if case.peer == "ort":
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)[0]
    if case.peer == "ref":
        from onnx.reference import ReferenceEvaluator

        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])
    assert case.expect is not None
    return np.asarray(case.expect(*feeds.values()))


def assert_same(got: np.ndarray, want: np.ndarray, case: NodeCase, what: str) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(
            got, want, rtol=case.rtol, atol=case.atol, equal_nan=True, err_msg=what
        )


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.id)
def test_converter_and_kernel_match_the_peer(case: NodeCase, tmp_path: Path) -> None:
    """Import, then the interpreter in the graph's dtypes and the compiled defaults program, against
    onnxruntime (or the reference evaluator / the spec's numpy where onnxruntime has no kernel)."""
    model = node_model(case)
    path = tmp_path / f"{case.id}.onnx"
    onnx.save(model, str(path))
    feeds = dict(case.inputs)
    want = peer_output(case, model, feeds)
    graph = import_onnx(path)
    assert graph.values["y"].dtype == str(want.dtype)
    assert_same(run_graph(graph, feeds, dtype=None)["y"], want, case, "interpreter")
    program = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
    assert_same(program.run(feeds)["y"], want, case, "defaults program")


def test_every_converter_of_the_module_has_a_node_case() -> None:
    import fusiontune.ir._onnx_ops_logic as logic
    from fusiontune.ir._onnx_ops import CONVERTERS

    mine = {name for name, fn in CONVERTERS.items() if fn.__module__ == logic.__name__}
    mine |= {
        "And",
        "Or",
        "Xor",
        "Not",
        "GreaterOrEqual",
        "LessOrEqual",
        "IsNaN",
        "Abs",
        "Sign",
        "Cos",
        "Sin",
    }
    assert mine - {c.op for c in NODE_CASES} == set()


# ---- the lowerings -------------------------------------------------------------------------------
def _import_case(case_id: str, tmp_path: Path) -> Any:
    case = next(c for c in NODE_CASES if c.id == case_id)
    path = tmp_path / "m.onnx"
    onnx.save(node_model(case), str(path))
    return import_onnx(path)


def test_instance_norm_imports_as_layer_norm_and_channel_affine(tmp_path: Path) -> None:
    graph = _import_case("InstanceNormalization-6-nchw_consts", tmp_path)
    assert graph.op_counts() == {"Reshape": 2, "LayerNorm": 1, "Mul": 1, "Add": 1}
    ln = next(n for n in graph.nodes if n.op == "LayerNorm")
    assert graph.values[ln.inputs[0]].shape == (6, 20)
    assert ln.attrs["eps"] == pytest.approx(1e-3)
    scale = next(n for n in graph.nodes if n.op == "Mul")
    assert {graph.values[i].shape for i in scale.inputs} == {(2, 3, 4, 5), (3, 1, 1)}


def test_cast_like_is_a_cast_to_the_second_inputs_dtype(tmp_path: Path) -> None:
    graph = _import_case("CastLike-15-float_to_int64", tmp_path)
    assert [(n.op, n.attrs["to"]) for n in graph.nodes] == [("Cast", "int64")]


def test_log_softmax_on_a_middle_axis_transposes_around_it(tmp_path: Path) -> None:
    graph = _import_case("LogSoftmax-13-middle_axis", tmp_path)
    assert graph.op_counts() == {"Transpose": 2, "LogSoftmax": 1}
    graph = _import_case("LogSoftmax-11-3d_default_axis_flattens", tmp_path)
    assert graph.op_counts() == {"Reshape": 2, "LogSoftmax": 1}


# ---- references ----------------------------------------------------------------------------------
def _one_op(
    op: str, *shapes_dtypes: tuple[tuple[int, ...], str], dtype: str = "float32", **attrs: Any
) -> Any:
    g = GraphBuilder(f"one_{op}", dtype=dtype)
    ins = [g.input(f"x{i}", s, d) for i, (s, d) in enumerate(shapes_dtypes)]
    g.output(g.op(op, *ins, **attrs))
    return g.build()


def test_log_softmax_reference_is_stable_far_from_zero() -> None:
    from scipy.special import log_softmax

    x = np.array([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4, -1e4 + 30.0]], np.float32)
    graph = _one_op("LogSoftmax", ((2, 3), "float32"))
    want = log_softmax(x.astype(np.float64), axis=-1)
    for got in (
        run_graph(graph, {"x0": x}, dtype=None)[graph.outputs[0]],
        _kernel(graph, {"x0": x}),
    ):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_softplus_does_not_overflow() -> None:
    x = np.array([[100.0, 89.0, -100.0, 0.0, 1e-3]], np.float32)
    graph = _one_op("Softplus", ((1, 5), "float32"))
    want = np.log1p(np.exp(x.astype(np.float64)))
    for got in (
        run_graph(graph, {"x0": x}, dtype=None)[graph.outputs[0]],
        _kernel(graph, {"x0": x}),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-43)  # e^-100: a float32 subnormal


def test_mod_definitions_on_signs_and_zero_divisors() -> None:
    a = np.array([7, -7, 7, -7, 5, 0], np.int64)
    b = np.array([3, 3, -3, -3, 0, 0], np.int64)
    floor = _one_op("Mod", ((6,), "int64"), ((6,), "int64"))
    trunc = _one_op("Mod", ((6,), "int64"), ((6,), "int64"), fmod=1)
    for graph, want in ((floor, [1, 2, -2, -1, 0, 0]), (trunc, [1, -1, 1, -1, 0, 0])):
        for got in (
            run_graph(graph, {"x0": a, "x1": b})[graph.outputs[0]],
            _kernel(graph, {"x0": a, "x1": b}),
        ):
            np.testing.assert_array_equal(got, np.array(want, np.int64))


def test_sign_of_negative_zero_is_positive_zero() -> None:
    graph = _one_op("Sign", ((3,), "float32"))
    x = np.array([-0.0, 0.0, np.nan], np.float32)
    for got in (
        run_graph(graph, {"x0": x}, dtype=None)[graph.outputs[0]],
        _kernel(graph, {"x0": x}),
    ):
        assert not np.signbit(got[:2]).any() and np.isnan(got[2])


def test_logic_ops_refuse_nothing_and_read_numbers_as_truth() -> None:
    graph = _one_op("And", ((4,), "float32"), ((4,), "float32"))
    a = np.array([0.0, np.nan, 2.0, -0.0], np.float32)
    b = np.array([1.0, 1.0, 0.0, 1.0], np.float32)
    want = np.logical_and(a, b)
    np.testing.assert_array_equal(run_graph(graph, {"x0": a, "x1": b})[graph.outputs[0]], want)
    np.testing.assert_array_equal(_kernel(graph, {"x0": a, "x1": b}), want)


def test_is_nan_and_is_inf_take_floats_only() -> None:
    with pytest.raises(ValueError, match="float"):
        _one_op("IsNaN", ((3,), "int64"))


def test_prelu_slope_broadcasts_one_way_only() -> None:
    with pytest.raises(ValueError, match="does not broadcast"):
        _one_op("PRelu", ((3, 1), "float32"), ((1, 4), "float32"))


# ---- kernels: attribute variants on special values, bools through one kernel ---------------------
def _kernel(graph: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    prog = build_program(FusedGraph.singletons(graph))
    assert prog.kernel_count == 1
    return np.array(prog.run(inputs)[graph.outputs[0]], copy=True)


SPECIAL_VARIANTS = [
    ("IsInf", {"detect_negative": 0}),
    ("IsInf", {"detect_positive": 0}),
    ("IsInf", {"detect_positive": 0, "detect_negative": 0}),
    ("Mod", {"fmod": 1}),
    ("Elu", {"alpha": 0.5}),
    ("Selu", {"alpha": 2.0, "gamma": 0.5}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("op", "attrs"), SPECIAL_VARIANTS, ids=lambda v: str(v))
def test_kernel_keeps_special_values_with_attributes(
    op: str, attrs: dict[str, Any], dtype: str
) -> None:
    from fusiontune.ir import CATALOGUE

    n = len(SPECIALS)
    binary = CATALOGUE[op].arity == 2
    graph = _one_op(op, *[((n, n), dtype)] * (2 if binary else 1), dtype=dtype, **attrs)
    a, b = np.repeat(SPECIALS, n).reshape(n, n), np.tile(SPECIALS, n).reshape(n, n)
    inputs = {"x0": a.astype(dtype), "x1": b.astype(dtype)} if binary else {"x0": a.astype(dtype)}
    got = _kernel(graph, inputs)
    want = run_graph(graph, inputs, dtype=None)[graph.outputs[0]]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)


def _masked_fill_graph() -> Any:
    """``where(isnan(x) or x < lo, 0, x) + cast(not(x > 0), float)`` with bool intermediates and a
    bool output: the elementwise chain of a masked fill, as exporters write it."""
    g = GraphBuilder("masked_fill")
    x = g.input("x", (4, 33))
    lo = g.input("lo", (33,))
    bad = g.op("Or", g.op("IsNaN", x), g.less(x, lo))
    kept = g.where(bad, 0.0, x)
    nonpos = g.op("Not", g.greater(x, 0.0))
    g.output(g.add(kept, g.cast(nonpos, "float32")), bad)
    return g.build()


def test_bool_intermediates_and_outputs_fuse_into_one_kernel() -> None:
    graph = _masked_fill_graph()
    fused = run_pipeline(graph, FusionConfig.defaults()).fused
    program = build_program(fused)
    assert program.kernel_count == 1
    x = normal(4, 33)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    inputs = {"x": x, "lo": normal(33)}
    got = program.run(inputs)
    for dtype in (None, "float64"):
        want = run_graph(graph, inputs, dtype=dtype)
        for name in graph.outputs:
            assert str(np.asarray(got[name]).dtype) == graph.values[name].dtype
            np.testing.assert_allclose(
                np.asarray(got[name]), want[name], rtol=RTOL, atol=ATOL, equal_nan=True
            )


def test_float64_interpreter_converts_bool_and_int_casts_to_float() -> None:
    g = GraphBuilder("casts")
    mask = g.input("mask", (2, 3), "bool")
    ids = g.input("ids", (2, 3), "int64")
    y = g.neg(g.cast(mask, "float32")) * g.cast(ids, "float32")
    g.output(y)
    graph = g.build()
    inputs = {"mask": np.array([[True, False, True], [False, True, True]]), "ids": ints(2, 3)}
    got = run_graph(graph, inputs)[graph.outputs[0]]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, -inputs["mask"].astype(np.float64) * inputs["ids"])


def test_log_softmax_splits_between_statistics_and_the_subtraction() -> None:
    g = GraphBuilder("logsm")
    x = g.input("x", (8, 40))
    g.output(g.mul(g.op("LogSoftmax", g.add(x, 1.0)), 2.0))
    graph = g.build()
    config = FusionConfig.defaults().with_splits(**{"NormSplitFusionPass.stats": 1})
    x0 = normal(8, 40, scale=3.0)
    want = run_graph(graph, {"x": x0})[graph.outputs[0]]
    for cfg in (FusionConfig.defaults(), config):
        got = build_program(run_pipeline(graph, cfg).fused).run({"x": x0})[graph.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- real exporter output ----------------------------------------------------------------------------
def _logic_block() -> Any:
    """A torch module whose export holds every op of this module on live data."""
    torch = pytest.importorskip("torch")
    fn = torch.nn.functional

    class LogicBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.prelu = torch.nn.PReLU(4)
            self.norm = torch.nn.InstanceNorm2d(4, affine=True)
            with torch.no_grad():
                self.prelu.weight.uniform_(0.05, 0.5)
                self.norm.weight.uniform_(0.5, 1.5)
                self.norm.bias.uniform_(-0.5, 0.5)

        def forward(self, x: Any) -> Any:
            y = self.norm(self.prelu(x))
            mask = torch.isnan(x) | (x.abs() > 1.5) | torch.isinf(x)
            y = y.masked_fill(mask, 0.0)
            keep = torch.logical_xor(x >= 0, ~(x <= 0.5))
            y = torch.where(keep, y, fn.elu(x, 0.3) + fn.selu(x))
            y = y + torch.fmod(x, 0.7) + torch.sign(x) * torch.sin(x) - torch.cos(x)
            y = y + fn.softplus(x)
            return fn.log_softmax(y, dim=-1) + fn.log_softmax(y, dim=1)

    torch.manual_seed(0)
    return torch, LogicBlock().eval()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_export_of_logic_ops_matches_onnxruntime(dynamo: bool, tmp_path: Path) -> None:
    """Both torch.onnx exporters at opset 17: PRelu, InstanceNormalization, IsNaN / IsInf / Abs /
    comparisons / Or / Xor / Not into a Where, Elu, Selu, Mod (fmod), Sign, Sin, Cos, Softplus and
    LogSoftmax on two axes; NaN and infinities in the input."""
    torch, module = _logic_block()
    x = normal(2, 4, 5, 6)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    path = tmp_path / "logic.onnx"
    try:
        torch.onnx.export(
            module,
            (torch.from_numpy(x),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            opset_version=17,
            dynamo=dynamo,
        )
    except Exception as e:  # noqa: BLE001 - the dynamo exporter needs onnxscript
        pytest.skip(f"torch.onnx.export(dynamo={dynamo}) failed: {type(e).__name__}")
    exported = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"PRelu", "InstanceNormalization", "LogSoftmax", "Mod", "Xor", "IsNaN"} <= exported
    feeds = {"x": x}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = import_onnx(path)
    got = run_graph(graph, feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    program = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
    got = np.asarray(program.run(feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_int64_scalar_constant_is_inlined_exactly() -> None:
    g = GraphBuilder("int64_max")
    c, a = g.input("c", (4,), "bool"), g.input("a", (4,), "int64")
    g.output(g.where(c, a, g.const(np.array(np.iinfo(np.int64).max), dtype="int64")))
    graph = g.build()
    inputs = {"c": np.array([True, False, True, False]), "a": np.arange(4, dtype=np.int64)}
    want = run_graph(graph, inputs)[graph.outputs[0]]
    np.testing.assert_array_equal(_kernel(graph, inputs), want)
