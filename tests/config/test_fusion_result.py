"""CANN fusion_result.json: written as CANN writes it, read back in every shape CANN uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusiontune.config import ConfigError, FusionCounts, read_fusion_result, write_fusion_result
from fusiontune.passes.base import FusionReport, PatternStat

REPORT = FusionReport(
    stats=(
        PatternStat("SoftmaxFusionPass", "GraphFusion", "Softmax", 2, 2),
        PatternStat("GeluFusionPass", "GraphFusion", "Gelu", 1, 0),
        PatternStat("TbeEltwiseFusionPass", "UBFusion", "Eltwise", 3, 3),
        PatternStat("TbeEltwiseFusionPass", "UBFusion", "EltwiseChain", 1, 1),
    ),
    applications=(),
    passes_run=("SoftmaxFusionPass", "GeluFusionPass", "TbeEltwiseFusionPass"),
)


def test_write_gives_a_one_element_list_in_cann_shape(tmp_path: Path) -> None:
    path = write_fusion_result(REPORT, tmp_path / "out" / "fusion_result.json")
    data = json.loads(path.read_text())
    assert isinstance(data, list) and len(data) == 1
    assert data[0]["graph_fusion"]["SoftmaxFusionPass"] == {"match_times": "2", "effect_times": "2"}
    assert data[0]["ub_fusion"]["TbeEltwiseFusionPass"] == {"match_times": "4", "effect_times": "4"}
    assert "\n    " in path.read_text()  # pretty-printed


def test_write_then_read_gives_per_pass_totals(tmp_path: Path) -> None:
    path = write_fusion_result(REPORT, tmp_path / "fusion_result.json")
    assert read_fusion_result(path) == {
        "SoftmaxFusionPass": (2, 2),
        "GeluFusionPass": (1, 0),
        "TbeEltwiseFusionPass": (4, 4),
    }


def test_read_accepts_one_entry_int_counts_and_unknown_cann_passes(tmp_path: Path) -> None:
    path = tmp_path / "fusion_result.json"
    path.write_text(
        json.dumps(
            {
                "session_and_graph_id": "0_1",
                "graph_fusion": {"AReduceSumFusionPass": {"match_times": 1, "effect_times": "0"}},
                "ub_fusion": {"TbeEltwiseFusionPass": {"match_times": "3", "effect_times": 3}},
            }
        )
    )
    assert read_fusion_result(path) == {
        "AReduceSumFusionPass": FusionCounts(1, 0),
        "TbeEltwiseFusionPass": FusionCounts(3, 3),
    }


def test_read_sums_over_graphs_and_accepts_a_flat_mapping(tmp_path: Path) -> None:
    entry = {"graph_fusion": {"SoftmaxFusionPass": {"match_times": "1", "effect_times": "1"}}}
    path = tmp_path / "two_graphs.json"
    path.write_text(json.dumps([entry, entry]))
    assert read_fusion_result(path) == {"SoftmaxFusionPass": (2, 2)}
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"SoftmaxFusionPass": {"match_times": 5, "effect_times": 4}}))
    assert read_fusion_result(flat) == {"SoftmaxFusionPass": (5, 4)}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '[{"graph_fusion": {"X": {"match_times": "two", "effect_times": "0"}}}]',
            'r.json: [0].graph_fusion.X.match_times: expected a non-negative count, got "two"',
        ),
        (
            '[{"graph_fusion": {"X": {"match_times": "1"}}}]',
            "r.json: [0].graph_fusion.X.effect_times: missing key",
        ),
        ('[{"ub_fusion": []}]', "r.json: [0].ub_fusion: expected an object"),
        ("[1]", "r.json: [0]: expected an object, got int"),
        (
            '{"graph_fusion": {"X": 3}}',
            "r.json: graph_fusion.X: expected an object with match_times",
        ),
        ('[{"graph_fusion": {}', "r.json:1:21: malformed JSON: Expecting ',' delimiter"),
    ],
)
def test_bad_fusion_result_names_file_and_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_fusion_result(path)
    assert str(info.value).startswith(f"{tmp_path}/{message}")


def test_missing_fusion_result_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_fusion_result(tmp_path / "absent.json")
