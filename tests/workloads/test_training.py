"""Training steps: the step graph against independent arithmetic, the workload, the CLI and spaces.

The step's gradients come from the VJP rules (checked op by op against finite differences in
tests/ir/test_autodiff.py); here the whole step is checked against what no rule wrote: the loss's
central finite differences in float64, numpy's own SGD / Adam arithmetic, and torch's autograd and
optimizers when torch is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fusiontune.cli import main
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.builder import GraphBuilder
from fusiontune.ir.graph import Graph
from fusiontune.ir.interpreter import run_graph
from fusiontune.ir.training import (
    LABELS,
    TARGET,
    TrainSpec,
    compared_as_one,
    parameters,
    promote_parameters,
    step_inputs,
    training_step,
)
from fusiontune.measure import MeasureConfig
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.tune.evaluate import build_candidate, check_and_time
from fusiontune.workloads import make_workload
from fusiontune.workloads.onnx_model import load_workload
from fusiontune.workloads.space import SpaceError, loads_space
from fusiontune.workloads.workload import training_workload

SIZES = {"batch": 4, "hidden": 16}
_QUICK = MeasureConfig(repeat=3, warmup=1)


def tiny_mlp(classes: int = 5) -> Graph:
    """x (3, 4) -> Linear(4, 6) -> Tanh -> Linear(6, classes): weights as constants."""
    rng = np.random.default_rng(3)
    g = GraphBuilder("tiny")
    x = g.input("x", (3, 4))
    h = g.tanh(g.add(g.matmul(x, g.const(rng.standard_normal((4, 6)), name="w1")), g.const(rng.standard_normal(6), name="b1")))
    y = g.add(g.matmul(h, g.const(rng.standard_normal((6, classes)), name="w2")), g.const(rng.standard_normal(classes), name="b2"))
    g.output(y)
    return g.build()


def _forward(graph: Graph) -> tuple[Graph, dict[str, np.ndarray], tuple[str, ...]]:
    params = parameters(graph)
    promoted, values = promote_parameters(graph, params)
    return promoted, values, params


def _loss_of(graph: Graph, spec: TrainSpec, inputs: dict[str, np.ndarray]) -> float:
    """The float64 loss alone, computed with numpy from the forward's output (independent of the step)."""
    y = run_graph(graph, inputs, "float64")[graph.outputs[0]]
    if spec.loss == "mse":
        return float(np.mean((y - inputs[TARGET].astype(np.float64)) ** 2))
    z = y - y.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-np.mean(np.take_along_axis(logp, inputs[LABELS][..., None], axis=-1)))


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_step_is_the_loss_gradient_and_the_optimizers_update(loss: str, optimizer: str) -> None:
    forward, values, params = _forward(tiny_mlp())
    spec = TrainSpec(loss=loss, optimizer=optimizer, params=params, lr=0.05, step=3)
    drawn = {"x": np.random.default_rng(0).standard_normal((3, 4)), **values, **step_inputs(forward, spec)}
    inputs = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in drawn.items()}
    out = run_graph(training_step(forward, spec), inputs, "float64")
    assert out["loss"] == pytest.approx(_loss_of(forward, spec, inputs), rel=1e-12)
    for p in params:
        grad = np.zeros_like(inputs[p], dtype=np.float64)
        for i in np.ndindex(grad.shape):
            plus, minus = dict(inputs), dict(inputs)
            plus[p] = inputs[p].astype(np.float64).copy()
            minus[p] = inputs[p].astype(np.float64).copy()
            plus[p][i] += 1e-6
            minus[p][i] -= 1e-6
            grad[i] = (_loss_of(forward, spec, plus) - _loss_of(forward, spec, minus)) / 2e-6
        np.testing.assert_allclose(out[f"grad/{p}"], grad, rtol=1e-5, atol=1e-8)
        w, g = inputs[p].astype(np.float64), out[f"grad/{p}"]
        if optimizer == "sgd":
            buf = f32(0.9) * inputs[f"momentum_buffer/{p}"] + g
            np.testing.assert_allclose(out[f"updated/momentum_buffer/{p}"], buf, rtol=1e-12)
            np.testing.assert_allclose(out[f"updated/{p}"], w - f32(0.05) * buf, rtol=1e-12)
        else:
            m = f32(0.9) * inputs[f"exp_avg/{p}"] + f32(0.1) * g
            v = f32(0.999) * inputs[f"exp_avg_sq/{p}"] + f32(1 - 0.999) * g * g
            denom = np.sqrt(v) / f32(np.sqrt(1 - 0.999**3)) + f32(1e-8)
            new = w - m / denom * f32(0.05 / (1 - 0.9**3))
            np.testing.assert_allclose(out[f"updated/exp_avg/{p}"], m, rtol=1e-12)
            np.testing.assert_allclose(out[f"updated/exp_avg_sq/{p}"], v, rtol=1e-12)
            np.testing.assert_allclose(out[f"updated/{p}"], new, rtol=1e-12)


def f32(value: float) -> float:
    """``value`` as the step holds it: a float32 scalar constant (the graph's dtype)."""
    return float(np.float32(value))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_the_step_matches_torch_autograd_and_optim(loss: str, optimizer: str) -> None:
    torch = pytest.importorskip("torch")
    forward, values, params = _forward(tiny_mlp())
    spec = TrainSpec(loss=loss, optimizer=optimizer, params=params, lr=0.05, step=4)
    inputs = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), **values, **step_inputs(forward, spec)}
    out = run_graph(training_step(forward, spec), inputs, "float64")

    t = {p: torch.nn.Parameter(torch.tensor(inputs[p], dtype=torch.float64)) for p in params}
    y = torch.tanh(torch.tensor(inputs["x"], dtype=torch.float64) @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]
    if loss == "mse":
        value = torch.nn.functional.mse_loss(y, torch.tensor(inputs[TARGET], dtype=torch.float64))
    else:
        value = torch.nn.functional.cross_entropy(y, torch.tensor(inputs[LABELS]))
    if optimizer == "sgd":
        opt = torch.optim.SGD(list(t.values()), lr=0.05, momentum=0.9)
        for p in params:
            opt.state[t[p]]["momentum_buffer"] = torch.tensor(inputs[f"momentum_buffer/{p}"], dtype=torch.float64)
    else:
        opt = torch.optim.Adam(list(t.values()), lr=0.05)
        for p in params:
            opt.state[t[p]] = {
                "step": torch.tensor(3.0),  # torch counts the step it is about to take: t = 4
                "exp_avg": torch.tensor(inputs[f"exp_avg/{p}"], dtype=torch.float64),
                "exp_avg_sq": torch.tensor(inputs[f"exp_avg_sq/{p}"], dtype=torch.float64),
            }
    opt.zero_grad()
    value.backward()
    grads = {p: t[p].grad.detach().numpy().copy() for p in params}
    opt.step()
    assert out["loss"] == pytest.approx(float(value.detach()), rel=1e-12)
    for p in params:
        np.testing.assert_allclose(out[f"grad/{p}"], grads[p], rtol=1e-10, atol=1e-14)
        # The step holds lr, momentum and betas as float32 scalars (the graph's dtype); torch's are
        # float64: the updates agree to float32's rounding of the hyperparameters, not further.
        before = inputs[p].astype(np.float64)
        np.testing.assert_allclose(out[f"updated/{p}"] - before, t[p].detach().numpy() - before, rtol=1e-6, atol=1e-12)
        for state, value_t in opt.state[t[p]].items():
            if state != "step":
                np.testing.assert_allclose(out[f"updated/{state}/{p}"], value_t.numpy(), rtol=1e-6, atol=1e-14)


def test_weights_are_the_float_tensors_a_model_learns() -> None:
    llama = make_workload("llama_block", batch=1, seq=8, hidden=16, heads=2, ffn=32).graph
    found = parameters(llama)
    assert "attention/causal_mask" not in found  # an additive mask of -1e9: not a weight
    assert "attention_norm/gamma" in found and "mlp/down/weight" in found
    assert all(llama.constants[p].size >= 2 for p in found)
    assert len(found) == 9  # two norms' gammas, q/k/v/out, gate/up/down


def test_a_zero_gradient_counts_against_the_whole_gradient_not_its_own_zero() -> None:
    ref = {"loss": np.array(1.0), "grad/w": np.ones(4), "grad/k_bias": np.zeros(3)}
    noisy = {"loss": np.array(1.0), "grad/w": np.ones(4), "grad/k_bias": np.full(3, 1e-9)}
    joined = compared_as_one(noisy, ref)
    assert set(joined) == {"loss", "grad"} and joined["grad"].shape == (7,)
    with pytest.raises(KeyError, match="grad/w"):
        compared_as_one({"loss": np.array(1.0)}, ref)
    with pytest.raises(ValueError, match="shape"):
        compared_as_one({**noisy, "grad/w": np.ones(5)}, ref)


def test_a_training_workload_fuses_its_backward_and_holds_the_float32_floor() -> None:
    w = training_workload(make_workload("mlp", **SIZES), TrainSpec(optimizer="adam"))
    assert w.train is not None and set(w.train.params) <= set(w.graph.inputs)
    assert not any(p in w.graph.constants for p in w.train.params)
    assert "loss" in w.reference and all(f"updated/{p}" in w.reference for p in w.train.params)
    fused = run_pipeline(w.graph, FusionConfig.defaults(), train=w.train)
    off = run_pipeline(w.graph, FusionConfig.all_off(), train=w.train)
    assert "GraphFusionPass[AutodiffPass]: pattern=TrainingStep, matched_times=1, effected_times=1" in fused.report.log_lines()
    assert fused.fused.kernel_count < off.fused.kernel_count
    # The backward's nodes are grouped with the forward's: some kernel holds a grad/ node with others.
    assert any(len(g.nodes) > 1 and any(n.startswith("grad/") for n in g.nodes) for g in fused.fused.groups)
    floor = w.errors(run_graph(w.reference_graph, w.inputs, dtype=None))
    for config in (FusionConfig.defaults(), FusionConfig.all_off()):
        checked = check_and_time(w, build_candidate(w, config).program, _QUICK, timing=False)
        assert checked.errors.finite and checked.errors.max_rel <= max(10 * floor.max_rel, 1e-5)


def test_an_inference_pipeline_never_runs_the_backward_stage() -> None:
    w = make_workload("mlp", **SIZES)
    report = run_pipeline(w.graph, FusionConfig.defaults()).report
    assert "AutodiffPass" not in report.passes_run
    assert not any("AutodiffPass" in line for line in report.log_lines())


def test_an_onnx_model_trains_through_its_loss_output() -> None:
    model = Path(__file__).resolve().parents[2] / "search_spaces" / "models" / "bert_encoder.onnx"
    from fusiontune.workloads.onnx_model import OnnxSource

    w = load_workload(OnnxSource.make(model, {"batch": 1, "seq": 8}, {}, None), train=TrainSpec(loss="cross_entropy"))
    assert w.train is not None and len(w.train.params) > 10
    assert np.isfinite(w.reference["loss"]) and w.reference["loss"] > 0


# ---- the command line and search spaces -------------------------------------------------------------
def test_run_train_records_the_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "mlp", "--size", "batch=4", "--size", "hidden=16", "--repeat", "3", "--out", str(tmp_path)]
    assert main([*args, "--train", "--optimizer", "adam", "--lr", "0.01", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    train = rec["train"]
    assert {k: train[k] for k in ("loss", "optimizer", "lr", "parameters")} == {"loss": "mse", "optimizer": "adam", "lr": 0.01, "parameters": 6}
    assert train["parameter_values"] == 3 * (16 * 16 + 16)
    assert "GraphFusionPass[AutodiffPass]: pattern=TrainingStep, matched_times=1, effected_times=1" in rec["fusion_log"]
    result = json.loads((tmp_path / "fusion_result.json").read_text())
    assert "AutodiffPass" in json.dumps(result)
    assert main([*args, "--train"]) == 0
    out = capsys.readouterr().out
    assert "training  one step: mse loss, backward, sgd update (lr 0.001) of 6 weights (816 values)" in out
    assert "result loss:" in out and "result grad/" not in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--loss", "mse"], "--loss is an option of a training step: give --train too"),
        (["--train", "--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
        (["--train", "--lr", "-1"], "--lr"),
    ],
)
def test_run_train_options_are_checked(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "mlp", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


_SPACE = """
[workload]
name = "mlp"
sizes = {{ batch = 4, hidden = 16 }}
{extra}
[passes]
search = ["TbeEltwiseFusionPass", "GeluFusionPass"]
"""


def test_a_space_with_train_makes_a_training_workload() -> None:
    space = loads_space(_SPACE.format(extra='train = true\nloss = "cross_entropy"\noptimizer = "adam"\nlr = 0.01'), "s.toml")
    assert space.train == TrainSpec(loss="cross_entropy", optimizer="adam", lr=0.01)
    assert loads_space(_SPACE.format(extra=""), "s.toml").train is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('loss = "mse"', "s.toml: workload.loss: an option of a training step: add train = true"),
        ('train = "yes"', "s.toml: workload.train: expected true or false"),
        ('train = true\noptimizer = "rmsprop"', "s.toml: workload.optimizer: unknown optimizer 'rmsprop'"),
        ("train = true\nlr = 0", "s.toml: workload.lr: must be > 0"),
    ],
)
def test_a_bad_training_key_is_one_line_naming_it(extra: str, message: str) -> None:
    with pytest.raises(SpaceError) as exc:
        loads_space(_SPACE.format(extra=extra), "s.toml")
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)



def test_the_loss_reads_the_output_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "mlp", "--size", "batch=4", "--size", "hidden=16", "--repeat", "3", "--out", str(tmp_path), "--train"]
    assert main([*args, "--loss-output", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot train" in err and "no output 'nope' for the loss" in err and len(err.splitlines()) == 1
    output = make_workload("mlp", **SIZES).graph.outputs[0]
    assert main([*args, "--loss-output", output, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["loss"] == "mse"
    with pytest.raises(SpaceError, match=r"^s.toml: workload.loss_output: unknown output 'nope'"):
        loads_space(_SPACE.format(extra='train = true\nloss_output = "nope"'), "s.toml")
    space = loads_space(_SPACE.format(extra=f'train = true\nloss_output = "{output}"'), "s.toml")
    assert space.train is not None and space.train.output == output


def test_a_step_too_big_for_the_machine_is_refused_before_its_reference_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusiontune.errors import UserError
    from fusiontune.workloads import _memory

    inference = make_workload("mlp", **SIZES)  # fits: a few KiB
    monkeypatch.setattr(_memory, "available_memory", lambda: 64 * 1024)
    ran: list[str] = []
    monkeypatch.setattr("fusiontune.workloads.workload.run_graph", lambda *a, **k: ran.append("ran"))
    with pytest.raises(UserError, match=r"^the training step of mlp needs about .* available"):
        training_workload(inference, TrainSpec())
    assert not ran
