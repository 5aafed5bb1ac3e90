"""Properties of the canonicalize stage over random graphs written in exporters' spellings.

The strategy :func:`spelled_graphs` writes random float32 graphs with the non-canonical
spellings real exporters emit: ``Div(1, y)``, ``Reciprocal(Sqrt(v))``, ``x * Reciprocal(y)`` and
``x * Rsqrt(v)`` in either operand order (sometimes with another reader of the reciprocal),
``Pow`` by 0.5 / -0.5 / 1 / -1 / 2 (and 3, which stays), nested ``Neg``, ``Sub(0, x)``,
``Reshape`` and ``Transpose`` pairs, ``Cast`` round trips, commutative ops with the constant or
the later operand first, and decomposed RMSNorms in every root spelling. Side outputs expose
intermediates, so graph output names and values read outside a rewritten region are exercised.

Every op with a restricted domain reads ``t * t + 1`` (at least 1), so the graphs are well
conditioned in float32.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st

from fusiontune.config import FusionConfig
from fusiontune.ir import Graph, GraphBuilder, Tensor, random_inputs, run_graph
from fusiontune.passes.graph._canonical_rules import EXACT_WIDENING, operand_rank
from fusiontune.passes.graph._match import View
from fusiontune.passes.pattern import COMMUTATIVE
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import build_program

RTOL, ATOL = 1e-4, 1e-5  # float32 tolerance; ATOL is relative to the output's scale
SLACK = 10  # the program may be this many times less accurate than the float32 interpreter
SHAPES = ((3, 4), (5, 8), (2, 3, 4))
EXPONENTS = (0.5, -0.5, 1.0, -1.0, 2.0, 3.0)
CANONICAL_ONLY = FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False})


class _Writer:
    """Builder state while a graph is drawn: the current tensor, earlier ones, side outputs."""

    def __init__(self, draw: st.DrawFn, shape: tuple[int, ...]) -> None:
        self.draw = draw
        self.g = GraphBuilder("spelled")
        self.n_inputs = 0
        self.cur = self.input(shape)
        self.pool: list[Tensor] = [self.cur]
        self.side_outputs: list[Tensor] = []

    def input(self, shape: tuple[int, ...]) -> Tensor:
        self.n_inputs += 1
        return self.g.input(f"x{self.n_inputs}", shape)

    def const(self, shape: tuple[int, ...]) -> Tensor:
        rng = np.random.default_rng(len(self.g.constants))
        return self.g.const(rng.uniform(0.5, 1.5, shape).astype(np.float32))

    def flip(self) -> bool:
        return self.draw(st.booleans())

    def positive(self, t: Tensor) -> Tensor:
        """``t * t + 1`` (the 1 first or last)."""
        sq = self.g.mul(t, t)
        return self.g.add(1.0, sq) if self.flip() else self.g.add(sq, 1.0)

    def partner(self, like: Tensor) -> Tensor:
        same = [t for t in self.pool if t.shape == like.shape and t.name != like.name]
        if same and self.flip():
            return self.draw(st.sampled_from(same))
        return self.input(like.shape)

    def set(self, t: Tensor, side: Tensor | None = None) -> None:
        self.cur = t
        self.pool.append(t)
        if side is not None:
            self.side_outputs.append(side)

    # ---- steps: each writes one spelling ---------------------------------------------------
    def div_one(self) -> None:
        self.set(self.g.div(1.0, self.positive(self.cur)))

    def reciprocal_sqrt(self) -> None:
        self.set(self.g.reciprocal(self.g.sqrt(self.positive(self.cur))))

    def times_reciprocal(self) -> None:
        g, t = self.g, self.cur
        op = self.draw(st.sampled_from(["Reciprocal", "Rsqrt", "DivOneSqrt", "PowMinusHalf"]))
        den = self.positive(self.partner(t))
        r = {
            "Reciprocal": lambda: g.reciprocal(den),
            "Rsqrt": lambda: g.rsqrt(den),
            "DivOneSqrt": lambda: g.div(1.0, g.sqrt(den)),
            "PowMinusHalf": lambda: g.pow(den, -0.5),
        }[op]()
        out = g.mul(r, t) if self.flip() else g.mul(t, r)
        other = self.draw(st.sampled_from(["none", "mul", "tanh", "output"]))
        side = {
            "none": None,
            "mul": lambda: g.mul(r, self.partner(t)),  # a second Mul reader
            "tanh": lambda: g.tanh(r),  # a reader that is no Mul: the reciprocal stays
            "output": lambda: r,  # the reciprocal itself escapes
        }[other]
        self.set(out, side() if side is not None else None)

    def power(self) -> None:
        k = self.draw(st.sampled_from(EXPONENTS))
        base = self.positive(self.cur) if k != int(k) or k < 0 else self.g.tanh(self.cur)
        self.set(self.g.pow(base, k))

    def negation(self) -> None:
        g, t = self.g, self.cur
        if self.flip():
            self.set(g.sub(0.0, t))
            return
        for _ in range(self.draw(st.integers(2, 4))):
            t = g.neg(t)
        self.set(t)

    def reshapes(self) -> None:
        g, t = self.g, self.cur
        shape = t.shape
        mid = self.draw(st.sampled_from([(-1,), (shape[0], -1), tuple(reversed(shape))]))
        end = self.draw(st.sampled_from([shape, tuple(reversed(shape))]))
        y = g.reshape(g.reshape(t, mid), end)
        self.set(y if y.shape == shape else g.reshape(y, shape))

    def transposes(self) -> None:
        g, t = self.g, self.cur
        rank = len(t.shape)
        p = self.draw(st.permutations(range(rank)))
        q = self.draw(st.permutations(range(rank)))
        y = g.transpose(g.transpose(t, p), q)
        self.set(y if y.shape == t.shape else g.reshape(y, t.shape))

    def cast(self) -> None:
        wide = self.g.cast(self.cur, "float64")
        self.set(self.g.cast(wide, "float32"), self.g.exp(wide) if self.flip() else None)

    def commuted(self) -> None:
        g, t = self.g, self.cur
        op = self.draw(st.sampled_from(["Add", "Mul", "Maximum", "Minimum"]))
        kind = self.draw(st.sampled_from(["const", "scalar", "partner"]))
        if kind == "const":
            other: Tensor | float = self.const((t.shape[-1],))
        elif kind == "scalar":
            other = self.draw(st.sampled_from([0.5, 2.0, -1.5]))
        else:
            other = self.partner(t)
        self.set(g.op(op, other, t) if self.flip() else g.op(op, t, other))

    def rms_norm(self) -> None:
        g, t = self.g, self.cur
        x = g.tanh(t)
        sq = g.mul(x, x) if self.flip() else g.pow(x, 2.0)
        ms = g.reduce_mean(sq)
        s = g.add(1e-6, ms) if self.flip() else g.add(ms, 1e-6)
        root = self.draw(
            st.sampled_from(["div_sqrt", "rsqrt", "reciprocal_sqrt", "div_one_sqrt", "pow"])
        )
        norm = {
            "div_sqrt": lambda: g.div(x, g.sqrt(s)),
            "rsqrt": lambda: g.mul(g.rsqrt(s), x),
            "reciprocal_sqrt": lambda: g.mul(x, g.reciprocal(g.sqrt(s))),
            "div_one_sqrt": lambda: g.mul(g.div(1.0, g.sqrt(s)), x),
            "pow": lambda: g.mul(x, g.pow(s, -0.5)),
        }[root]()
        gamma = self.const((t.shape[-1],))
        self.set(g.mul(gamma, norm) if self.flip() else g.mul(norm, gamma))


STEPS = (
    "div_one",
    "reciprocal_sqrt",
    "times_reciprocal",
    "times_reciprocal",
    "power",
    "power",
    "negation",
    "reshapes",
    "transposes",
    "cast",
    "commuted",
    "commuted",
    "rms_norm",
)


@st.composite
def spelled_graphs(draw: st.DrawFn, max_steps: int = 6) -> Graph:
    w = _Writer(draw, draw(st.sampled_from(SHAPES)))
    steps = draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=max_steps))
    for step in steps:
        getattr(w, step)()
    outputs = [w.cur, *w.side_outputs]
    earlier = [t for t in w.pool[1:-1] if t.name not in w.g.inputs]
    if earlier and draw(st.booleans()):
        outputs.append(draw(st.sampled_from(earlier)))  # an intermediate that is also read later
    w.g.output(*dict.fromkeys(outputs))
    graph = w.g.build()
    note(f"steps={steps}\nops={[n.op for n in graph.nodes]}")
    return graph


# ---- helpers ------------------------------------------------------------------------------------
def assert_program_matches_float64(graph: Graph, config: FusionConfig, seed: int) -> None:
    """The compiled program of ``graph`` under ``config`` against the float64 interpreter."""
    inputs = random_inputs(graph, seed=seed)
    program = build_program(run_pipeline(graph, config).fused)
    got = {k: np.array(v, copy=True) for k, v in program.run(inputs).items()}
    ideal = run_graph(graph, inputs, dtype="float64")
    own = run_graph(graph, inputs, dtype=None)
    assert list(got) == list(graph.outputs)
    for name in graph.outputs:
        ref = ideal[name]
        budget = SLACK * float(np.max(np.abs(own[name] - ref), initial=0.0))
        atol = ATOL * max(1.0, float(np.max(np.abs(ref), initial=0.0))) + budget
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=atol, err_msg=name)


def _forward_blocked(graph: Graph, out: str, target: str) -> bool:
    """A forward of graph output ``out`` to ``target`` cannot keep the output's name."""
    return out in graph.outputs and (
        target in graph.inputs or target in graph.outputs or graph.is_constant(target)
    )


def non_canonical(graph: Graph) -> list[str]:
    """The nodes of ``graph`` still written in a spelling the canonical form has no place for."""
    view = View(graph)
    found: list[str] = []
    for n in graph.nodes:
        ins = n.inputs
        producers = [view.producer(i) for i in ins]
        out = n.outputs[0]
        scalar = graph.scalar_constant
        if n.op == "Pow" and scalar(ins[1]) in (0.5, -0.5, -1.0, 2.0):
            found.append(f"{n.name}: Pow by {scalar(ins[1])}")
        if n.op == "Pow" and scalar(ins[1]) == 1.0 and not _forward_blocked(graph, out, ins[0]):
            found.append(f"{n.name}: Pow by 1")
        if n.op == "Div" and scalar(ins[0]) == 1.0:
            found.append(f"{n.name}: Div(1, .)")
        if n.op == "Sub" and scalar(ins[0]) == 0.0:
            found.append(f"{n.name}: Sub(0, .)")
        if n.op == "Cast" and producers[0] is not None and producers[0].op == "Cast":
            x = producers[0].inputs[0]
            wide = view.dtype(ins[0])
            if (
                view.dtype(out) == view.dtype(x)
                and wide in EXACT_WIDENING.get(view.dtype(x), ())
                and not _forward_blocked(graph, out, x)
            ):
                found.append(f"{n.name}: Cast round trip")
        if n.op in ("Reciprocal", "Neg", "Reshape", "Transpose") and producers[0] is not None:
            inner = producers[0]
            if (n.op, inner.op) == ("Reciprocal", "Sqrt"):
                found.append(f"{n.name}: Reciprocal(Sqrt)")
            if n.op == inner.op and n.op != "Reciprocal":
                if n.op != "Neg" or not _forward_blocked(graph, out, inner.inputs[0]):
                    found.append(f"{n.name}: {n.op}({n.op})")
        if n.op == "Mul":
            for i, p in zip(ins, producers, strict=True):
                readers = view.readers(i)
                if (
                    p is not None
                    and p.op in ("Reciprocal", "Rsqrt")
                    and not view.is_output(i)
                    and all(r.op == "Mul" and r.inputs.count(i) == 1 for r in readers)
                ):
                    found.append(f"{n.name}: Mul by {p.op}")
        if n.op in COMMUTATIVE and len(ins) == 2 and ins[0] != ins[1]:
            if operand_rank(view, ins[1]) < operand_rank(view, ins[0]):
                found.append(f"{n.name}: operands {ins}")
    return found


# ---- properties ---------------------------------------------------------------------------------
@given(graph=spelled_graphs())
def test_canonical_graph_has_one_spelling(graph: Graph) -> None:
    after = run_pipeline(graph, CANONICAL_ONLY).fused.graph
    assert non_canonical(after) == []
    assert after.outputs == graph.outputs


@given(graph=spelled_graphs())
def test_canonicalization_is_idempotent(graph: Graph) -> None:
    once = run_pipeline(graph, CANONICAL_ONLY).fused.graph
    again = run_pipeline(once, CANONICAL_ONLY)
    assert sum(s.effected_times for s in again.report.stats) == 0
    assert again.fused.graph.structural_hash() == once.structural_hash()


@given(graph=spelled_graphs(), seed=st.integers(0, 3))
def test_canonical_program_matches_float64_interpreter(graph: Graph, seed: int) -> None:
    assert_program_matches_float64(graph, CANONICAL_ONLY, seed)


@given(graph=spelled_graphs(), seed=st.integers(0, 3))
def test_default_pipeline_on_spelled_graphs_matches_float64_interpreter(
    graph: Graph, seed: int
) -> None:
    assert_program_matches_float64(graph, FusionConfig.defaults(), seed)
