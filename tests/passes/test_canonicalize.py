"""The canonicalize stage: every rule before/after, the fixed point, idempotence, the log, deny."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pytest

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.ops import CATALOGUE
from fusiontune.passes.base import PassContext
from fusiontune.passes.graph import canonicalize as canonicalize_module
from fusiontune.passes.graph._canonical_rules import RULES, E, Rule
from fusiontune.passes.pattern import COMMUTATIVE, P, V
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import BY_NAME, PASSES
from fusiontune.runtime import build_program

F64 = "float64"
PASS = "CanonicalizationPass"
ALL_OFF = {"GraphFusion": False, "UBFusion": False}


# ---- helpers ------------------------------------------------------------------------------------
def canonicalize(graph: Graph, deny: Mapping[str, frozenset[int]] | None = None) -> PipelineResult:
    """The pipeline with every switchable pass off: the canonicalize stage alone."""
    return run_pipeline(graph, FusionConfig.resolve(all_switch=ALL_OFF), deny=deny)


def build(
    fn: Callable[[GraphBuilder], Tensor | tuple[Tensor, ...]], dtype: str = F64, name: str = "g"
) -> Graph:
    g = GraphBuilder(name, dtype=dtype)
    out = fn(g)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.build()


def line(pattern: str, matched: int, effected: int, pass_name: str = PASS) -> str:
    return (
        f"GraphFusionPass[{pass_name}]: pattern={pattern}, "
        f"matched_times={matched}, effected_times={effected}"
    )


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def assert_same_outputs(before: Graph, after: Graph) -> None:
    inputs = random_inputs(before, seed=0)
    want = run_graph(before, inputs)
    got = run_graph(after, inputs)
    assert list(got) == list(want) == list(before.outputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def check(graph: Graph, pattern: str, after_ops: Sequence[str], times: int = 1) -> Graph:
    """Canonicalize; check the op sequence, the log line, the output names and the interpreter."""
    result = canonicalize(graph)
    after = result.fused.graph
    assert ops(after) == list(after_ops)
    assert line(pattern, times, times) in result.report.log_lines()
    assert after.outputs == graph.outputs
    assert_same_outputs(graph, after)
    return after


def check_unchanged(graph: Graph) -> None:
    result = canonicalize(graph)
    assert result.report.effected(PASS) == 0
    assert result.fused.graph.structural_hash() == graph.structural_hash()


def positive(g: GraphBuilder, name: str, shape: tuple[int, ...] = (2, 3)) -> Tensor:
    """exp(input): a node output that Sqrt, Rsqrt and division take without trouble."""
    return g.exp(g.input(name, shape))


# ---- the registry row ---------------------------------------------------------------------------
def test_canonicalization_runs_last_in_the_canonicalize_stage_and_cannot_be_switched_off() -> None:
    stage = [p.name for p in PASSES if p.stage == "canonicalize"]
    assert stage == ["ConstantFoldingPass", "IdentityEliminationPass", PASS]
    info = BY_NAME[PASS]
    assert not info.switchable and info.exact and info.aliases == ("canonicalization",)
    assert FusionConfig.all_off().enabled(PASS)
    assert info.load().patterns == tuple(dict.fromkeys(r.name for r in RULES))
    for rule in dict.fromkeys(r.name for r in RULES):
        assert f"``{rule}``" in info.doc, rule


# ---- division is the one form of "times a reciprocal" -------------------------------------------
@pytest.mark.parametrize("reciprocal_first", [False, True])
def test_mul_by_reciprocal_becomes_div(reciprocal_first: bool) -> None:
    def net(g: GraphBuilder) -> Tensor:
        x, r = g.relu(g.input("x", (2, 3))), g.reciprocal(positive(g, "y", (3,)))
        return g.mul(r, x) if reciprocal_first else g.mul(x, r)

    after = check(build(net), "MulReciprocalToDiv", ["Relu", "Exp", "Div"])
    div = after.nodes[-1]
    assert div.inputs == ("Relu_0", "Exp_0")
    assert sorted(div.origin) == ["Mul_0", "Reciprocal_0"]


def test_mul_by_reciprocal_becomes_div_for_every_reader() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        r = g.reciprocal(positive(g, "y"))
        return g.mul(g.input("a", (2, 3)), r), g.mul(r, g.input("b", (2, 3)))

    graph = build(net)
    after = check(graph, "MulReciprocalToDiv", ["Exp", "Div", "Div"], times=2)
    # The reciprocal's name goes to exactly one of the divisions (bisection names nodes once).
    origins = [o for n in after.nodes for o in n.origin]
    assert sorted(origins) == sorted(n.name for n in graph.nodes)


def test_mul_by_reciprocal_stays_when_the_reciprocal_has_other_readers() -> None:
    def other_reader(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        r = g.reciprocal(positive(g, "y"))
        return g.mul(g.input("a", (2, 3)), r), g.exp(r)

    def escapes(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        r = g.reciprocal(positive(g, "y"))
        return g.mul(g.input("a", (2, 3)), r), r

    def squared(g: GraphBuilder) -> Tensor:
        r = g.reciprocal(positive(g, "y"))
        return g.mul(r, r)

    for net in (other_reader, escapes, squared):
        check_unchanged(build(net))


def test_mul_by_rsqrt_becomes_div_by_one_shared_sqrt() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        r = g.rsqrt(positive(g, "v"))
        return g.mul(g.input("a", (2, 3)), r), g.mul(g.input("b", (2, 3)), r)

    graph = build(net)
    after = check(graph, "MulRsqrtToDiv", ["Exp", "Sqrt", "Div", "Div"], times=2)
    sqrt = after.nodes[1]
    assert sqrt.origin == ("Rsqrt_0",)
    assert [n.inputs for n in after.nodes[2:]] == [("a", sqrt.outputs[0]), ("b", sqrt.outputs[0])]
    assert [n.origin for n in after.nodes[2:]] == [("Mul_0",), ("Mul_1",)]
    assert build_program(canonicalize(graph).fused).kernel_count == 4


def test_mul_by_rsqrt_stays_when_the_rsqrt_is_an_output() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        r = g.rsqrt(positive(g, "v"))
        return g.mul(g.input("a", (2, 3)), r), r

    check_unchanged(build(net))


# ---- reciprocals and powers ---------------------------------------------------------------------
def test_div_one_becomes_reciprocal() -> None:
    check(
        build(lambda g: g.div(1.0, positive(g, "y"))), "DivOneToReciprocal", ["Exp", "Reciprocal"]
    )


def test_div_one_that_broadcasts_stays() -> None:
    check_unchanged(build(lambda g: g.div(g.const(np.ones((1, 1, 1))), positive(g, "y"))))
    check_unchanged(build(lambda g: g.div(1.0000001, positive(g, "y"))))


def test_reciprocal_of_sqrt_becomes_rsqrt() -> None:
    after = check(
        build(lambda g: g.reciprocal(g.sqrt(positive(g, "v")))),
        "ReciprocalSqrtToRsqrt",
        ["Exp", "Rsqrt"],
    )
    assert sorted(after.nodes[-1].origin) == ["Reciprocal_0", "Sqrt_0"]


def test_reciprocal_of_a_shared_sqrt_keeps_the_sqrt_for_its_other_readers() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        s = g.sqrt(positive(g, "v"))
        return g.reciprocal(s), g.neg(s)

    after = check(build(net), "ReciprocalSqrtToRsqrt", ["Exp", "Sqrt", "Rsqrt", "Neg"])
    assert after.node("Sqrt_0").origin == ("Sqrt_0",)
    assert next(n for n in after.nodes if n.op == "Rsqrt").origin == ("Reciprocal_0",)


@pytest.mark.parametrize(
    ("exponent", "pattern", "after_ops"),
    [
        (0.5, "PowHalfToSqrt", ["Exp", "Sqrt"]),
        (-0.5, "PowMinusHalfToRsqrt", ["Exp", "Rsqrt"]),
        (1.0, "PowOne", ["Exp"]),
        (-1.0, "PowMinusOneToReciprocal", ["Exp", "Reciprocal"]),
        (2.0, "PowTwoToMul", ["Exp", "Mul"]),
    ],
)
def test_pow_by_a_special_exponent_has_one_spelling(
    exponent: float, pattern: str, after_ops: list[str]
) -> None:
    after = check(build(lambda g: g.pow(positive(g, "x"), exponent)), pattern, after_ops)
    if exponent == 2.0:
        assert after.nodes[-1].inputs == ("Exp_0", "Exp_0")


def test_pow_by_another_exponent_stays() -> None:
    for exponent in (3.0, 2.0000001, 0.25):
        check_unchanged(build(lambda g, e=exponent: g.pow(positive(g, "x"), e)))


def test_integer_powers_square_but_take_no_roots() -> None:
    def k(g: GraphBuilder) -> Tensor:
        return g.neg(g.input("k", (4,), dtype="int64"))

    check_unchanged(build(lambda g: g.pow(k(g), 0.5)))  # a float result: no integer Sqrt
    two = np.array(2, dtype=np.int64)
    check(build(lambda g: g.pow(k(g), g.const(two))), "PowTwoToMul", ["Neg", "Mul"])


# ---- negation -----------------------------------------------------------------------------------
def test_double_negation_disappears() -> None:
    check(build(lambda g: g.neg(g.neg(positive(g, "x")))), "NegNeg", ["Exp"])
    check(build(lambda g: g.neg(g.neg(g.neg(g.neg(positive(g, "x")))))), "NegNeg", ["Exp"], times=2)
    # The output would become the graph input: the negations stay.
    check_unchanged(build(lambda g: g.neg(g.neg(g.input("x", (2, 3))))))


def test_zero_minus_x_becomes_neg() -> None:
    check(build(lambda g: g.sub(0.0, positive(g, "x"))), "ZeroSubToNeg", ["Exp", "Neg"])
    check_unchanged(build(lambda g: g.sub(g.const(np.zeros((4, 2, 3))), positive(g, "x"))))


# ---- layout and casts ---------------------------------------------------------------------------
def test_reshape_of_reshape_is_one_reshape() -> None:
    net = lambda g: g.reshape(g.reshape(positive(g, "x", (2, 6)), (3, 4)), (4, -1))  # noqa: E731
    after = check(build(net), "ReshapeReshape", ["Exp", "Reshape"])
    assert after.nodes[-1].attr("shape") == (4, 3) and after.nodes[-1].inputs == ("Exp_0",)


def test_reshape_round_trip_disappears() -> None:
    graph = build(lambda g: g.reshape(g.reshape(positive(g, "x", (2, 6)), (12,)), (2, 6)))
    result = canonicalize(graph)
    assert ops(result.fused.graph) == ["Exp"]
    log = result.report.log_lines()
    assert line("ReshapeReshape", 1, 1) in log
    assert line("NoOpReshape", 1, 1, "IdentityEliminationPass") in log


def test_reshape_of_a_shared_reshape_keeps_the_inner_one() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        inner = g.reshape(positive(g, "x", (2, 6)), (3, 4))
        return g.reshape(inner, (4, 3)), g.neg(inner)

    check(build(net), "ReshapeReshape", ["Exp", "Reshape", "Reshape", "Neg"])


def test_transpose_of_transpose_is_one_transpose() -> None:
    def net(g: GraphBuilder) -> Tensor:
        return g.transpose(g.transpose(positive(g, "x", (2, 3, 4)), (1, 2, 0)), (1, 2, 0))

    after = check(build(net), "TransposeTranspose", ["Exp", "Transpose"])
    assert after.nodes[-1].attr("perm") == (2, 0, 1)


def test_transpose_round_trip_disappears() -> None:
    graph = build(
        lambda g: g.transpose(g.transpose(positive(g, "x", (2, 3, 4)), (1, 0, 2)), (1, 0, 2))
    )
    result = canonicalize(graph)
    assert ops(result.fused.graph) == ["Exp"]
    assert line("NoOpTranspose", 1, 1, "IdentityEliminationPass") in result.report.log_lines()
    # A transpose without perm reverses the axes: twice is the identity too.
    graph = build(lambda g: g.op("Transpose", g.op("Transpose", positive(g, "x", (2, 3, 4)))))
    assert ops(canonicalize(graph).fused.graph) == ["Exp"]


def test_exact_cast_round_trips_disappear() -> None:
    widen = lambda g: g.cast(g.cast(positive(g, "x"), "float64"), "float32")  # noqa: E731
    check(build(widen, dtype="float32"), "CastRoundTrip", ["Exp"])

    def ints(g: GraphBuilder) -> Tensor:
        return g.cast(g.cast(g.neg(g.input("k", (4,), dtype="int32")), "int64"), "int32")

    check(build(ints), "CastRoundTrip", ["Neg"])

    def bools(g: GraphBuilder) -> Tensor:
        mask = g.cast(g.cast(g.input("m", (2, 3), dtype="bool"), "float32"), "bool")
        return g.where(mask, g.input("x", (2, 3)), 0.0)

    check(build(bools), "CastRoundTrip", ["Where"])


def test_lossy_cast_round_trips_stay() -> None:
    narrow = lambda g: g.cast(g.cast(positive(g, "x"), "float32"), "float64")  # noqa: E731
    check_unchanged(build(narrow))
    to_int = lambda g: g.cast(g.cast(positive(g, "x"), "int64"), "float64")  # noqa: E731
    check_unchanged(build(to_int))


def test_cast_round_trip_keeps_the_inner_cast_for_its_other_readers() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        wide = g.cast(positive(g, "x"), "float64")
        return g.cast(wide, "float32"), g.neg(wide)

    after = check(build(net, dtype="float32"), "CastRoundTrip", ["Exp", "Cast", "Neg"])
    assert after.outputs[0] == "Cast_1" and after.nodes[0].outputs == ("Cast_1",)


# ---- operand order of commutative ops -----------------------------------------------------------
def _operands(op: str) -> tuple[str, Callable[[GraphBuilder, str], Tensor]]:
    """The dtype an op's operands have, and a non-constant operand of that dtype."""
    if op in ("And", "Or", "Xor"):
        return "bool", lambda g, name: g.input(name, (2, 3), dtype="bool")
    return F64, lambda g, name: g.input(name, (2, 3))


@pytest.mark.parametrize("op", sorted(COMMUTATIVE & set(CATALOGUE)))
def test_commutative_operands_come_in_one_order(op: str) -> None:
    dtype, operand = _operands(op)
    constant = np.ones(3, dtype=dtype)
    after = check(
        build(lambda g: g.op(op, g.const(constant), operand(g, "x"))), "CommuteOperands", [op]
    )
    assert after.nodes[0].inputs[0] == "x" and after.nodes[0].name == f"{op}_0"

    def nested(g: GraphBuilder) -> Tensor:
        a, b, c = operand(g, "a"), operand(g, "b"), operand(g, "c")
        return g.op(op, g.op(op, c, a), b)

    after = check(build(nested), "CommuteOperands", [op, op], times=2)
    assert [n.inputs for n in after.nodes] == [("a", "c"), ("b", f"{op}_0")]
    check_unchanged(build(lambda g: g.op(op, operand(g, "a"), operand(g, "b"))))


def test_of_two_node_outputs_the_earlier_comes_first() -> None:
    def net(g: GraphBuilder) -> Tensor:
        first, second = positive(g, "x"), g.relu(g.input("y", (2, 3)))
        return g.add(second, first)

    after = check(build(net), "CommuteOperands", ["Exp", "Relu", "Add"])
    assert after.nodes[-1].inputs == ("Exp_0", "Relu_0")
    check_unchanged(build(lambda g: g.maximum(positive(g, "x"), g.relu(g.input("y", (2, 3))))))


def test_graph_inputs_come_in_input_order_and_before_node_outputs() -> None:
    def net(g: GraphBuilder) -> Tensor:
        a, b = g.input("a", (2, 3)), g.input("b", (2, 3))
        return g.mul(g.exp(a), g.minimum(b, a))

    after = check(build(net), "CommuteOperands", ["Exp", "Minimum", "Mul"], times=1)
    assert [n.inputs for n in after.nodes[1:]] == [("a", "b"), ("Exp_0", "Minimum_0")]


# ---- the fixed point ----------------------------------------------------------------------------
def _chain(g: GraphBuilder) -> Tensor:
    """``x * Div(1, Pow(Pow(v, 1), 0.5))``: x / Sqrt(v) after three rules and a second round."""
    return g.mul(g.input("x", (2, 3)), g.div(1.0, g.pow(g.pow(positive(g, "v"), 1.0), 0.5)))


def test_a_chain_reaches_the_fixed_point_over_several_rounds() -> None:
    graph = build(_chain)
    # One sweep of the rules alone leaves x * Reciprocal(Sqrt(v)).
    ctx = PassContext(config=FusionConfig.all_off())
    ctx.begin(BY_NAME[PASS])
    once = canonicalize_module.canonicalization(graph, ctx)
    assert ops(once) == ["Exp", "Sqrt", "Reciprocal", "Mul"]

    result = canonicalize(graph)
    after = result.fused.graph
    assert ops(after) == ["Exp", "Sqrt", "Div"]
    assert after.nodes[-1].inputs == ("x", after.nodes[1].outputs[0])
    assert_same_outputs(graph, after)
    assert build_program(result.fused).kernel_count == 3
    log = result.report.log_lines()
    for pattern in ("PowOne", "PowHalfToSqrt", "DivOneToReciprocal", "MulReciprocalToDiv"):
        assert line(pattern, 1, 1) in log
    # Every pass and pattern once, with the totals over the rounds.
    keys = [(s.pass_name, s.pattern) for s in result.report.stats]
    assert len(keys) == len(set(keys))
    assert sum(s.pass_name == PASS for s in result.report.stats) == len({r.name for r in RULES})
    apps = [(a.index, a.pattern) for a in result.report.applications if a.pass_name == PASS]
    assert apps == [
        (0, "PowOne"),
        (1, "PowHalfToSqrt"),
        (2, "DivOneToReciprocal"),
        (3, "MulReciprocalToDiv"),
    ]


def test_canonicalizing_a_canonical_graph_changes_nothing() -> None:
    for net in (_chain, lambda g: g.rms_norm_decomposed(g.input("x", (3, 6)), g.input("w", (6,)))):
        once = canonicalize(build(net)).fused.graph
        again = canonicalize(once)
        assert again.report.effected(PASS) == 0
        assert sum(s.effected_times for s in again.report.stats) == 0
        assert again.fused.graph.structural_hash() == once.structural_hash()


def test_a_rule_set_without_a_fixed_point_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    def swap(m: object) -> object:
        node = m.nodes[0]  # type: ignore[attr-defined]
        return E("Add", node.inputs[1], node.inputs[0])

    flip = Rule("AntiCommute", P("Add", V("a"), V("b")), swap)
    monkeypatch.setattr(canonicalize_module, "RULES", (flip, *RULES))
    graph = build(lambda g: g.add(g.input("x", (2, 3)), g.input("y", (2, 3))))
    with pytest.raises(RuntimeError, match="no fixed point in 16 rounds"):
        canonicalize(graph)


def test_a_denied_application_stays_denied_in_later_rounds() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, Tensor]:
        return g.pow(positive(g, "x"), 2.0), g.mul(
            g.input("z", (2, 3)), g.div(1.0, positive(g, "y"))
        )

    graph = build(net)
    result = canonicalize(graph, deny={PASS: frozenset({0})})
    after = result.fused.graph
    assert ops(after) == ["Exp", "Pow", "Exp", "Div"]
    apps = [
        (a.index, a.pattern, a.applied) for a in result.report.applications if a.pass_name == PASS
    ]
    assert apps == [
        (0, "PowTwoToMul", False),
        (1, "DivOneToReciprocal", True),
        (2, "MulReciprocalToDiv", True),
    ]
    assert line("PowTwoToMul", 1, 0) in result.report.log_lines()
    assert_same_outputs(graph, after)


def test_graph_outputs_keep_their_names() -> None:
    def net(g: GraphBuilder) -> tuple[Tensor, ...]:
        x = positive(g, "x")
        return (
            g.pow(x, 1.0),
            g.neg(g.neg(g.relu(x))),
            g.mul(g.input("a", (2, 3)), g.rsqrt(g.tanh(x))),
            g.add(1.0, g.sigmoid(x)),
        )

    graph = build(net)
    after = canonicalize(graph).fused.graph
    assert after.outputs == graph.outputs
    assert ops(after) == ["Exp", "Relu", "Tanh", "Sqrt", "Div", "Sigmoid", "Add"]
    assert_same_outputs(graph, after)


# ---- what it is for: every spelling of an RMSNorm becomes one RMSNorm node ----------------------
RMS_ROOTS: dict[str, Callable[[GraphBuilder, Tensor, Tensor], Tensor]] = {
    "div_sqrt": lambda g, x, s: g.div(x, g.sqrt(s)),
    "mul_rsqrt": lambda g, x, s: g.mul(x, g.rsqrt(s)),
    "rsqrt_mul": lambda g, x, s: g.mul(g.rsqrt(s), x),
    "mul_reciprocal_sqrt": lambda g, x, s: g.mul(x, g.reciprocal(g.sqrt(s))),
    "mul_div_one_sqrt": lambda g, x, s: g.mul(g.div(1.0, g.sqrt(s)), x),
    "mul_pow_minus_half": lambda g, x, s: g.mul(x, g.pow(s, -0.5)),
    "div_pow_half": lambda g, x, s: g.div(x, g.pow(s, 0.5)),
}


@pytest.mark.parametrize("square", ["mul", "pow"])
@pytest.mark.parametrize("root", sorted(RMS_ROOTS))
def test_every_exported_rms_norm_spelling_fuses_into_one_rms_norm(square: str, root: str) -> None:
    def net(g: GraphBuilder) -> Tensor:
        x = g.relu(g.input("x", (2, 3, 6)))
        sq = g.mul(x, x) if square == "mul" else g.pow(x, 2.0)
        s = g.add(1e-6, g.reduce_mean(sq))
        return g.mul(g.input("gamma", (6,)), RMS_ROOTS[root](g, x, s))

    graph = build(net)
    config = FusionConfig.resolve(all_switch=ALL_OFF, explicit={"RmsNormFusionPass": True})
    after = run_pipeline(graph, config).fused.graph
    assert ops(after) == ["Relu", "RMSNorm"]
    assert after.nodes[-1].inputs == ("Relu_0", "gamma")
    assert_same_outputs(graph, after)
