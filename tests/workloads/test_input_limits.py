"""Workload sizes that cannot fit in memory, and search spaces nested too deeply: one line, rc 2.

The memory check runs on shapes alone, before any array exists: ``--size batch=100000000`` used to
end in numpy's ``_ArrayMemoryError`` traceback after trying to allocate 381 GiB. The ONNX cases use
the repository's exported models (real exporter output, not fixtures written for the check).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.errors import UserError
from fusiontune.workloads import _memory, make_workload
from fusiontune.workloads.builtin import WORKLOADS, graph_shapes
from fusiontune.workloads.space import SpaceError, loads_space

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "search_spaces" / "models" / "bert_encoder.onnx"
NOTHING_BIG = 256 * 1024**2  # far below any of the refused sizes, far above the imports' own peak


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, assert it refused in one stderr line (rc 2, no traceback), return the line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fusiontune: error: ")
    return err.strip()


@pytest.fixture()
def traced() -> Iterator[None]:
    """Trace allocations (numpy reports its buffers to tracemalloc) for the test's duration."""
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def peak_bytes() -> int:
    return tracemalloc.get_traced_memory()[1]


@pytest.mark.parametrize("size", ["batch=100000000", "hidden=1000000"])
def test_a_builtin_workload_too_big_for_the_machine_is_refused_before_allocating(
    capsys: pytest.CaptureFixture[str], traced: None, size: str
) -> None:
    line = refused(capsys, "run", "mlp", "--size", size)
    assert f"mlp: {size} needs about " in line
    assert "(inputs, weights and the float64 reference); this machine has " in line
    assert line.endswith(" available")
    assert peak_bytes() < NOTHING_BIG


def test_sizes_beyond_int64_are_one_line_not_a_numpy_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(capsys, "run", "mlp", "--size", f"batch={2**64}")
    assert "mlp: batch=" in line


def test_the_check_compares_with_the_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "available_memory", lambda: 1024)
    with pytest.raises(
        UserError, match=r"^mlp at its default sizes needs about .* has 1 KiB available$"
    ):
        make_workload("mlp")
    monkeypatch.setattr(_memory, "available_memory", lambda: None)  # unknown: no check
    assert make_workload("mindspore_basic").inputs["x"].shape == (4, 4)


def test_the_estimate_covers_what_the_reference_holds() -> None:
    """Every value of the graph in float64, plus the inputs and weights the workload keeps."""
    spec = WORKLOADS["transformer_block"]
    graph = graph_shapes(spec, spec.sizes)
    every_value = sum(v.size * 8 for v in graph.values.values())
    assert _memory.workload_bytes(graph) > every_value
    built = make_workload("transformer_block")
    assert {k: v.shape for k, v in built.graph.values.items()} == {
        k: v.shape for k, v in graph.values.items()
    }


def test_the_shapes_only_graph_takes_no_memory_for_its_weights(traced: None) -> None:
    spec = WORKLOADS["llama_block"]
    graph = graph_shapes(spec, {**spec.sizes, "hidden": 65536, "heads": 4, "ffn": 65536})
    assert graph.values["mlp/gate/weight"].shape == (65536, 65536)  # 16 GiB as float32
    assert peak_bytes() < NOTHING_BIG


def test_available_memory_reads_the_machine() -> None:
    have = _memory.available_memory()
    assert have is None or have > 0


def test_an_onnx_model_whose_inputs_cannot_fit_is_refused_before_import(
    capsys: pytest.CaptureFixture[str], traced: None
) -> None:
    line = refused(capsys, "run", str(BERT), "--dim", "batch=100000000", "--dim", "seq=64")
    assert f"{BERT}: --dim batch=100000000, --dim seq=64 needs about " in line
    assert "inputs with their float64 copies, and weights" in line
    assert peak_bytes() < NOTHING_BIG


def test_an_onnx_model_whose_intermediates_cannot_fit_is_refused_before_its_inputs_exist(
    capsys: pytest.CaptureFixture[str], traced: None
) -> None:
    """batch=10^6: the token ids fit (0.5 GB), the float64 activations of the graph do not."""
    line = refused(capsys, "run", str(BERT), "--dim", "batch=1000000", "--dim", "seq=64")
    assert "(inputs, weights and the float64 reference); this machine has " in line
    assert peak_bytes() < NOTHING_BIG


def test_a_search_space_nested_too_deeply_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    space = tmp_path / "deep.toml"
    space.write_text('workload = "mlp"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    line = refused(capsys, "tune", str(space))
    assert f"{space}: nested too deeply for the TOML parser" in line


def test_a_search_space_nested_past_the_limit_names_the_key() -> None:
    text = 'workload = "mlp"\n[search]\nx = {a = {b = {c = {d = {e = {f = {g = {h = 1}}}}}}}}\n'
    with pytest.raises(
        SpaceError, match=r"^s\.toml: search\.x\.a\.b\.c\.d\.e\.f\.g: nested deeper"
    ):
        loads_space(text, "s.toml")


def test_a_search_space_over_the_size_limit_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    space = tmp_path / "big.toml"
    with space.open("wb") as f:
        f.truncate(17 * 1024**2)
    line = refused(capsys, "tune", str(space))
    assert f"{space}: 17 MiB, over the 16 MiB limit" in line
