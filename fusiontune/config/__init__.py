"""Configurations: FusionConfig and the file formats users know (fusion_switch.cfg, graph_kernel_flags)."""

from fusiontune.config.flags import FlagsResult, parse_flags, parse_graph_kernel_flags, render_flags
from fusiontune.config.fusion_config import ConfigError, FusionConfig
from fusiontune.config.fusion_result import FusionCounts, read_fusion_result, write_fusion_result
from fusiontune.config.switch_file import (
    dump_switch_json,
    dump_switch_lines,
    load_config,
    load_switch_file,
    loads_switch,
    write_switch_file,
)

__all__ = [
    "ConfigError",
    "FlagsResult",
    "FusionConfig",
    "FusionCounts",
    "dump_switch_json",
    "dump_switch_lines",
    "load_config",
    "load_switch_file",
    "loads_switch",
    "parse_flags",
    "parse_graph_kernel_flags",
    "read_fusion_result",
    "render_flags",
    "write_fusion_result",
    "write_switch_file",
]
