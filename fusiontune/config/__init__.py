"""Configurations: FusionConfig and the file formats users know (fusion_switch.cfg, graph_kernel_flags)."""

from fusiontune.config.fusion_config import ConfigError, FusionConfig

__all__ = ["ConfigError", "FusionConfig"]
