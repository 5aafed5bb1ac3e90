"""Training steps: a forward graph, a loss, its backward and an optimizer update, as one graph.

``training_step(forward, spec)`` reads one float output of ``forward``, adds the loss, the
gradients of the loss with respect to the parameters (:func:`fusiontune.ir.autodiff.grad_graph`)
and the optimizer's update, and returns a graph with these inputs and outputs:

==============================  =====================================================================
inputs                          the forward's inputs (data and parameters, in its order), then the
                                loss's ``target`` (MSE, the output's shape and dtype) or ``labels``
                                (cross-entropy, int64 class indices over the output's last axis),
                                then the optimizer's state per parameter: ``momentum_buffer/<p>``
                                (SGD with momentum) or ``exp_avg/<p>`` and ``exp_avg_sq/<p>`` (Adam)
outputs                         ``loss``, then ``grad/<p>`` per parameter, then the updated
                                parameter ``updated/<p>`` and state ``updated/<state>/<p>``
==============================  =====================================================================

The state names are torch's (``torch.optim.SGD`` / ``Adam`` ``state`` keys), and the update is
torch's: SGD ``buf = momentum * buf + g; p -= lr * buf`` (no dampening, no Nesterov, no weight
decay), Adam ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m /
(sqrt(v) / sqrt(1 - b2^t) + eps)`` at step ``t``.

An output named ``updated/<name>`` where ``<name>`` is a graph input is that input's new value:
the runtime may write it over the input's buffer (an update in place, as an optimizer does). That
name rule is the whole contract between the step and the runtime.

Parameters are graph inputs, not constants, in a training step: constant folding must not fold a
weight that the step changes, and the runtime binds them like data. :func:`promote_parameters`
turns a model's weight constants into inputs; :func:`parameters` says which constants are weights.

The pipeline builds the step after the GraphFusion stage (``AutodiffPass``), so the backward is
written from the fused forward ops' own rules; the float64 reference is the step of the unfused
forward graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fusiontune.ir.autodiff import extend, grad_graph, gradient_name
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph, GraphEditor
from fusiontune.ir.ops import FLOAT_DTYPES

LOSSES = ("mse", "cross_entropy")
OPTIMIZERS = ("sgd", "adam")
LOSS = "loss"
UPDATED_PREFIX = "updated/"
TARGET = "target"
LABELS = "labels"
STATE_NAMES = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}
"""Optimizer -> its per-parameter state tensors, by torch's ``state`` keys."""


@dataclass(frozen=True)
class TrainSpec:
    """How a forward graph becomes a training step.

    Attributes:
        loss: ``"mse"`` (mean squared error against ``target``) or ``"cross_entropy"`` (mean
            negative log-likelihood of ``labels`` under a softmax over the output's last axis).
        optimizer: ``"sgd"`` (with momentum) or ``"adam"``.
        params: the parameters (graph inputs of the forward) the step differentiates and updates.
        output: the forward output the loss reads; ``None``: the first float output.
        lr: the learning rate.
        momentum: SGD's momentum.
        betas: Adam's ``(beta1, beta2)``.
        eps: Adam's epsilon.
        step: Adam's step count ``t`` for the bias corrections (the step measured is step ``t``).
    """

    loss: str = "mse"
    optimizer: str = "sgd"
    params: tuple[str, ...] = ()
    output: str | None = None
    lr: float = 1e-3
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    step: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {self.optimizer!r}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, not {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), not {self.momentum}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), not {self.betas}")
        if not (np.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be finite and > 0, not {self.eps}")
        if self.step < 1:
            raise ValueError(f"step must be >= 1, not {self.step}")

    @property
    def states(self) -> tuple[str, ...]:
        return STATE_NAMES[self.optimizer]


def parameters(graph: Graph) -> tuple[str, ...]:
    """The weight constants of ``graph``, in the order its nodes first read them.

    A weight is a float constant of at least two elements that a node reads and that holds only
    finite values, excluding what a model keeps beside its weights: an additive attention mask
    (any value at or below -1e4, or a non-finite one) and a BatchNormalization's running mean and
    variance (its inputs 3 and 4). Scalars are the graph's arithmetic, not weights.
    """
    seen: dict[str, None] = {}
    for node in graph.nodes:
        for k, name in enumerate(node.inputs):
            arr = graph.constants.get(name)
            if arr is None or name in seen or arr.size < 2 or str(arr.dtype) not in FLOAT_DTYPES:
                continue
            if node.op == "BatchNorm" and k >= 3:
                continue
            if not np.isfinite(arr).all() or float(arr.min()) <= -1e4:
                continue
            seen[name] = None
    batch_norm_stats = {n.inputs[k] for n in graph.nodes if n.op == "BatchNorm" for k in (3, 4) if k < len(n.inputs)}
    return tuple(p for p in seen if p not in batch_norm_stats)


def promote_parameters(graph: Graph, params: Sequence[str]) -> tuple[Graph, dict[str, np.ndarray]]:
    """``graph`` with the constants ``params`` turned into graph inputs (after its own inputs).

    Returns:
        The graph and the parameters' values (float32 copies, the inputs to bind).
    """
    missing = [p for p in params if p not in graph.constants]
    if missing:
        raise ValueError(f"{graph.name}: {missing[0]!r} is not a constant of the graph")
    values = {p: np.array(graph.constants[p]) for p in params}
    promoted = Graph(
        graph.name,
        graph.values,
        graph.nodes,
        (*graph.inputs, *params),
        graph.outputs,
        {k: v for k, v in graph.constants.items() if k not in values},
    )
    promoted.validate()
    return promoted, values


def loss_output(graph: Graph, spec: TrainSpec) -> str:
    """The forward output the loss reads (``spec.output``, else the first float output)."""
    if spec.output is not None:
        if spec.output not in graph.outputs:
            raise ValueError(f"{graph.name}: no output {spec.output!r} for the loss (have {list(graph.outputs)})")
        return spec.output
    for name in graph.outputs:
        if graph.values[name].dtype in FLOAT_DTYPES:
            return name
    raise ValueError(f"{graph.name}: no float output for the loss")


def loss_graph(graph: Graph, spec: TrainSpec) -> Graph:
    """The forward graph with the loss added as its only output."""
    out = loss_output(graph, spec)
    v = graph.values[out]
    b = extend(graph, v.dtype)
    y = b.tensor(out)
    with b.scope(LOSS):
        if spec.loss == "mse":
            t = b.input(TARGET, v.shape, v.dtype)
            d = b.sub(y, t)
            value = b.reduce_mean(b.mul(d, d), list(range(len(v.shape))), keepdims=False)
        else:
            if len(v.shape) < 1 or v.shape[-1] < 2:
                raise ValueError(f"{graph.name}: cross-entropy needs classes on the last axis of {out!r}, shape {v.shape}")
            classes = v.shape[-1]
            labels = b.input(LABELS, v.shape[:-1], "int64")
            column = b.reshape(labels, (*v.shape[:-1], 1))
            onehot = b.cast(b.equal(column, b.const(np.arange(classes, dtype=np.int64), dtype="int64")), v.dtype)
            logp = b.op("LogSoftmax", y, axis=-1)
            picked = b.reduce_sum(b.mul(onehot, logp), -1, keepdims=False)
            value = b.neg(b.reduce_mean(picked, list(range(len(v.shape) - 1)), keepdims=False))
    b.rename(value.name, LOSS)
    b.outputs = [LOSS]
    return GraphEditor(b.graph(graph.name)).finish()


def training_step(forward: Graph, spec: TrainSpec) -> Graph:
    """The training step of ``forward`` (see the module docstring for its inputs and outputs)."""
    if not spec.params:
        raise ValueError(f"{forward.name}: a training step needs at least one parameter")
    for p in spec.params:
        if p not in forward.inputs:
            raise ValueError(f"{forward.name}: parameter {p!r} is not a graph input")
    with_loss = loss_graph(forward, spec)
    step = grad_graph(with_loss, spec.params, loss=LOSS, keep_outputs=True)
    b = extend(step)
    outputs = [LOSS, *(gradient_name(p) for p in spec.params)]
    states = {s: {p: b.input(f"{s}/{p}", step.values[p].shape, step.values[p].dtype) for p in spec.params} for s in spec.states}
    with b.scope("optimizer"):
        for p in spec.params:
            w, g = b.tensor(p), b.tensor(gradient_name(p))
            new = _update(b, spec, w, g, {s: states[s][p] for s in spec.states})
            for name, t in new.items():
                b.rename(t.name, UPDATED_PREFIX + name)
                outputs.append(UPDATED_PREFIX + name)
    b.outputs = outputs
    return GraphEditor(b.graph(forward.name)).finish()


def _update(b: GraphBuilder, spec: TrainSpec, w: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The new parameter and states, by the names they update (``p``, ``momentum_buffer/p``...)."""
    p = w.name
    if spec.optimizer == "sgd":
        buf = b.add(b.mul(state["momentum_buffer"], spec.momentum), g)
        return {p: b.sub(w, b.mul(buf, spec.lr)), f"momentum_buffer/{p}": buf}
    b1, b2 = spec.betas
    m = b.add(b.mul(state["exp_avg"], b1), b.mul(g, 1.0 - b1))
    v = b.add(b.mul(state["exp_avg_sq"], b2), b.mul(b.mul(g, g), 1.0 - b2))
    step_size = spec.lr / (1.0 - b1**spec.step)
    denom = b.add(b.div(b.sqrt(v), float(np.sqrt(1.0 - b2**spec.step))), spec.eps)
    new_w = b.sub(w, b.mul(b.div(m, denom), step_size))
    return {p: new_w, f"exp_avg/{p}": m, f"exp_avg_sq/{p}": v}


def step_inputs(forward: Graph, spec: TrainSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded values for what the step of ``forward`` binds beyond the forward's own inputs.

    The MSE target is standard normal; cross-entropy labels are uniform over the classes; the
    optimizer state is that of a run some steps in: momentum buffers and first moments
    ~ N(0, 1e-3^2), second moments their squares plus 1e-8 (positive, at Adam's scale).
    """
    rng = np.random.default_rng(seed + 7919)
    out = forward.values[loss_output(forward, spec)]
    arrays: dict[str, np.ndarray] = {}
    if spec.loss == "mse":
        arrays[TARGET] = rng.standard_normal(out.shape).astype(out.dtype)
    else:
        arrays[LABELS] = rng.integers(0, out.shape[-1], size=out.shape[:-1]).astype(np.int64)
    for s in spec.states:
        for p in spec.params:
            v = forward.values[p]
            first = 1e-3 * rng.standard_normal(v.shape)
            value = np.square(first) + 1e-8 if s == "exp_avg_sq" else first
            arrays[f"{s}/{p}"] = value.astype(v.dtype)
    return arrays


def compared_as_one(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A step's outputs joined the way its accuracy is judged: ``loss``, ``grad``, ``updated``.

    All gradients form one vector, as the optimizer sees them, and so do all updated parameters
    and states: a parameter whose exact gradient is zero (the bias of attention's keys, which
    softmax cancels) then counts by its rounding noise against the whole gradient, not against
    its own zero. Names follow ``reference``.

    Raises:
        KeyError: an output of ``reference`` is missing.
        ValueError: an output's shape differs from its reference's.
    """
    groups: dict[str, list[np.ndarray]] = {}
    for name, ref in reference.items():
        if name not in outputs:
            raise KeyError(f"output {name!r} is missing (have {sorted(outputs)})")
        a = np.asarray(outputs[name])
        if a.shape != np.shape(ref):
            raise ValueError(f"output {name!r} has shape {a.shape}, reference {np.shape(ref)}")
        group = name.split("/", 1)[0] if "/" in name else name
        groups.setdefault(group, []).append(a.astype(np.float64, copy=False).ravel())
    return {k: np.concatenate(v) for k, v in groups.items()}
