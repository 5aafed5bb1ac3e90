"""The report's "How to apply": the ATC command, the set_context line and the fusiontune run, with
the paths the report wrote and the flags string it wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

from fusiontune.config.flags import parse_graph_kernel_flags, render_flags
from fusiontune.config.fusion_config import FusionConfig, JobPass, job_table
from fusiontune.report import build_report
from fusiontune.report._apply import how_to_apply, how_to_apply_lines
from fusiontune.report._render import to_markdown
from fusiontune.tune.store import StudyInfo

REPO = Path(__file__).resolve().parents[2]
OUT = Path("results/tb")
BUILT_IN = StudyInfo(workload="transformer_block", sizes={"batch": 2, "seq": 64})
ONNX_TOML = """\
[workload]
onnx = "models/bert_encoder.onnx"
[workload.dims]
batch = 2
seq = 64
"""
ONNX = StudyInfo(
    space_path="search_spaces/bert_encoder.toml", space_toml=ONNX_TOML, workload="bert_encoder"
)


def pre_blocks(config: FusionConfig | None, info: StudyInfo = BUILT_IN) -> list[str]:
    return [b[1] for b in how_to_apply(config, OUT, info) if b[0] == "pre"]


def tuned() -> FusionConfig:
    return FusionConfig.resolve(
        explicit={"GeluFusionPass": False, "ApproxTranscendentalFusionPass": True},
        split_points={"MatMulRowSplitFusionPass.row_block": 32},
    )


def test_atc_line_names_the_written_cfg():
    atc = pre_blocks(tuned())[0]
    assert atc.startswith("atc --model=YOUR_MODEL.onnx --framework=5 ")
    assert atc.endswith(" --fusion_switch_file=results/tb/fusion_switch.cfg")


def test_set_context_line_carries_the_flags_string_that_gives_the_switches():
    config = tuned()
    line = pre_blocks(config)[1].splitlines()[1]
    flags = render_flags(config)
    assert flags and line == (
        f'mindspore.set_context(enable_graph_kernel=True, graph_kernel_flags="{flags}")'
    )
    assert parse_graph_kernel_flags(flags).config.switches == config.switches


def test_defaults_need_no_flags_string():
    assert pre_blocks(FusionConfig.defaults())[1] == (
        "import mindspore\nmindspore.set_context(enable_graph_kernel=True)"
    )


def test_split_points_are_said_to_stay_in_best_config_json():
    text = to_markdown(how_to_apply(tuned(), OUT, BUILT_IN))
    assert "`MatMulRowSplitFusionPass.row_block=32`" in text
    assert "`results/tb/best_config.json` keeps them" in text


def test_run_line_reruns_the_workload_with_its_sizes_and_the_sidecar():
    assert pre_blocks(tuned())[2] == (
        "fusiontune run transformer_block --size batch=2 --size seq=64"
        " --config results/tb/best_config.json --vs-all-off"
    )


def test_an_onnx_study_names_its_model_in_atc_and_run():
    atc, _, run = pre_blocks(tuned(), ONNX)
    assert (
        "--model=search_spaces/models/bert_encoder.onnx --framework=5 --output=bert_encoder " in atc
    )
    assert run == (
        "fusiontune run search_spaces/models/bert_encoder.onnx --dim batch=2 --dim seq=64"
        " --config results/tb/best_config.json --vs-all-off"
    )


def test_a_job_gets_its_own_names_and_no_fusiontune_run():
    table = job_table(
        [
            JobPass("SoftmaxFusionPass", "GraphFusion"),
            JobPass("add_layer_norm_fusion", "GraphFusion"),
        ]
    )
    config = FusionConfig.resolve(explicit={"SoftmaxFusionPass": False}, passes=table)
    blocks = how_to_apply(config, OUT, StudyInfo(target={"kind": "command"}))
    pres = [b[1] for b in blocks if b[0] == "pre"]
    assert len(pres) == 2
    assert (
        'graph_kernel_flags="--enable_pass=add_layer_norm_fusion --disable_pass=SoftmaxFusionPass"'
        in pres[1]
    )
    assert "the job's names" in to_markdown(blocks)


def test_nothing_recommended_nothing_to_apply():
    assert how_to_apply(None, OUT, BUILT_IN) == []


def test_the_report_shows_how_to_apply_with_its_own_paths(tmp_path: Path):
    out = tmp_path / "example"
    out.mkdir()
    shutil.copy(REPO / "results" / "example" / "study.db", out / "study.db")
    build_report(out)
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert md.index("## How to apply") < md.index("## Fusion statistics")
    assert f"--fusion_switch_file={out / 'fusion_switch.cfg'}" in md
    assert f"--config {out / 'best_config.json'} --vs-all-off" in md
    assert (
        "<h2>How to apply</h2>" in html
        and "mindspore.set_context(enable_graph_kernel=True)" in html
    )
    assert (
        out / "graph_kernel_flags.txt"
    ).read_text() == "\n"  # the defaults: the same empty string


def test_terminal_lines_give_the_atc_and_set_context_lines():
    lines = how_to_apply_lines(tuned(), OUT, BUILT_IN)
    assert lines[0].startswith("apply with CANN:      atc --model=YOUR_MODEL.onnx ")
    assert lines[0].endswith("--fusion_switch_file=results/tb/fusion_switch.cfg")
    assert lines[1] == (
        "apply with MindSpore: mindspore.set_context(enable_graph_kernel=True,"
        f' graph_kernel_flags="{render_flags(tuned())}")'
    )
    assert how_to_apply_lines(None, OUT, BUILT_IN) == []
