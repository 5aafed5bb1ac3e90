"""fusion_switch.cfg: both forms read and written, CANN resolution, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusiontune.config import (
    ConfigError,
    FusionConfig,
    dump_switch_json,
    dump_switch_lines,
    load_config,
    load_switch_file,
    loads_switch,
    write_switch_file,
)
from fusiontune.errors import UserError
from fusiontune.passes.registry import PASSES, switchable_passes

SWITCHABLE = [p.name for p in switchable_passes()]
FIXED = [p.name for p in PASSES if not p.switchable]


def on_passes(config: FusionConfig) -> set[str]:
    return {name for name, on in config.switches.items() if on}


def config_with_off(off: set[str]) -> FusionConfig:
    return FusionConfig.resolve(explicit={name: name not in off for name in SWITCHABLE})


def error_of(text: str, source: str = "fusion_switch.cfg") -> str:
    with pytest.raises(ConfigError) as info:
        loads_switch(text, source)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- seed 002's examples -------------------------------------------------------------------------
def test_seed_all_off_with_softmax_on_keeps_only_softmax_and_non_switchable() -> None:
    text = (
        '{"Switch":{"GraphFusion":{"ALL":"off","SoftmaxFusionPass":"on"},"UBFusion":{"ALL":"off"}}}'
    )
    assert on_passes(loads_switch(text)) == {"SoftmaxFusionPass", *FIXED}


def test_seed_all_on_with_softmax_off_turns_off_only_softmax() -> None:
    text = (
        '{"Switch":{"GraphFusion":{"ALL":"on","SoftmaxFusionPass":"off"},"UBFusion":{"ALL":"on"}}}'
    )
    assert on_passes(loads_switch(text)) == set(SWITCHABLE + FIXED) - {"SoftmaxFusionPass"}


def test_seed_one_click_off_leaves_non_switchable_passes_on() -> None:
    text = '{"Switch":{"GraphFusion":{"ALL":"off"},"UBFusion":{"ALL":"off"}}}'
    assert loads_switch(text) == FusionConfig.all_off()
    assert on_passes(loads_switch(text)) == set(FIXED)


# ---- JSON form -----------------------------------------------------------------------------------
def test_json_explicit_entries_win_over_all_whatever_their_order() -> None:
    text = '{"Switch":{"GraphFusion":{"SoftmaxFusionPass":"on","ALL":"off"}}}'
    config = loads_switch(text)
    assert config.enabled("SoftmaxFusionPass")
    assert not config.enabled("GeluFusionPass")
    assert config.enabled("TbeEltwiseFusionPass")  # UBFusion untouched: registry default


def test_json_without_all_keeps_registry_defaults_for_unnamed_passes() -> None:
    config = loads_switch('{"Switch":{"UBFusion":{"TbeEltwiseFusionPass":"off"}}}')
    assert config == FusionConfig.defaults().with_switches(TbeEltwiseFusionPass=False)


def test_json_accepts_mindspore_alias() -> None:
    config = loads_switch('{"Switch":{"GraphFusion":{"add_layer_norm_fusion":"off"}}}')
    assert not config.enabled("AddLayerNormFusionPass")


# ---- line form -----------------------------------------------------------------------------------
def test_line_form_with_comments_and_blank_lines() -> None:
    text = "# recommended by fusiontune\n\nSoftmaxFusionPass:off   # slower here\n  gelu_fusion : off\n"
    config = loads_switch(text)
    assert config == FusionConfig.defaults().with_switches(
        SoftmaxFusionPass=False, GeluFusionPass=False
    )


def test_line_form_plain_all_means_both_sections() -> None:
    assert loads_switch("ALL:off\n") == FusionConfig.all_off()


def test_line_form_section_all_touches_one_section() -> None:
    config = loads_switch("UBFusion.ALL:off\nTbeEltwiseFusionPass:on\n")
    assert config.enabled("SoftmaxFusionPass")
    assert config.enabled("TbeEltwiseFusionPass")
    assert not config.enabled("CompositeOpsFusionPass")


def test_line_form_pass_finds_its_own_section() -> None:
    config = loads_switch("ALL:off\nSoftmaxFusionPass:on\nbasic_ops_fusion:on\n")
    assert on_passes(config) == {"SoftmaxFusionPass", "TbeEltwiseFusionPass", *FIXED}


def test_empty_file_is_the_registry_defaults() -> None:
    assert loads_switch("# nothing switched\n") == FusionConfig.defaults()


# ---- writing -------------------------------------------------------------------------------------
def test_dump_json_full_names_every_switchable_pass_with_cann_names() -> None:
    data = json.loads(dump_switch_json(FusionConfig.all_off()))
    written = {**data["Switch"]["GraphFusion"], **data["Switch"]["UBFusion"]}
    assert list(written) == SWITCHABLE
    assert set(written.values()) == {"off"}
    assert "ALL" not in written


def test_dump_json_minimal_is_all_plus_exceptions() -> None:
    config = FusionConfig.all_off().with_switches(SoftmaxFusionPass=True)
    assert json.loads(dump_switch_json(config, minimal=True)) == {
        "Switch": {
            "GraphFusion": {"ALL": "off", "SoftmaxFusionPass": "on"},
            "UBFusion": {"ALL": "off"},
        }
    }


def test_dump_lines_minimal_is_section_all_plus_exceptions() -> None:
    config = FusionConfig.defaults().with_switches(GeluFusionPass=False)
    # ALL:on, then in registry order the passes that are off: GeluFusionPass and the passes that
    # are off by default (the inexact ones).
    expected = ""
    for kind in ("GraphFusion", "UBFusion"):
        expected += f"{kind}.ALL:on\n" + "".join(
            f"{p.name}:off\n"
            for p in PASSES
            if p.kind == kind and (p.name == "GeluFusionPass" or not p.default)
        )
    assert expected.startswith("GraphFusion.ALL:on\nGeluFusionPass:off\n")
    assert dump_switch_lines(config, minimal=True) == expected


def test_dump_never_writes_split_points() -> None:
    config = FusionConfig.defaults().with_splits(**{"MatMulRowSplitFusionPass.row_block": 128})
    for text in (dump_switch_json(config), dump_switch_lines(config)):
        assert "row_block" not in text and "split_points" not in text and "128" not in text


@pytest.mark.parametrize(
    "dump",
    [
        dump_switch_json,
        lambda c: dump_switch_json(c, minimal=True),
        dump_switch_lines,
        lambda c: dump_switch_lines(c, minimal=True),
    ],
    ids=["json", "json-minimal", "lines", "lines-minimal"],
)
@settings(max_examples=40, deadline=None)
@given(off=st.sets(st.sampled_from(SWITCHABLE)))
def test_dump_then_load_gives_the_same_config(dump, off: set[str]) -> None:  # type: ignore[no-untyped-def]
    config = config_with_off(off)
    assert loads_switch(dump(config)) == config


def test_write_switch_file_round_trips_through_disk(tmp_path: Path) -> None:
    config = FusionConfig.all_off().with_switches(SoftmaxFusionPass=True)
    for form in ("json", "lines"):
        path = write_switch_file(config, tmp_path / form / "fusion_switch.cfg", form=form)
        assert load_switch_file(path) == config


# ---- errors --------------------------------------------------------------------------------------
def test_unknown_pass_names_the_key_and_the_closest_known_names() -> None:
    message = error_of('{"Switch":{"GraphFusion":{"SoftmaxFusionPas":"off"}}}')
    assert message.startswith(
        "fusion_switch.cfg: Switch.GraphFusion.SoftmaxFusionPas: unknown pass "
        "(closest known: SoftmaxFusionPass"
    )


def test_unknown_pass_in_line_form_names_the_line() -> None:
    message = error_of("ALL:off\nSoftmaxFusionPas:on\n")
    assert message.startswith(
        "fusion_switch.cfg:2: SoftmaxFusionPas: unknown pass (closest known: SoftmaxFusionPass"
    )


def test_malformed_json_gives_file_line_and_column() -> None:
    text = '{"Switch":{\n"GraphFusion":{\n"ALL":"off"     "SoftmaxFusionPass":"on"}}}'
    assert error_of(text) == "fusion_switch.cfg:3:17: malformed JSON: Expecting ',' delimiter"


def test_explicit_off_of_non_switchable_pass_is_an_error() -> None:
    message = error_of('{"Switch":{"GraphFusion":{"ALL":"off","ConstantFoldingPass":"off"}}}')
    assert message.startswith("fusion_switch.cfg: Switch.GraphFusion.ConstantFoldingPass: ")
    assert "cannot be switched off" in message and "needed for correctness" in message


def test_pass_under_the_wrong_section_names_the_right_one() -> None:
    message = error_of('{"Switch":{"GraphFusion":{"TbeEltwiseFusionPass":"off"}}}')
    assert message == (
        "fusion_switch.cfg: Switch.GraphFusion.TbeEltwiseFusionPass: TbeEltwiseFusionPass is a "
        "UBFusion pass; it belongs under Switch.UBFusion"
    )


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ('{"switch":{}}', "fusion_switch.cfg: Switch: missing key"),
        ('{"Switch":{}, "Extra":1}', "fusion_switch.cfg: Extra: unknown key"),
        ('["Switch"]', "fusion_switch.cfg: top level: expected an object, got a list"),
        ('{"Switch":[]}', "fusion_switch.cfg: Switch: expected an object, got a list"),
        (
            '{"Switch":{"GraphFusion":"off"}}',
            'fusion_switch.cfg: Switch.GraphFusion: expected an object, got "off"',
        ),
        ('{"Switch":{"UbFusion":{}}}', "fusion_switch.cfg: Switch.UbFusion: unknown section"),
        (
            '{"Switch":{"GraphFusion":{"ALL":false}}}',
            'fusion_switch.cfg: Switch.GraphFusion.ALL: expected "on" or "off", got false',
        ),
        (
            '{"Switch":{"GraphFusion":{"GeluFusionPass":"OFF"}}}',
            'fusion_switch.cfg: Switch.GraphFusion.GeluFusionPass: expected "on" or "off", got "OFF"',
        ),
        (
            '{"Switch":{"GraphFusion":{"ALL":"off","ALL":"on"}}}',
            "fusion_switch.cfg: Switch.GraphFusion.ALL: duplicate key",
        ),
        (
            '{"Switch":{"GraphFusion":{"gelu_fusion":"off","GeluFusionPass":"on"}}}',
            "fusion_switch.cfg: Switch.GraphFusion.GeluFusionPass: conflicts with Switch.GraphFusion.gelu_fusion",
        ),
        ("SoftmaxFusionPass off\n", "fusion_switch.cfg:1: expected PassName:on or PassName:off"),
        (
            "SoftmaxFusionPass:of\n",
            'fusion_switch.cfg:1: SoftmaxFusionPass: expected "on" or "off", got "of"',
        ),
        ("Graph.ALL:off\n", "fusion_switch.cfg:1: Graph.ALL: unknown section 'Graph'"),
        (
            "GraphFusion.basic_ops_fusion:off\n",
            "fusion_switch.cfg:1: GraphFusion.basic_ops_fusion: TbeEltwiseFusionPass is a UBFusion pass",
        ),
        (
            "ALL:off\nGraphFusion.ALL:on\n",
            "fusion_switch.cfg:2: GraphFusion.ALL: conflicts with ALL (line 1)",
        ),
        (
            "IdentityEliminationPass:off\n",
            "fusion_switch.cfg:1: IdentityEliminationPass: IdentityEliminationPass cannot be switched off",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_key(text: str, start: str) -> None:
    assert error_of(text).startswith(start)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.cfg: no such file$"):
        load_switch_file(tmp_path / "nope.cfg")


def test_config_error_is_a_user_error() -> None:
    assert issubclass(ConfigError, UserError)


# ---- load_config: cfg or best_config.json, plus split points --------------------------------------
def test_load_config_reads_cfg_and_merges_split_points(tmp_path: Path) -> None:
    path = tmp_path / "fusion_switch.cfg"
    path.write_text("GeluFusionPass:off\n")
    config = load_config(path, {"matmul_row_split_fusion.row_block": 128})
    assert not config.enabled("GeluFusionPass")
    assert config.split_value("MatMulRowSplitFusionPass", "row_block") == 128


def test_load_config_reads_best_config_json_and_overrides_its_splits(tmp_path: Path) -> None:
    saved = FusionConfig.all_off().with_splits(
        **{"MatMulRowSplitFusionPass.row_block": 32, "TbeEltwiseSplitFusionPass.cut": 4}
    )
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps(saved.to_json()))
    assert load_config(path) == saved
    config = load_config(path, {"MatMulRowSplitFusionPass.row_block": 512})
    assert config.split_value("MatMulRowSplitFusionPass", "row_block") == 512
    assert config.split_value("TbeEltwiseSplitFusionPass", "cut") == 4
    assert config.switches == saved.switches


def test_load_config_reads_json_cfg(tmp_path: Path) -> None:
    path = tmp_path / "fusion_switch.cfg"
    path.write_text('{"Switch":{"GraphFusion":{"ALL":"off"},"UBFusion":{"ALL":"off"}}}')
    assert load_config(path) == FusionConfig.all_off()


def test_load_config_unknown_split_point_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "fusion_switch.cfg"
    path.write_text("")
    with pytest.raises(ConfigError, match="unknown split point 'MatMulRowSplitFusionPass.rows'"):
        load_config(path, {"MatMulRowSplitFusionPass.rows": 4})
