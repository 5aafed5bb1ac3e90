"""The built-in workloads: they build, validate, run, and the seeds print what MindSpore prints."""

from __future__ import annotations

import numpy as np
import pytest

from fusiontune.errors import UserError
from fusiontune.ir.interpreter import run_graph
from fusiontune.workloads import WORKLOADS, Workload, list_workloads, make_workload


def _only_output(outputs: dict[str, np.ndarray]) -> np.ndarray:
    (arr,) = outputs.values()
    return arr


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_builds_validates_and_runs(name: str) -> None:
    w = make_workload(name)
    assert isinstance(w, Workload)
    w.graph.validate()
    assert set(w.inputs) == set(w.graph.inputs)
    assert dict(w.params) == dict(WORKLOADS[name].sizes)
    ours = run_graph(w.graph, w.inputs, dtype=None)
    for out in w.graph.outputs:
        assert w.reference[out].dtype == np.float64
        assert ours[out].dtype == np.float32
        assert np.isfinite(w.reference[out]).all()
        np.testing.assert_allclose(ours[out], w.reference[out], rtol=1e-3, atol=1e-4)


def test_list_workloads_is_the_table() -> None:
    assert [s.name for s in list_workloads()] == list(WORKLOADS)
    assert {"mindspore_basic", "mindspore_composite", "mindspore_custom_op"} <= set(WORKLOADS)
    assert {"transformer_block", "llama_block", "mlp"} <= set(WORKLOADS)


def test_mindspore_basic_prints_two_everywhere() -> None:
    w = make_workload("mindspore_basic")
    out = _only_output(run_graph(w.graph, w.inputs, dtype=None))
    np.testing.assert_array_equal(out, np.full((4, 4), 2.0, dtype=np.float32))
    assert [n.op for n in w.graph.nodes] == ["Mul", "Add"]


def test_mindspore_composite_has_mul_add_pow() -> None:
    w = make_workload("mindspore_composite")
    assert [n.op for n in w.graph.nodes] == ["Mul", "Add", "Pow"]
    x = w.inputs["x"]
    np.testing.assert_allclose(
        _only_output(w.reference), (x.astype(np.float64) * 2 + 1) ** 3, rtol=1e-12
    )
    assert np.array_equal(make_workload("mindspore_composite").inputs["x"], x)  # fixed seed


def test_mindspore_custom_op_prints_seed_value() -> None:
    w = make_workload("mindspore_custom_op")
    out = _only_output(run_graph(w.graph, w.inputs, dtype=None))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.round(out, 6), np.full((4, 4), -0.015104, dtype=np.float32))


def test_mindspore_custom_op_nodes_show_the_myop_scope() -> None:
    w = make_workload("mindspore_custom_op")
    assert len(w.graph.nodes) == 4
    assert [n.op for n in w.graph.nodes] == ["Mul", "Pow", "Sub", "Mul"]
    assert [n.name for n in w.graph.nodes if n.name.startswith("MyOp/")] == [
        "MyOp/Sub_0",
        "MyOp/Mul_0",
    ]


def test_decomposed_blocks_hold_no_fused_ops() -> None:
    fused_ops = {
        "Softmax",
        "LayerNorm",
        "RMSNorm",
        "Gelu",
        "Silu",
        "SwiGlu",
        "BiasAdd",
        "AddLayerNorm",
    }
    for name in ("transformer_block", "llama_block", "mlp"):
        assert not fused_ops & set(make_workload(name).graph.op_counts()), name


def test_transformer_block_shapes_follow_sizes() -> None:
    w = make_workload("transformer_block", batch=1, seq=8, hidden=16, heads=2, ffn=32)
    assert w.graph.values[w.graph.outputs[0]].shape == (1, 8, 16)
    assert w.graph.op_counts()["MatMul"] == 8
    assert w.graph.op_counts()["Erf"] == 1


def test_llama_block_is_causal() -> None:
    w = make_workload("llama_block", batch=1, seq=6, hidden=8, heads=2, ffn=16)
    x = np.array(w.inputs["x"], dtype=np.float64)
    changed = x.copy()
    changed[:, -1] += 1.0  # only the last position changes: earlier positions must not see it
    a = _only_output(run_graph(w.graph, {"x": x}))
    b = _only_output(run_graph(w.graph, {"x": changed}))
    np.testing.assert_array_equal(a[:, :-1], b[:, :-1])
    assert not np.allclose(a[:, -1], b[:, -1])


def test_weights_are_deterministic() -> None:
    a, b = make_workload("mlp", batch=4, hidden=8), make_workload("mlp", batch=4, hidden=8)
    assert a.graph.structural_hash() == b.graph.structural_hash()


def test_unknown_workload_names_closest() -> None:
    with pytest.raises(UserError, match="transformer_block"):
        make_workload("transfomer_block")


def test_unknown_size_lists_valid_keys() -> None:
    with pytest.raises(UserError, match="batch, seq, hidden, heads, ffn"):
        make_workload("transformer_block", hiden=64)


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_size_value_is_a_user_error(value: object) -> None:
    with pytest.raises(UserError, match="positive integer"):
        make_workload("mlp", batch=value)  # type: ignore[arg-type]


def test_heads_must_divide_hidden() -> None:
    with pytest.raises(UserError, match="multiple of heads"):
        make_workload("llama_block", hidden=30, heads=4)
