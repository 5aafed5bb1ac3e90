"""MindSpore graph_kernel_flags: parse, render, round trip."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusiontune.config import (
    ConfigError,
    FusionConfig,
    parse_flags,
    parse_graph_kernel_flags,
    render_flags,
)
from fusiontune.config import flags as flags_module
from fusiontune.passes.registry import PASSES, switchable_passes

SWITCHABLE = [p.name for p in switchable_passes()]


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_flags(text)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_disable_pass_by_alias_and_by_cann_name() -> None:
    config = parse_flags("--disable_pass=add_layer_norm_fusion,GeluFusionPass")
    assert config == FusionConfig.defaults().with_switches(
        AddLayerNormFusionPass=False, GeluFusionPass=False
    )


def test_space_separated_value_repeated_flags_and_list_with_spaces() -> None:
    text = "--disable_pass gelu_fusion --disable_pass=softmax_fusion, basic_ops_fusion"
    result = parse_graph_kernel_flags(text)
    assert result.disabled == ("GeluFusionPass", "SoftmaxFusionPass", "TbeEltwiseFusionPass")
    assert result.ignored == ()


def test_enable_pass_of_a_default_on_pass_changes_nothing() -> None:
    assert parse_flags("--enable_pass=softmax_fusion") == FusionConfig.defaults()


def test_unrelated_mindspore_flags_are_returned_apart() -> None:
    result = parse_graph_kernel_flags("--opt_level=2 --dump_as_text --disable_pass=gelu_fusion")
    assert result.ignored == ("--opt_level=2", "--dump_as_text")
    assert result.config == FusionConfig.defaults().with_switches(GeluFusionPass=False)


def test_empty_string_is_the_registry_defaults() -> None:
    assert parse_flags("") == FusionConfig.defaults()


def test_same_pass_enabled_and_disabled_is_an_error() -> None:
    message = error_of("--enable_pass=gelu_fusion --disable_pass=GeluFusionPass")
    assert message.startswith("graph_kernel_flags: --disable_pass=GeluFusionPass: ")
    assert "--enable_pass" in message


def test_unknown_pass_names_the_closest_known_aliases() -> None:
    message = error_of("--disable_pass=add_layer_norm_fusoin")
    assert message.startswith(
        "graph_kernel_flags: --disable_pass=add_layer_norm_fusoin: unknown pass "
        "(closest known: add_layer_norm_fusion"
    )


@pytest.mark.parametrize(
    ("text", "start"),
    [
        (
            "--disable_pass=constant_folding",
            "graph_kernel_flags: --disable_pass=constant_folding: ConstantFoldingPass cannot be switched off",
        ),
        ("--disable_pass=", "graph_kernel_flags: --disable_pass: expects a comma-separated list"),
        (
            "disable_pass=gelu_fusion",
            "graph_kernel_flags: disable_pass=gelu_fusion: expected --flag",
        ),
        ("--disable_pass='gelu_fusion", "graph_kernel_flags: cannot split into flags"),
    ],
)
def test_bad_flags_are_one_line_errors(text: str, start: str) -> None:
    assert error_of(text).startswith(start)


def test_render_defaults_is_empty() -> None:
    assert render_flags(FusionConfig.defaults()) == ""


def test_render_uses_the_first_alias_in_registry_order() -> None:
    config = FusionConfig.defaults().with_switches(TbeEltwiseFusionPass=False, GeluFusionPass=False)
    assert render_flags(config) == "--disable_pass=gelu_fusion,basic_ops_fusion"


def test_render_enables_a_pass_that_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # No registered pass is off by default yet; pretend Softmax is, as flags.py sees the registry.
    patched = tuple(
        dataclasses.replace(p, default=False) if p.name == "SoftmaxFusionPass" else p
        for p in PASSES
    )
    monkeypatch.setattr(flags_module, "PASSES", patched)
    config = FusionConfig.defaults().with_switches(GeluFusionPass=False)
    text = render_flags(config)
    assert text == "--enable_pass=softmax_fusion --disable_pass=gelu_fusion"
    assert parse_flags(text) == config
    assert not parse_flags("").enabled("SoftmaxFusionPass")


@settings(max_examples=50, deadline=None)
@given(off=st.sets(st.sampled_from(SWITCHABLE)))
def test_parse_of_render_is_identity(off: set[str]) -> None:
    config = FusionConfig.resolve(explicit={name: name not in off for name in SWITCHABLE})
    assert parse_flags(render_flags(config)) == config
