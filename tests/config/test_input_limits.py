"""Configuration files that are too big or too deeply nested: one line naming the file, rc 2.

A pathological file must never reach the JSON decoder's recursion (``'[' * 100000`` used to end in
a RecursionError traceback) nor be read whole into memory (a stray 2 GB file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusiontune.cli import main
from fusiontune.config import ConfigError, load_config, read_fusion_result
from fusiontune.config.switch_file import MAX_JSON_DEPTH, check_json_depth
from fusiontune.errors import MAX_USER_FILE_BYTES


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, assert it refused in one stderr line (rc 2, no traceback), return the line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fusiontune: error: ")
    return err.strip()


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"Switch":' * 50_000 + '"on"' + "}" * 50_000,
        '{"Switch": {"GraphFusion": ' + "[" * 10 + "]" * 10 + "}}",
    ],
    ids=["open-lists", "nested-objects", "ten-levels-under-a-section"],
)
def test_a_deeply_nested_cfg_is_one_line_naming_the_file_and_where(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str
) -> None:
    cfg = tmp_path / "fusion_switch.cfg"
    cfg.write_text(text)
    line = refused(capsys, "convert", str(cfg))
    assert f"{cfg}:1:" in line and f"nested deeper than {MAX_JSON_DEPTH} levels" in line


def test_a_deeply_nested_best_config_json_is_refused_by_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    best = tmp_path / "best_config.json"
    best.write_text('{"GraphFusion": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = refused(capsys, "run", "mlp", "--config", str(best))
    assert f"{best}:1:" in line and "nested deeper" in line


def test_a_deeply_nested_fusion_result_json_is_a_config_error(tmp_path: Path) -> None:
    result = tmp_path / "fusion_result.json"
    result.write_text("[" * 100_000)
    with pytest.raises(ConfigError, match=r"fusion_result\.json:1:9: nested deeper"):
        read_fusion_result(result)


def test_the_depth_check_points_at_the_bracket_that_goes_too_deep() -> None:
    """Line 2 reaches the limit and closes; on line 3 (depth 2 again) the 7th bracket is one too many."""
    inner = MAX_JSON_DEPTH - 2
    text = '{"a": [\n  ' + "[" * inner + "]" * inner + ",\n  " + "[" * MAX_JSON_DEPTH
    with pytest.raises(ConfigError, match=r"^f\.json:3:9: nested deeper than"):
        check_json_depth(text, "f.json")


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    check_json_depth(
        json.dumps({"Switch": {"GraphFusion": {"[" * 50 + '"{' * 50: "on"}}}), "f.json"
    )


def test_every_real_config_nests_within_the_limit(tmp_path: Path) -> None:
    """The three formats, as written by CANN and by fusiontune, pass the check unchanged."""
    cfg = tmp_path / "fusion_switch.cfg"
    cfg.write_text(
        '{"Switch": {"GraphFusion": {"ALL": "off", "SoftmaxFusionPass": "on"}, "UBFusion": {}}}'
    )
    assert load_config(cfg).switches["SoftmaxFusionPass"]
    result = tmp_path / "fusion_result.json"
    result.write_text(
        json.dumps(
            [{"graph_fusion": {"SoftmaxFusionPass": {"match_times": "2", "effect_times": "1"}}}]
        )
    )
    assert read_fusion_result(result)["SoftmaxFusionPass"].match_times == 2


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A sparse 2 GiB file: refused from its size alone, so the test reads (and allocates) nothing."""
    cfg = tmp_path / "huge.cfg"
    with cfg.open("wb") as f:
        f.truncate(2 * 1024**3)
    line = refused(capsys, "run", "mlp", "--config", str(cfg))
    assert f"{cfg}: 2 GiB, over the 16 MiB limit" in line and "nothing was read" in line


def test_a_file_at_the_size_limit_is_still_read(tmp_path: Path) -> None:
    cfg = tmp_path / "padded.cfg"
    body = "SoftmaxFusionPass:off\n"
    cfg.write_text(body + "#" * (MAX_USER_FILE_BYTES - len(body)))
    assert not load_config(cfg).switches["SoftmaxFusionPass"]
