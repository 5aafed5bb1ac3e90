"""The correctness walk over the ONNX backend test data the onnx package ships.

Each case is a model with one data set (inputs and the expected outputs that the onnx package
ships). A case is *unsupported* when the importer refuses it (an op or attribute it does not
convert, a shape that depends on an input), *passed* when both the float64 interpreter and the
registry-defaults program agree with the expected outputs, and *failed* otherwise, with the reason.

Every kernel of this walk is compiled serial, as numba compiles it for a process pinned to one
thread (``NUMBA_NUM_THREADS=1``): the walk checks what each op computes at the shapes the onnx
package ships, which a ``prange`` does not change, and a parallel kernel costs numba about 3.4
times the compile time of the same kernel serial (the light zoo's full-size CNNs were 114 of the
suite's 276 parallel kernels, 324 s of its 1892 s of compiling). The parallel forms of the same
conv, pool and layout kernels are checked on the real exports (test_real_exports.py), whose
programs are built with every thread: numba's parallel lowering has lost stores that the serial
form kept (tests/codegen/test_conv.py), so that check stays where the models are.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numba
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fusiontune.codegen.common import NotFusable
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.interpreter import run_graph
from fusiontune.ir.onnx_import import OnnxImportError, import_onnx
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import build_program, precompile

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
RTOL, ATOL = 1e-3, 1e-4  # float32 results against float32 expected outputs


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    model: Any  # a ModelProto, or a path
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Outcome:
    suite: str
    name: str
    status: str  # passed | failed | unsupported | no_kernel
    reason: str = ""


@pytest.fixture(autouse=True)
def _serial_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel built in this module is serial (module docstring)."""
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)


def _tensor(path: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def dir_cases(suite: str) -> Iterator[Case]:
    """``<suite>/<case>/model.onnx`` with ``test_data_set_0/{input,output}_*.pb``."""
    for d in sorted(glob.glob(os.path.join(DATA, suite, "*", ""))):
        data = os.path.join(d, "test_data_set_0")
        ins = sorted(glob.glob(os.path.join(data, "input_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
        outs = sorted(glob.glob(os.path.join(data, "output_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
        yield Case(suite, os.path.basename(d.rstrip(os.sep)), os.path.join(d, "model.onnx"),
                   tuple(_tensor(p) for p in ins), tuple(_tensor(p) for p in outs))


def node_cases(op_types: set[str]) -> Iterator[Case]:
    """The node test cases onnx generates in memory (the ``node/`` data), for the given op types."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    for c in sorted(cases, key=lambda c: c.name):
        ops = {n.op_type for n in c.model.graph.node}
        if not ops or not ops <= op_types or not c.data_sets:
            continue
        inputs, outputs = c.data_sets[0]
        if any(isinstance(x, list) for x in (*inputs, *outputs)):
            continue  # a sequence at the graph's boundary: the IR has tensors only (sequences live inside)
        yield Case("node", c.name, c.model, tuple(_as_array(x) for x in inputs), tuple(_as_array(x) for x in outputs))


def _as_array(x: Any) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def light_cases(name: str = "*") -> Iterator[Case]:
    """Full-size CNNs with generated weights; inputs are ``arange(n) / n`` as onnx's runner makes them."""
    for path in sorted(glob.glob(os.path.join(DATA, "light", f"light_{name}.onnx"))):
        model = onnx.load(path)
        inits = {t.name for t in model.graph.initializer}
        inputs = []
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = tuple(d.dim_value or 1 for d in vi.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
        outputs = [_tensor(path[:-5] + f"_output_{i}.pb") for i in range(len(model.graph.output))]
        yield Case("light", os.path.basename(path)[6:-5], path, tuple(inputs), tuple(outputs))


def _model_path(case: Case, tmp: str) -> str:
    if isinstance(case.model, str):
        return case.model
    path = os.path.join(tmp, f"{case.suite}_{case.name}.onnx")
    onnx.save(case.model, path)
    return path


def _mismatch(got: dict[str, np.ndarray], names: list[str], want: tuple[np.ndarray, ...]) -> str | None:
    for name, w in zip(names, want, strict=True):
        g = np.asarray(got[name])
        if g.shape != w.shape:
            return f"output {name}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g.astype(w.dtype), w):
                return f"output {name}: values differ ({int((g.astype(w.dtype) != w).sum())} of {w.size})"
            continue
        if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
            err = np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64))) if w.size else 0.0
            return f"output {name}: max abs error {err:.3g}"
    return None


def evaluate(case: Case, tmp: str) -> Outcome:
    """Import, then check the float64 interpreter and the registry-defaults program."""
    try:
        graph = import_onnx(_model_path(case, tmp))
    except OnnxImportError as e:
        return Outcome(case.suite, case.name, "unsupported", str(e).split(": ", 1)[-1])
    feeds = dict(zip(graph.inputs, case.inputs, strict=True))
    feeds = {k: v.astype(graph.values[k].dtype) for k, v in feeds.items()}
    onnx_names = [o.name for o in (onnx.load(case.model) if isinstance(case.model, str) else case.model).graph.output]
    try:
        ref = run_graph(graph, feeds, "float64")
    except Exception as e:  # noqa: BLE001 - any failure is this case's result
        return Outcome(case.suite, case.name, "failed", f"interpreter: {type(e).__name__}: {e}")
    bad = _mismatch(ref, onnx_names, case.outputs)
    if bad:
        return Outcome(case.suite, case.name, "failed", f"interpreter (float64): {bad}")
    try:
        program = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
        got = {k: np.array(v) for k, v in program.run(feeds).items()}
    except NotFusable as e:  # codegen has no kernel for it (3-D windows, float16): not a wrong result
        return Outcome(case.suite, case.name, "no_kernel", f"defaults program: NotFusable: {e}")
    except Exception as e:  # noqa: BLE001
        return Outcome(case.suite, case.name, "failed", f"defaults program: {type(e).__name__}: {e}")
    bad = _mismatch(got, onnx_names, case.outputs)
    if bad:
        return Outcome(case.suite, case.name, "failed", f"defaults program: {bad}")
    return Outcome(case.suite, case.name, "passed")


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    counts: dict[str, int] = {"passed": 0, "failed": 0, "unsupported": 0, "no_kernel": 0}
    for o in outcomes:
        counts[o.status] += 1
    return {"counts": counts, "cases": [asdict(o) for o in outcomes]}


# ---- the tests ---------------------------------------------------------------------------------
# Cases that import but are known not to match, each with the reason. A case that starts to pass
# must leave this list (test_allow_list_is_current), so it never hides a regression for long.
ALLOWED_FAILURES: dict[str, str] = {}


def _supported_ops() -> set[str]:
    from fusiontune.ir._onnx_ops import CONVERTERS

    return set(CONVERTERS)


def _defaults_graphs(cases: list[Case], tmp: str) -> Iterator[Any]:
    for case in cases:
        try:
            yield run_pipeline(import_onnx(_model_path(case, tmp)), FusionConfig.defaults()).fused
        except Exception:  # noqa: BLE001 - evaluate() reports it
            continue


def _walk(suite: str, cases: Iterator[Case], tmp_path: Any) -> list[Outcome]:
    import json

    cases = list(cases)
    # Every cold kernel of the suite at once, on every core (the cases' own builds then load them).
    precompile(_defaults_graphs(cases, str(tmp_path)))
    outcomes = [evaluate(c, str(tmp_path)) for c in cases]
    report = summarize(outcomes)
    (tmp_path / f"onnx_walk_{suite}.json").write_text(json.dumps(report, indent=1))
    counts = report["counts"]
    print(
        f"\nONNX backend walk [{suite}]: {counts['passed']} passed, {counts['failed']} failed,"
        f" {counts['unsupported']} unsupported, {counts['no_kernel']} waiting for a kernel"
        f" (report: {tmp_path / f'onnx_walk_{suite}.json'})"
    )
    for o in outcomes:
        if o.status in ("failed", "no_kernel"):
            print(f"  {o.status:9s} {o.name}: {o.reason[:200]}")
    unsupported: dict[str, int] = {}
    for o in outcomes:
        if o.status == "unsupported":
            unsupported[o.reason[:80]] = unsupported.get(o.reason[:80], 0) + 1
    for reason, n in sorted(unsupported.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  unsupported x{n}: {reason}")
    return outcomes


def _check(outcomes: list[Outcome]) -> None:
    failed = [o for o in outcomes if o.status == "failed" and f"{o.suite}/{o.name}" not in ALLOWED_FAILURES]
    assert not failed, "models that import but compute wrong results:\n" + "\n".join(
        f"{o.suite}/{o.name}: {o.reason}" for o in failed
    )
    passing_allowed = [o.name for o in outcomes if o.status == "passed" and f"{o.suite}/{o.name}" in ALLOWED_FAILURES]
    assert not passing_allowed, f"allow-listed cases now pass, remove them from ALLOWED_FAILURES: {passing_allowed}"


@pytest.mark.parametrize("suite", ["pytorch-converted", "pytorch-operator", "simple"])
def test_backend_model_suite_matches_expected_outputs(suite: str, tmp_path: Any) -> None:
    outcomes = _walk(suite, dir_cases(suite), tmp_path)
    assert any(o.status == "passed" for o in outcomes)
    _check(outcomes)


def test_backend_node_cases_match_expected_outputs(tmp_path: Any) -> None:
    outcomes = _walk("node", node_cases(_supported_ops()), tmp_path)
    assert sum(o.status == "passed" for o in outcomes) > 100
    _check(outcomes)


# The light model zoo: full-size 224 x 224 CNNs. Measured from a cold kernel cache on the 2-core
# machine: the three below take 58 to 123 s each (their many distinct conv kernels compile), so they
# run in the `zoo` tier (`make test-zoo`), not in CI; the other six (alexnet, resnet50, shufflenet,
# squeezenet, vgg19, zfnet512) take 14 to 30 s each and run in CI.
ZOO_ONLY = ("densenet121", "inception_v1", "inception_v2")
LIGHT = sorted(os.path.basename(p)[6:-5] for p in glob.glob(os.path.join(DATA, "light", "light_*.onnx")))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.zoo) if n in ZOO_ONLY else n for n in LIGHT]
)
def test_light_model_matches_expected_outputs(name: str, tmp_path: Any) -> None:
    """One full-size CNN of onnx's light zoo: the interpreter and the defaults program."""
    outcomes = _walk(f"light-{name}", (c for c in light_cases(name) if c.name == name), tmp_path)
    assert [o.status for o in outcomes] == ["passed"], outcomes
